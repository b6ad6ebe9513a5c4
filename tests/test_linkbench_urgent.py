"""bench link's urgent test end to end on the CPU: every prefetch variant (plain, sliced, yielding) and the
flagged urgent call run through their real code paths (Triton's interpreter), on a miniature host KV, with
a stand-in for torch's CUDA streams and events (the timings are meaningless here: the GPU measures them).
The rows keep link.csv's schema."""

import itertools
import types

import pytest
import torch

from ddbench.kernels import linkbench, timing


class _Event:
    clock = itertools.count()

    def __init__(self, enable_timing=True):
        self.t = None

    def record(self):
        self.t = next(_Event.clock)

    def elapsed_time(self, other):
        return float(other.t - self.t) + 1.0


class _Stream:
    def __init__(self, s=None):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _CpuTorch(types.ModuleType):
    """torch, with "cuda" tensors on the CPU, no pinning, and in-order stand-ins for streams and events."""

    MADE = ("empty", "zeros", "rand", "randn", "full", "Generator", "empty_like")

    def __init__(self):
        super().__init__("torch")
        self.cuda = types.SimpleNamespace(Stream=lambda priority=0: _Stream(), stream=_Stream, Event=_Event,
                                          synchronize=lambda: None, is_available=lambda: False)

    def __getattr__(self, name):
        v = getattr(torch, name)
        if name not in self.MADE:
            return v

        def made(*a, **kw):
            if kw.get("device") == "cuda":
                kw["device"] = "cpu"
            kw.pop("pin_memory", None)
            return v(*a, **kw)
        return made


@pytest.mark.skipif(torch.cuda.is_available(), reason="the stand-in is for the CPU; the GPU runs the bench itself")
def test_urgent_bench_runs_every_variant_in_the_schema(monkeypatch):
    ft = _CpuTorch()
    monkeypatch.setattr(timing, "torch", ft)
    for name, value in (("MiB", 1 << 11), ("GiB", 1 << 20), ("HOST_BYTES", 4 << 20), ("URGENT_MIB", (1, 4)),
                        ("URGENT_LAUNCHES", ((64, 4),))):
        monkeypatch.setattr(linkbench, name, value)
    hosts = linkbench._hosts(ft, bf16=False)
    assert hosts[0] is None and (hosts[1].view(torch.uint8) != 0).float().mean() > 0.9
    rows = []
    src = ft.empty(600 << 10, dtype=torch.uint8).random_()
    linkbench.bench_copy(ft, rows, 0, 1, src, torch.empty_like(src))
    linkbench.bench_urgent(ft, hosts, rows, 0, 1, 50.0)
    assert all(set(r) <= set(linkbench.COLUMNS) for r in rows)
    names = [p.name for p in linkbench.PREFETCHES]
    assert names == ["prefetch-32x8", "prefetch-16x8", "sliced-4x-prefetch-32x8", "sliced-16x-prefetch-32x8",
                     "yielding-prefetch-32x8"]
    assert [r["variant"] for r in rows if r["test"] == "prefetch"] == names
    urgent = [r for r in rows if r["test"] == "urgent"]
    want = ["alone", "alone-flagged"] + [f"beside-{n}" for n in names]
    assert [r["variant"] for r in urgent] == want * 2
    for r in urgent:
        assert r["latency_ratio"] > 0 and r["ms"] > 0
        if r["variant"].startswith("beside-"):
            assert 0 < r["link_busy"] and "prefetch 256 MiB fp8" in r["note"]
            assert ("polls that found the flag raised" in r["note"]) == ("yielding" in r["variant"])

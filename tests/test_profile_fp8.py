"""fp8 (e4m3) KV accuracy in the profiler: ddbench/profile/fp8error.py against a hand computation, zero
error where K/V are exactly representable, the Wilson interval against known values, the fp8 task method's
K/V, the trace names, and the CLI flags' bad input. No real model here (fast)."""

from __future__ import annotations

import math
import os

import pytest

from tests.cli import assert_one_line_error, ddbench

torch = pytest.importorskip("torch")

from ddbench.profile import fp8error  # noqa: E402
from ddbench.profile.quality import wilson  # noqa: E402

E4M3 = torch.float8_e4m3fn


def _fresh(seed, *shape):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * 2.0 + 0.1
    assert bool((x != 0).all())
    return x


def _hand_fp8(x, chunk):
    """e4m3 through one scale per (head, chunk), by loops: scale = max|x| / 448."""
    y = torch.empty_like(x)
    H, T, _ = x.shape
    for h in range(H):
        for c0 in range(0, T, chunk):
            block = x[h, c0:c0 + chunk]
            scale = float(block.abs().max()) / 448.0
            y[h, c0:c0 + chunk] = (block / scale).to(E4M3).float() * scale
    return y


def _hand_attention(q, k, v, scaling, allowed_tokens):
    """q [n, Hq, d], k/v [H, T, d]; allowed_tokens(i, kv_head) -> token list; float64 loops."""
    n, Hq, d = q.shape
    H = k.shape[0]
    out = torch.zeros(n, Hq, d, dtype=torch.float64)
    for i in range(n):
        for h in range(Hq):
            kh = h // (Hq // H)
            toks = allowed_tokens(i, kh)
            s = [float(q[i, h].double() @ k[kh, t].double()) * scaling for t in toks]
            m = max(s)
            w = [math.exp(x - m) for x in s]
            z = sum(w)
            for t, wt in zip(toks, w):
                out[i, h] += wt / z * v[kh, t].double()
    return out


def _rel(a, b):
    return ((a - b).norm(dim=-1) / b.norm(dim=-1)).flatten()


@pytest.mark.parametrize("topk", [False, True])
def test_layer_errors_match_a_hand_computation(topk):
    n, Hq, H, T, d, chunk, S = 3, 4, 2, 48, 8, 8, 32          # tokens [32, 48): the resident window
    q, k, v = _fresh(1, n, Hq, d), _fresh(2, H, T, d), _fresh(3, H, T, d)
    scaling = d ** -0.5
    sel = torch.tensor([[[0, 2], [1, 3]], [[1, 2], [0, 1]], [[3, 0], [2, 3]]], dtype=torch.int32) if topk else None
    got = fp8error.layer_errors(q, k, v, chunk=chunk, selectable=S, scaling=scaling, sel=sel)

    kb, vb = k.to(torch.bfloat16).float(), v.to(torch.bfloat16).float()
    k8 = torch.cat([_hand_fp8(kb[:, :S], chunk), kb[:, S:]], dim=1)
    v8 = torch.cat([_hand_fp8(vb[:, :S], chunk), vb[:, S:]], dim=1)

    def toks(i, h):
        if sel is None:
            return list(range(T))
        return sorted({int(c) * chunk + j for c in sel[i, h] for j in range(chunk)} | set(range(S, T)))
    o32 = _hand_attention(q, k, v, scaling, toks)
    o16 = _hand_attention(q, kb, vb, scaling, toks)
    o8 = _hand_attention(q, k8, v8, scaling, toks)
    want8, want16 = _rel(o8, o16), _rel(o16, o32)
    assert got["fp8_vs_bf16"].shape == (n * Hq,)
    torch.testing.assert_close(got["fp8_vs_bf16"].double(), want8, rtol=1e-3, atol=1e-6)
    torch.testing.assert_close(got["bf16_vs_fp32"].double(), want16, rtol=1e-2, atol=1e-7)
    # e4m3's 3 mantissa bits: percent-level, bf16's 8 bits: far below
    assert 1e-3 < float(want8.median()) < 0.2
    assert float(want16.median()) < float(want8.median()) / 4


def test_topk_equals_moving_only_the_selected_chunks():
    """Quantising the whole region and masking = ddbench.kernels.fp8.gather_dequant of the selected chunks."""
    from ddbench.kernels.fp8 import gather_dequant, quantize_chunks
    n, Hq, H, T, d, chunk, S = 2, 2, 2, 40, 8, 8, 32
    q, k, v = _fresh(4, n, Hq, d), _fresh(5, H, T, d), _fresh(6, H, T, d)
    sel = torch.tensor([[[1, 3], [0, 2]], [[0, 1], [2, 3]]])
    kv = fp8error.variants(k, v, chunk, S)
    o = fp8error.attend(q, *kv["fp8"], 0.3, fp8error.allowed(sel, chunk, T, S))
    for i in range(n):
        ks, vs = [], []
        for h in range(H):
            qk, sk = quantize_chunks(k[h:h + 1, :S].to(torch.bfloat16), chunk)
            qv, sv = quantize_chunks(v[h:h + 1, :S].to(torch.bfloat16), chunk)
            ks.append(torch.cat([gather_dequant(qk, sk, sel[i, h][None], chunk)[0],
                                 k[h, S:].to(torch.bfloat16).float()]))
            vs.append(torch.cat([gather_dequant(qv, sv, sel[i, h][None], chunk)[0],
                                 v[h, S:].to(torch.bfloat16).float()]))
        want = fp8error.attend(q[i:i + 1], torch.stack(ks), torch.stack(vs), 0.3)
        torch.testing.assert_close(o[i:i + 1], want, rtol=1e-5, atol=1e-6)


def test_error_is_zero_when_kv_are_exactly_representable():
    """Values on the e4m3 grid times 2^-8, every chunk-head holding +-448 * 2^-8: scale 2^-8 exactly, fp8
    and bf16 both exact, so both metrics are 0."""
    n, Hq, H, T, d, chunk, S = 2, 4, 2, 40, 8, 8, 32
    grid = torch.arange(256, dtype=torch.uint8).view(E4M3).float()
    grid = grid[torch.isfinite(grid) & (grid != 0)]
    g = torch.Generator().manual_seed(7)

    def exact():
        x = grid[torch.randint(len(grid), (H, T, d), generator=g)]
        x.view(H, T // chunk, chunk, d)[:, :, 0, 0] = 448.0
        return x * 2.0 ** -8
    k, v = exact(), exact()
    q = _fresh(8, n, Hq, d)
    for sel in (None, torch.tensor([[[0, 2], [1, 3]], [[1, 2], [0, 3]]])):
        e = fp8error.layer_errors(q, k, v, chunk=chunk, selectable=S, scaling=d ** -0.5, sel=sel)
        assert float(e["fp8_vs_bf16"].abs().max()) == 0.0
        assert float(e["bf16_vs_fp32"].abs().max()) == 0.0
    # and not zero on fresh random values
    e = fp8error.layer_errors(q, _fresh(9, H, T, d), _fresh(10, H, T, d), chunk=chunk, selectable=S, scaling=0.3)
    assert float(e["fp8_vs_bf16"].min()) > 0


def test_collector_rows_and_summary():
    c = fp8error.Collector()
    for layer in (0, 1):
        c.add(layer, 2048, "single", None, "dense",
              {"fp8_vs_bf16": torch.tensor([0.01, 0.02, 0.03]) * (layer + 1), "bf16_vs_fp32": torch.tensor([1e-3] * 3)})
        c.add(layer, 2048, "single", 256, "topk",
              {"fp8_vs_bf16": torch.tensor([0.04, 0.05]), "bf16_vs_fp32": torch.tensor([2e-3, 3e-3])})
    rows = c.rows(8)
    assert len(rows) == 8
    r = rows[0]
    assert (r["selection"], r["metric"], r["layer"], r["budget_tokens"]) == ("dense", "fp8_vs_bf16", 0, "")
    assert r["median"] == pytest.approx(0.02) and r["max"] == pytest.approx(0.03) and r["n"] == 3
    assert r["p95"] == pytest.approx(0.029)
    s = c.summary("m", {"git_sha": "x"}, 8)
    d = s["by_selection"][0]
    assert (d["selection"], d["budget_tokens"], d["metric"], d["n"]) == ("dense", None, "fp8_vs_bf16", 6)
    assert d["max"] == pytest.approx(0.06) and d["worst_layer"]["layer"] == 1
    assert [x["selection"] for x in s["by_selection"]] == ["dense", "dense", "topk", "topk"]


@pytest.mark.parametrize("k,n,low,high", [
    (0, 20, 0.0, 0.161125), (10, 20, 0.299298, 0.700702), (20, 20, 0.838875, 1.0),
    (1, 20, 0.008881, 0.236131), (15, 20, 0.531299, 0.888138), (3, 3, 0.438503, 1.0),
])
def test_wilson_known_values(k, n, low, high):
    lo, hi = wilson(k, n)
    assert lo == pytest.approx(low, abs=2e-6) and hi == pytest.approx(high, abs=2e-6)


def test_wilson_against_scipy_where_installed():
    stats = pytest.importorskip("scipy.stats")
    for n in (1, 7, 20, 33):
        for k in range(n + 1):
            ci = stats.binomtest(k, n).proportion_ci(method="wilson")
            assert wilson(k, n) == pytest.approx((ci.low, ci.high), abs=1e-9)


def test_fp8_task_kv_is_the_dequantised_region():
    from ddbench.profile.layersweep import _fp8_kv

    class Layer:
        def __init__(self, seed):
            self.keys, self.values = _fresh(seed, 1, 2, 40, 8), _fresh(seed + 1, 1, 2, 40, 8)

    class Cache:
        layers = [Layer(11), Layer(13)]
    ks, vs = _fp8_kv(Cache, 32, 8)
    for layer, k8, v8 in zip(Cache.layers, ks, vs):
        assert k8.shape == (1, 2, 32, 8)
        want = _hand_fp8(layer.keys[0, :, :32].to(torch.bfloat16).float(), 8)
        torch.testing.assert_close(k8[0], want, rtol=0, atol=0)
        assert float((v8 - layer.values[:, :, :32]).abs().max()) > 0


def test_trace_names():
    from ddbench.profile import trace
    assert set(trace.names("m")) == {"csv", "steps", "summary"}
    n = trace.names("m", fp8=True, tasks=True)
    assert (n["fp8_csv"], n["fp8_summary"], n["tasks_csv"]) == ("m.fp8.csv", "m.fp8.summary.json", "m.tasks.csv")


PROFILE = ("profile", "--layer-accuracy", "--model", "no-such-model.gguf")


@pytest.mark.parametrize("args", [("--prompts", "0"), ("--prompts", "x"), ("--prompts", "-3"), ("--prompts", ""),
                                  ("--fp8-error", "yes")])
def test_flags_bad_input(tmp_path, args):
    assert_one_line_error(ddbench(*PROFILE, *args, cwd=tmp_path))
    assert os.listdir(tmp_path) == []


def test_validate_refuses_no_prompts():
    from ddbench.core.errors import DDBenchError
    from ddbench.profile.layersweep import ProfileConfig, validate
    with pytest.raises(DDBenchError, match="--prompts must be at least 1"):
        validate(ProfileConfig(model="x", contexts=(512,), budgets=(64,), prompts=0), 2048)

"""The smaller selection indexes (issue 47) in the decode-step engine on the CPU twin (torch reference path,
tiny model), for every design that selects by landmarks: each layer's true selection is the index twin's
top-k of that layer's queries against its index, and attention runs over exactly that selection."""

import pytest
import torch

from ddbench.core.designs import DESIGNS
from ddbench.kernels.engine.engine import Engine, EngineConfig
from ddbench.kernels.engine.model import Weights
from ddbench.kernels.indexkernels import Index, index_select_ref
from ddbench.kernels.layout import alloc_host_kv
from tests.test_engine_pipeline import TINY, reference_output

LANDMARK = [n for n in ("shadowkv", "dualdecoder", "dualdecoder-cache", "lru-cache") if DESIGNS[n].landmarks]


def _engine(name, index):
    g = torch.Generator().manual_seed(3)
    host = alloc_host_kv(3, 2, 2, 32, 8, 32, dtype=torch.float32)
    host.copy_(torch.randn(host.shape, generator=g))
    w = Weights.random(TINY, "cpu", 3, dtype=torch.float32)
    cfg = EngineConfig.of(context=256, batch=2, budget=32, local_chunks=1, gen_tokens=8, rank=16, outliers_per_1k=32,
                          miss_rate=None, lowrank_layers=(1,), seed=3, index=index, cache_tokens=64)
    return Engine(TINY, DESIGNS[name], cfg, w, "cpu", host_kv=host, ref=True, debug=True), host


CASES = [(n, i) for n in LANDMARK for i in ("fp8", "two-level:2,1,int4")]
FAST = {("shadowkv", "fp8"), ("dualdecoder", "two-level:2,1,int4"), ("dualdecoder-cache", "two-level:2,1,int4"),
        ("lru-cache", "fp8")}       # every design and both kinds in `make test`; the rest in make test-slow


@pytest.mark.parametrize("name, index", [c if c in FAST else pytest.param(*c, marks=pytest.mark.slow) for c in CASES])
def test_engine_selects_by_its_index(name, index):
    e, host = _engine(name, index)
    assert all(isinstance(ix, Index) and ix.spec.name == index for ix in e.lm)
    for _ in range(3):
        e.step()
    checked = 0
    for rec in e.debug:
        want = index_select_ref(rec["q"], e.lm[rec["layer"]], e.kc)[:, 0]
        assert torch.equal(rec["true"].sort(-1).values, want), (name, index, rec["layer"])
        torch.testing.assert_close(rec["out"], reference_output(e, rec, host), rtol=1e-4, atol=1e-5)
        checked += 1
    assert checked == 3 * TINY.num_layers


def test_flat_engine_keeps_todays_landmarks():
    e, _ = _engine("dualdecoder", "flat")
    assert isinstance(e.lm, torch.Tensor) and e.lm.shape == (3, 2, 2, 32, 32)

"""The engine with an fp8 host KV (kv_bits 8): the gathers dequantise e4m3 into the buffers, so a step
over fp8 pieces computes exactly what the same engine computes over a 16-bit host holding their
dequantised values, and its link bytes are the fp8 pieces with their scales."""

import pytest
import torch

from ddbench.core.designs import DESIGNS as SYSTEMS
from ddbench.core.errors import DDBenchError
from ddbench.kernels.engine.engine import Engine, EngineConfig
from ddbench.kernels.engine.model import Weights
from ddbench.kernels.fp8 import dequantized_layer, quantize_host_kv
from ddbench.kernels.layout import alloc_host_kv
from tests.test_engine_pipeline import TINY

HOST_DESIGNS = ["dualdecoder", "dualdecoder-cache", "shadowkv"]


def _engines(name, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = alloc_host_kv(3, 2, 2, 32, 8, 32, dtype=torch.float32)
    x.copy_(torch.randn(x.shape, generator=g) * 2)
    q, s = quantize_host_kv(x)
    deq = torch.stack([dequantized_layer(q, i, s, torch.float32) for i in range(3)])
    out = []
    for bits, host, scales in ((8, q, s), (16, deq, None)):
        w = Weights.random(TINY, "cpu", seed, dtype=torch.float32)
        cfg = EngineConfig.of(context=256, batch=2, budget=64, local_chunks=1, gen_tokens=8, rank=16,
                              outliers_per_1k=32, miss_rate=0.33, lowrank_layers=(1,), seed=seed, kv_bits=bits,
                              **({"cache_tokens": 128} if SYSTEMS[name].chunk_cache else {}))
        out.append(Engine(TINY, SYSTEMS[name], cfg, w, "cpu", host_kv=host, host_scales=scales, ref=True, debug=True))
    return out


@pytest.mark.parametrize("name", HOST_DESIGNS)
def test_fp8_step_equals_dequantised_bf16_step(name):
    e8, e16 = _engines(name)
    for _ in range(3):
        t8, t16 = e8.step(), e16.step()
        assert torch.equal(t8, t16)
        pf8, ur8 = e8.step_bytes()
        pf16, ur16 = e16.step_bytes()
        # the same chunks moved; a piece is C*d + 4 bytes in fp8 against C*d*4 in this fp32 twin
        assert pf8 * (8 * 32 * 4) == pf16 * (8 * 32 + 4) and ur8 * (8 * 32 * 4) == ur16 * (8 * 32 + 4)
    for a, b in zip(e8.debug, e16.debug):
        assert torch.equal(a["true"], b["true"]) and torch.equal(a["out"], b["out"])


def test_fp8_engine_rejects_a_mismatched_host():
    e8, e16 = _engines("dualdecoder")
    w = Weights.random(TINY, "cpu", 0, dtype=torch.float32)
    with pytest.raises(DDBenchError, match="needs a float8_e4m3fn host KV"):
        Engine(TINY, SYSTEMS["dualdecoder"], e8.cfg, w, "cpu", host_kv=e16.host, ref=True)
    with pytest.raises(DDBenchError, match="needs a 16-bit host KV"):
        Engine(TINY, SYSTEMS["dualdecoder"], e16.cfg, w, "cpu", host_kv=e8.host, ref=True)
    with pytest.raises(DDBenchError, match="needs its scales"):
        Engine(TINY, SYSTEMS["dualdecoder"], e8.cfg, w, "cpu", host_kv=e8.host, ref=True)


def test_paper_labels_with_fp8():
    from ddbench.kernels.engine.points import Label, design_labels
    labels = design_labels(("dualdecoder-cache", "shadowkv", "specache", "full-kv"), (4096, 8192), (16, 8))
    assert labels == ["dualdecoder-cache@4096", "dualdecoder-cache@8192", "shadowkv", "specache", "full-kv",
                      "dualdecoder-cache@4096+fp8", "dualdecoder-cache@8192+fp8", "shadowkv+fp8"]
    assert Label.parse("dualdecoder-cache@8192+fp8") == Label("dualdecoder-cache", 8192, 8)
    assert Label.parse("shadowkv") == ("shadowkv", None, 16, 16) and str(Label("shadowkv", None, 8)) == "shadowkv+fp8"
    assert all(str(Label.parse(x)) == x for x in labels)      # one format, written and read back
    both = design_labels(("dualdecoder-cache", "dualdecoder"), (8192,), (8,), (16, 8))
    assert both == ["dualdecoder-cache@8192+fp8", "dualdecoder-cache@8192+fp8cache", "dualdecoder+fp8"]
    assert Label.parse("dualdecoder-cache@8192+fp8cache") == Label("dualdecoder-cache", 8192, 8, 8)
    assert all(str(Label.parse(x)) == x for x in both)


@pytest.mark.parametrize("argv", [["--phases", "paper", "--kv-bits", "12"], ["--phases", "paper", "--kv-bits", "x"],
                                  ["--point", "specache+fp8:32768:2"], ["--point", "dualdecoder+fp8cache:32768:2"],
                                  ["--phases", "paper", "--cache-bits", "8"], ["--phases", "paper", "--cache-bits", "4"]])
def test_sweep_bad_kv_bits_exits_2(argv, capsys):
    from ddbench.kernels.engine.sweep import main
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and ("kv-bits" in err or "fp8" in err or "cache-bits" in err)


@pytest.mark.gpu
@pytest.mark.parametrize("name", HOST_DESIGNS)
def test_fp8_engine_equals_dequantised_bf16_gpu(name):
    """The Triton path on the GPU: the fp8 step equals, bit for bit, the bf16 step over the dequantised
    host (the gathers round each dequantised value to bf16 as the torch cast does)."""
    from ddbench.kernels.engine.selfcheck import SMALL
    L, B, H, d, ctx = SMALL.num_layers, 3, SMALL.num_kv_heads, SMALL.head_dim, 8192
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(L, B, H, ctx // 8, 2, 8, d, device="cuda", generator=g)
    q, s = quantize_host_kv(x)
    deq = torch.stack([dequantized_layer(q, i, s, torch.bfloat16) for i in range(L)])
    hosts = ((8, q.cpu().pin_memory(), s.cpu().pin_memory()), (16, deq.cpu().pin_memory(), None))
    toks, outs = [], []
    for bits, host, scales in hosts:
        cfg = EngineConfig.of(context=ctx, batch=B, budget=512, local_chunks=4, gen_tokens=16, rank=32,
                              outliers_per_1k=16, miss_rate=0.33, lowrank_layers=(1,), seed=0, prefetch_programs=8,
                              urgent_programs=16, kv_bits=bits,
                              **({"cache_tokens": 1024} if SYSTEMS[name].chunk_cache else {}))
        e = Engine(SMALL, SYSTEMS[name], cfg, Weights.random(SMALL, "cuda", 0), "cuda", host_kv=host,
                   host_scales=scales, debug=True)
        toks.append([e.step().clone() for _ in range(3)])
        torch.cuda.synchronize()
        outs.append([r["out"] for r in e.debug])
    assert all(torch.equal(a, b) for a, b in zip(*toks))
    assert all(torch.equal(a, b) for a, b in zip(*outs)) and not outs[0][-1].isnan().any()

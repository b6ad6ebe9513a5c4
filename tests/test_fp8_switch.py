"""The fp8 KV switch (Workload.kv_bits 8): the memory model's host and GPU bytes, the simulator's link
bytes and the measured piece rates it needs, the planner's fp8 knob, and its bad input."""

import pytest

from ddbench.core.catalog import get_gpu, get_model
from ddbench.core.designs import DESIGNS
from ddbench.core.errors import DDBenchError
from ddbench.core.memory import Workload, host_kv_bytes, kv_piece_bytes, max_batch, memory_breakdown
from ddbench.planner.knobs import knob_label, parse_search, settings
from ddbench.planner.scenario import Scenario
from ddbench.sim.factory import cost_model
from ddbench.sim.steplayers import step_layers
from tests.cli import ddbench

M, H200 = get_model("llama-3-8b"), get_gpu("h200")


def _w(bits, **kw):
    return Workload(context=131072, kv_bits=bits, **kw)


def test_host_and_gpu_bytes():
    assert kv_piece_bytes(M, _w(16)) == 8 * 128 * 2 and kv_piece_bytes(M, _w(8)) == 8 * 128 + 4
    for name, tensors in (("dualdecoder", 2), ("dualdecoder-cache", 2), ("shadowkv", 1)):
        d = DESIGNS[name]
        bf16, fp8 = host_kv_bytes(d, M, _w(16)), host_kv_bytes(d, M, _w(8))
        assert bf16 == 131072 * 32 * tensors * 8 * 128 * 2
        assert fp8 == 131072 // 8 * 32 * tensors * 8 * (8 * 128 + 4)        # chunks x layers x tensors x heads x piece
        # the gathers dequantise into bf16 buffers (and a bf16 cache): GPU bytes do not change
        a, b = (memory_breakdown(d, M, H200, _w(x, batch=4)).sparse_kv_buffers for x in (16, 8))
        assert b == a and max_batch(d, M, H200, _w(8)) == max_batch(d, M, H200, _w(16))


def test_bad_fp8_input():
    with pytest.raises(DDBenchError, match="a100-80gb has none"):
        memory_breakdown(DESIGNS["dualdecoder"], M, get_gpu("a100-80gb"), _w(8, batch=1))
    for name in ("specache", "full-kv"):
        with pytest.raises(DDBenchError, match="applies to designs that keep their KV on the host"):
            memory_breakdown(DESIGNS[name], M, H200, _w(8, batch=1))
    with pytest.raises(DDBenchError, match="kv_bits must be 16"):
        _w(12).validate(M)
    r = ddbench("simulate", "--model", "llama-3-8b", "--gpu", "a100-80gb", "--design", "dualdecoder", "--context",
                "128k", "--batch", "2", "--kv-bits", "8")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "fp8 support" in r.stderr


def test_link_bytes_halve_and_pieces_need_a_measured_rate():
    cm = cost_model("llama-3-8b", "h200")
    hit = [0.88] * 32
    a, b = (step_layers(DESIGNS["dualdecoder"], M, cm, _w(x, batch=8), 8, 131072, hit, hit) for x in (16, 8))
    assert b.h2d_bytes / a.h2d_bytes == pytest.approx((8 * 128 + 4) / (8 * 128 * 2))
    assert b.rates.chunk_bytes == 2 * (8 * 128 + 4)
    assert any(n.startswith("fp8 KV:") for n in cm.notes)
    with pytest.raises(DDBenchError, match="no measured uva_gather rate for 1028 B pieces"):
        step_layers(DESIGNS["shadowkv"], M, cm, _w(8, batch=8), 8, 131072, hit, hit)


def test_planner_fp8_knob():
    knobs = parse_search("fp8=off:on,cache=4x")
    small = dict(model="llama-3-8b", gpu="h200", context="32k")
    cc = settings(Scenario(design="dualdecoder-cache", **small), knobs, 32768, 32)
    assert sorted(s.knob("kv_bits") for s in cc) == [8, 16]
    assert sorted(knob_label(s, knobs) for s in cc) == ["fp8=off cache=4x", "fp8=on cache=4x"]
    knobs = parse_search("fp8,cache=4x")      # by default on+cache too (tests/test_fp8_cache.py)
    assert {s.knob("kv_bits") for s in settings(Scenario(design="shadowkv", **small), knobs, 32768, 32)} == {16}
    both = settings(Scenario(design="dualdecoder", **small), parse_search("fp8,lowrank-layers=0:4"), 32768, 32)
    assert sorted((s.knob("kv_bits"), s.knob("lowrank_layers")) for s in both) == [(8, 0), (16, 0), (16, 4)]
    with pytest.raises(DDBenchError, match="fp8 takes off, on and on\\+cache"):
        parse_search("fp8=yes")

"""The fp8 chunk cache (Workload.cache_bits 8): the memory model's slot bytes and max batch, its one-line
errors, the planner's fp8 knob and the sweep's axis, and the simulator pricing its attention as bf16's."""

import pytest

from ddbench.core.catalog import get_gpu, get_model
from ddbench.core.designs import DESIGNS
from ddbench.core.errors import DDBenchError
from ddbench.core.memory import Workload, chunk_cache_bytes, max_batch, memory_breakdown
from ddbench.planner.knobs import knob_label, parse_search, settings
from ddbench.planner.scenario import Scenario
from tests.cli import assert_one_line_error, ddbench

M = get_model("llama-3-8b")
DC, LRU, DD = DESIGNS["dualdecoder-cache"], DESIGNS["lru-cache"], DESIGNS["dualdecoder"]


def _w(kv=8, cache=8, **kw):
    return Workload(**{"context": 131072, "cache_tokens": 8192, "kv_bits": kv, "cache_bits": cache, **kw})


def test_chunk_cache_bytes_by_hand():
    # Llama-3-8B, 128K, an 8K cache of chunk 8, batch 1: 1024 slots per layer and KV head, each K and V of
    # 8 x 128 fp8 bytes and two fp32 scales; the int16 map of 16384 chunks; an int32 id and stamp per slot;
    # the map and the slots each with a sink entry (the engine's layout)
    slots, chunks = 8192 // 8, 131072 // 8
    per_head = slots * (2 * 8 * 128 * 1 + 2 * 4) + (chunks + 1) * 2 + (slots + 1) * (4 + 4)
    assert per_head == 2_105_344 + 32_770 + 8_200 == 2_146_314
    assert chunk_cache_bytes(DC, M, _w(batch=1)) == 32 * 8 * per_head == 549_456_384
    bf16 = chunk_cache_bytes(DC, M, _w(cache=16, batch=1))
    assert bf16 == 32 * 8 * (slots * 2 * 8 * 128 * 2 + (chunks + 1) * 2 + (slots + 1) * 8)
    assert chunk_cache_bytes(LRU, M, _w(batch=1)) == chunk_cache_bytes(DC, M, _w(batch=1))
    assert chunk_cache_bytes(DD, M, _w(kv=8, cache=16, batch=1)) == 0


@pytest.mark.parametrize("gpu", ["h100-80gb", "h200"])
def test_fp8_cache_grows_the_max_batch(gpu):
    g = get_gpu(gpu)
    b16, b8 = max_batch(DC, M, g, _w(cache=16)), max_batch(DC, M, g, _w(cache=8))
    assert b8 > b16 == max_batch(DC, M, g, _w(kv=16, cache=16))     # fp8 host KV alone leaves the GPU bytes
    bd16, bd8 = (memory_breakdown(DC, M, g, _w(cache=c, batch=4)) for c in (16, 8))
    assert bd8.sparse_kv_buffers < bd16.sparse_kv_buffers and bd8.resident_kv == bd16.resident_kv   # the tail: bf16


def test_one_line_errors():
    h100 = get_gpu("h100-80gb")
    with pytest.raises(DDBenchError, match="cache_bits 8 .* needs kv_bits 8"):
        memory_breakdown(DC, M, h100, _w(kv=16, cache=8, batch=1))
    with pytest.raises(DDBenchError, match="dualdecoder: an fp8 chunk cache .* applies to the chunk-cache designs"):
        memory_breakdown(DD, M, h100, _w(batch=1))
    with pytest.raises(DDBenchError, match="cache_bits must be 16"):
        _w(cache=12).validate(M)


def test_plan_cli():
    base = ("plan", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--context", "128k", "--cache-tokens", "8192")
    r = ddbench(*base, "--design", "dualdecoder-cache", "--cache-bits", "8")
    assert_one_line_error(r, contains="needs kv_bits 8")
    assert "Traceback" not in r.stderr
    r = ddbench(*base, "--design", "dualdecoder", "--kv-bits", "8", "--cache-bits", "8")
    assert_one_line_error(r, contains="applies to the chunk-cache designs")
    r = ddbench(*base, "--design", "dualdecoder-cache", "--kv-bits", "8", "--cache-bits", "8", "--csv")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1].startswith("dualdecoder-cache,40,")


def test_planner_fp8_knob_tries_the_fp8_cache():
    knobs = parse_search("fp8")
    small = dict(model="llama-3-8b", gpu="h200", context="32k")
    cc = settings(Scenario(design="dualdecoder-cache", **small), knobs, 32768, 32)
    assert sorted((s.knob("kv_bits"), s.knob("cache_bits")) for s in cc) == [(8, 8), (8, 16), (16, 16)]
    assert sorted(knob_label(s, knobs) for s in cc) == ["fp8=off", "fp8=on", "fp8=on+cache"]
    dd = settings(Scenario(design="dualdecoder", **small), knobs, 32768, 32)
    assert sorted((s.knob("kv_bits"), s.knob("cache_bits")) for s in dd) == [(8, 16), (16, 16)]
    with pytest.raises(DDBenchError, match="fp8=on\\+cache alone on a design without a chunk cache"):
        settings(Scenario(design="dualdecoder", **small), parse_search("fp8=on+cache"), 32768, 32)


def test_sweep_axis():
    from ddbench.planner.spec import point_key, points, scenario_of
    g = dict(model=["llama-3-8b"], gpu=["h200"], link=[None], host=[None], fetching=[None], host_mem_gb=[None],
             system=["dualdecoder-cache"], context=["128k"], output=["64"], budget=[2048], chunk=[8],
             lowrank_layers=[0], buffers=["design"], cache_tokens=[None], kv_bits=[8], cache_bits=[None, 8],
             hit_rate=[None], prefill=["here"], rate=[1.0], seed=[0], index=[None])
    ps = points(dict(requests=10, max_batch=None, grid=g))
    assert [scenario_of(p).knob("cache_bits") for p in ps] == [16, 8]
    plain = ps[0]
    assert point_key(plain) == point_key({k: v for k, v in plain.items() if k != "cache_bits"})


def test_simulator_prices_fp8_cache_attention_as_bf16():
    from ddbench.core.rates import forced
    from ddbench.sim.factory import cost_model
    from ddbench.sim.steplayers import step_layers
    cm = cost_model("llama-3-8b", "h200")
    cache = forced(0.1, 0.02, 32, "test")
    a, b = (step_layers(DC, M, cm, _w(cache=c, batch=8), 8, 131072, [0.88] * 32, [0.88] * 32, cache=cache)
            for c in (16, 8))
    assert b.att == a.att and b.compute_s == pytest.approx(a.compute_s) and b.h2d_bytes == a.h2d_bytes
    assert b.slot_bytes == 8 * 1024 * 8 * (2 * 8 * 128 + 8) < a.slot_bytes == 8 * 8192 * 2 * 8 * 128 * 2
    assert any(n.startswith("fp8 chunk cache (cache_bits 8)") and "h200-attention-fp8" in n for n in cm.notes)

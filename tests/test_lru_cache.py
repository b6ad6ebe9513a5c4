"""lru-cache (issue 31 part 2, the HiSparse mechanism) on the CPU side: its rates without prediction,
its step in the simulator (one cache fill, nothing prefetched), its memory, its knob, `all`/`every`."""

import json

import pytest

from ddbench.core.rates import forced, load_trend, prediction_of, prices, rate_set, replay_rates
from ddbench.core.catalog import get_gpu, get_model
from ddbench.core.designs import DESIGNS, design_names
from ddbench.core.errors import DDBenchError
from ddbench.core.memory import Workload, chunk_cache_bytes, memory_breakdown
from ddbench.sim.factory import cost_model
from ddbench.sim.steplayers import cache_fills, step_layers
from tests.cli import assert_one_line_error, ddbench

LRU, DC = DESIGNS["lru-cache"], DESIGNS["dualdecoder-cache"]
M8 = get_model("llama-3-8b")
SMOL = "SmolLM2-135M-Instruct.Q4_1"


def test_the_design_is_the_cache_without_prediction():
    assert LRU.chunk_cache and LRU.prefetch == "none" and LRU.tokens_per_step == 1 and LRU.landmarks
    assert prediction_of(LRU) == "none" and prediction_of(DC) == "speculative"
    assert "lru-cache" not in design_names("all") and "lru-cache" in design_names("every")


@pytest.mark.parametrize("context", [4096, 131072])
def test_committed_trend_prices_lru_cache_with_nothing_prefetched(context):
    rs = rate_set("llama-3-8b", 32, context, 2048, 8192, tuple(DESIGNS))
    none, spec = rs.of("lru-cache"), rs.of("dualdecoder-cache")
    assert none.get("churn") is None and none.source == spec.source == SMOL     # one matched set
    u_none, u_spec, churn = (none.get("urgent").mean(), spec.get("urgent").mean(), spec.get("churn").mean())
    # without the prefetch, the true chunks the cache lacks are all urgent: more than with it, about its moved
    assert u_none > u_spec > 0
    assert u_none == pytest.approx(u_spec + churn, rel=0.35)


def test_a_profile_without_the_replay_without_prediction(tmp_path):
    old = tmp_path / "m.cache.csv"          # a profile from before the column: all speculative
    old.write_text("layer,context_tokens,task,budget_tokens,chunk_tokens,policy,capacity,coverage,"
                   "prefetched_per_budget,urgent_per_budget,moved_per_budget,urgent_share,n,model\n"
                   + "".join(f"{l},4096,single,64,8,lru,{c},0.9,0.2,0.1,0.3,0.333,10,m\n" for l in range(2)
                             for c in (1, 2)))
    assert replay_rates(str(old), "dualdecoder-cache", "cache", 2, 4096, 64, 128).get("churn").centre == (0.2, 0.2)
    assert replay_rates(str(old), "lru-cache", "cache-none", 2, 4096, 64, 128) is None   # not priced by it
    import os
    doc = json.loads(open(os.path.join("traces", "accuracy", f"{SMOL}.cache-trend.json")).read())
    for f in doc["fits"]:
        f.pop("prediction", None)
    assert prices(doc, "cache") and not prices(doc, "cache-none") and not prices(doc, "reuse")
    doc["fits"][0]["prediction"] = "sometimes"
    (tmp_path / "t.json").write_text(json.dumps(doc))
    with pytest.raises(DDBenchError, match="malformed cache trend"):
        load_trend(str(tmp_path / "t.json"))


def test_step_is_single_token_one_fill_and_urgent_only():
    cm = cost_model("llama-3-8b", "h200")
    w = Workload(context=65536)
    hit = [0.88] * 32
    lru = step_layers(LRU, M8, cm, w, 8, 65536, hit, hit, cache=forced(0.0, 0.2, 32, "t"))
    dc = step_layers(DC, M8, cm, w, 8, 65536, hit, hit, cache=forced(0.0, 0.2, 32, "t"))
    assert lru.q_tokens == 1 and dc.q_tokens == 2
    assert cache_fills(LRU) == 1 and cache_fills(DC) == 2
    assert sum(lru.pf_bytes) == 0 and lru.ur_bytes == dc.ur_bytes
    fill = cm.cache_fill_s(8, w.cache_tokens // w.chunk)
    if fill:
        assert lru.pre[0] < dc.pre[0]
    with pytest.raises(DDBenchError, match="prefetches nothing"):
        step_layers(LRU, M8, cm, w, 8, 65536, hit, hit, cache=forced(0.1, 0.2, 32, "t"))
    with pytest.raises(DDBenchError, match="needs its cache rates"):
        step_layers(LRU, M8, cm, w, 8, 65536, hit, hit)


def test_memory_is_the_cache_of_dualdecoder_cache():
    w = Workload(context=65536, batch=4)
    g = get_gpu("h200")
    assert chunk_cache_bytes(LRU, M8, w) == chunk_cache_bytes(DC, M8, w) > 0
    a, b = memory_breakdown(LRU, M8, g, w), memory_breakdown(DC, M8, g, w)
    assert a.landmarks == b.landmarks
    # the same buffers but one fill plan fewer (no prefetch: (3 * (b H_kv k + 1) + 1) * 4 + b H_kv k * 4 bytes),
    # its held selection standing for dualdecoder-cache's prediction
    assert b.sparse_kv_buffers - a.sparse_kv_buffers == (3 * (4 * 8 * 256 + 1) + 1) * 4 + 4 * 8 * 256 * 4
    assert a.activations < b.activations             # one token per step, not two
    with pytest.raises(DDBenchError, match="at least the budget"):
        memory_breakdown(LRU, M8, g, Workload(context=65536, cache_tokens=1024))


def test_cache_knob_applies():
    from ddbench.planner.knobs import applies
    assert applies("cache", "lru-cache") and applies("cache", "dualdecoder-cache")
    assert not applies("buffers", "lru-cache") and not applies("cache", "dualdecoder")
    assert applies("buffers", "dualdecoder")


def test_cli_plan_simulate_and_sweep(tmp_path):
    r = ddbench("plan", "--design", "lru-cache", "--model", "llama-3-8b", "--gpu", "h200", "--context", "64k",
                "--search", "cache=1x:2x", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "lru-cache  cache=2x" in r.stdout and "  lru-cache: urgent " in r.stdout   # its rates line
    r = ddbench("simulate", "--design", "lru-cache", "--model", "llama-3-8b", "--gpu", "h200", "--context", "32k",
                "--batch", "4", "--steps", "3", "--out", str(tmp_path / "s"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "lru-cache: batch 4" in r.stdout
    r = ddbench("simulate", "--design", "lru-cache", "--model", "llama-3-8b", "--gpu", "h200", "--context", "32k",
                "--batch", "4", "--cache-tokens", "1000", "--out", str(tmp_path / "bad"), cwd=tmp_path)
    assert_one_line_error(r, contains="cache capacity")
    spec = tmp_path / "s.yaml"
    spec.write_text("name: lru\nrequests: 20\ngrid:\n  model: llama-3-8b\n  gpu: h200\n  system: [every]\n"
                    "  context: 32k\n  output: 32\n  rate: 0.2\n")
    from ddbench.planner.spec import load_spec
    assert "lru-cache" in load_spec(str(spec))["grid"]["system"]
    spec.write_text(spec.read_text().replace("[every]", "[all, lru-cache]"))
    assert load_spec(str(spec))["grid"]["system"][-1] == "lru-cache"
    r = ddbench("sweep", str(spec), "--out", str(tmp_path / "sw"), "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "lru-cache" in (tmp_path / "sw" / "results.csv").read_text()

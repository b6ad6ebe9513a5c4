"""A new design is one registry entry (issue 45): a toy design registered at run time is found by the memory
model, `ddbench plan`, `ddbench simulate`, the rates and the engine, with numbers its switches explain.

The toy is a new combination of existing switches: dualdecoder-cache's landmarks, dual-token step, GPU chunk
cache and layer-ahead prefetch, but with its urgent misses queued behind the prefetches (no urgent priority),
as dualdecoder-fifo does for DualDecoder. So its GPU and host bytes, its rates and its link bytes per step are
dualdecoder-cache's, above lru-cache's (no speculative token); its step is no faster and stalls no less.

Adding a design (the README's Layout section says the same):
  1. a DesignSpec in ddbench/core/designs.py (its switches, label, colour, role, ablation_of) and a name
     constant; for a run-time experiment, `designs.register(spec)` instead;
  2. nothing else where it combines existing switches: the memory model (ddbench/core/memory.py), the
     simulator (sim/steplayers.py, sim/timeline.py), the rates (ddbench/core/rates.py: `family`), the planner
     and the engine (kernels/engine/engine.py) read switches, never names;
  3. a new mechanism adds its switch to DesignSpec and SWITCH_VALUES, then teaches the layers it changes:
     its GPU and host bytes (ddbench/core/memory.py), its per-step work (sim/steplayers.py), its engine step
     (kernels/engine/engine.py, its kernels in a module of its own), and the rates it consumes where they are
     new (ddbench/core/rates.py). That is the registry and at most four more product files, plus the new
     module; a mechanism that also changes the planner's knobs or the simulator's scheduling touches those.
This test is the 1-file case: only the registry entry, through `register`."""

import io
import json
from contextlib import redirect_stdout

import pytest
import torch

from ddbench.cli import main
from ddbench.core import designs as D
from ddbench.core.catalog import get_gpu, get_model
from ddbench.core.designs import DESIGNS, DUALDECODER_CACHE, LRU_CACHE, DesignSpec, register, unregister
from ddbench.core.errors import DDBenchError
from ddbench.core.memory import Workload, host_kv_bytes, max_batch, memory_breakdown
from ddbench.core.rates import family

TOY = DesignSpec("toy-cache-fifo", "toy: dualdecoder-cache with its urgent misses behind the prefetches",
                 landmarks=True, tokens_per_step=2, prefetch="layer-ahead", kernels="triton", chunk_cache=True,
                 ablation_of=DUALDECODER_CACHE)
BASE = ["--model", "llama-3-8b", "--gpu", "h200", "--context", "128k"]
CATEGORIES = ("weights", "resident_kv", "landmarks", "aux_residency", "sparse_kv_buffers", "activations",
              "runtime_overhead")


@pytest.fixture
def toy(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = dict(DESIGNS)
    spec = register(TOY)
    yield spec
    unregister(TOY.name)
    assert DESIGNS == before


def _run(argv):
    out = io.StringIO()
    with redirect_stdout(out):
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as exc:
            rc = exc.code
    return rc, out.getvalue()


def test_register_checks_the_design_and_unregister_restores_the_registry():
    with pytest.raises(DDBenchError, match="already registered"):
        register(DESIGNS[DUALDECODER_CACHE])
    for bad, word in ((dict(prefetch="two-ahead"), "prefetch"), (dict(lowrank_keys="some"), "lowrank_keys"),
                      (dict(role="ours-too"), "role"), (dict(ablation_of="nodesign"), "ablation_of"),
                      (dict(name="all"), "not 'all'"), (dict(name="a,b"), "one lower-case word"),
                      (dict(kv_on_gpu=True), "fetch='none'")):
        with pytest.raises(DDBenchError, match=word):
            register(DesignSpec(**{**TOY.__dict__, **bad}))
    assert TOY.name not in DESIGNS
    with pytest.raises(DDBenchError, match="built in"):
        unregister(LRU_CACHE)
    with pytest.raises(DDBenchError, match="unknown design"):
        unregister(TOY.name)


def test_the_registry_groups_find_it(toy):
    assert D.design_names("every")[-1] == toy.name and toy.name not in D.all_designs()
    assert toy.name in D.ablations(DUALDECODER_CACHE) and toy.name in D.cache_designs()
    assert toy.name in D.landmark_designs() and toy.label == toy.name and toy.color is None
    assert D.compute_twin(toy.name) == DUALDECODER_CACHE          # urgent priority is a transfer switch
    assert family(toy) == family(DESIGNS[DUALDECODER_CACHE]) == "cache"


def test_the_memory_model_prices_it_as_its_switches_say(toy):
    m, g = get_model("llama-3-8b"), get_gpu("h200")
    w = Workload(context=131072, batch=32)
    mine, cache, lru = (memory_breakdown(DESIGNS[n], m, g, w) for n in (toy.name, DUALDECODER_CACHE, LRU_CACHE))
    assert [getattr(mine, c) for c in CATEGORIES] == [getattr(cache, c) for c in CATEGORIES]
    assert lru.total < mine.total == cache.total                     # the speculative token's buffers and work
    assert max_batch(DESIGNS[LRU_CACHE], m, g, w) >= max_batch(toy, m, g, w) == max_batch(
        DESIGNS[DUALDECODER_CACHE], m, g, w) > 1
    assert host_kv_bytes(toy, m, w) == host_kv_bytes(DESIGNS[DUALDECODER_CACHE], m, w) > 0


def test_plan_lists_it_with_the_memory_model_and_its_rates(toy):
    rc, out = _run(["plan", *BASE, "--design", "every", "--json"])
    assert rc == 0
    doc = json.loads(out)
    rows = {r["system"]: r for r in doc["systems"]}
    assert list(rows)[-1] == toy.name
    m, g = get_model("llama-3-8b"), get_gpu("h200")
    assert rows[toy.name]["max_batch"] == max_batch(toy, m, g, Workload(context=131072)) == \
        rows[DUALDECODER_CACHE]["max_batch"]
    assert rows[toy.name]["bytes"] == rows[DUALDECODER_CACHE]["bytes"]
    rc, out = _run(["plan", *BASE, "--design", f"{DUALDECODER_CACHE},{toy.name}"])
    rates = {ln.split(":", 1)[0].strip(): ln.split(":", 1)[1] for ln in out.splitlines()
             if ln.strip().startswith((toy.name + ":", DUALDECODER_CACHE + ":"))}
    assert rc == 0 and "urgent" in rates[toy.name] and "churn" in rates[toy.name]     # found by its switches
    assert rates[toy.name] == rates[DUALDECODER_CACHE]


def test_simulate_runs_it_and_its_fifo_is_no_faster(toy, tmp_path):
    rc, out = _run(["simulate", *BASE, "--design", f"{DUALDECODER_CACHE},{toy.name}", "--batch", "32",
                    "--steps", "8", "--json", "--out", tmp_path / "sim"])
    assert rc == 0
    doc = json.loads(out)
    mine, cache = doc[toy.name], doc[DUALDECODER_CACHE]
    assert mine["status"] == cache["status"] == "ok" and mine["system"] == toy.name
    assert mine["h2d_bytes_per_step"] == pytest.approx(cache["h2d_bytes_per_step"])   # the same chunks move
    assert mine["step_ms"] >= cache["step_ms"] and mine["stall_ms_per_step"] > cache["stall_ms_per_step"]
    assert mine["tokens_per_s"] > 0 and mine["memory_bytes"]["total"] == cache["memory_bytes"]["total"]


def test_the_engine_steps_it_exactly(toy):
    """The CPU engine (torch reference path) runs the toy by its switches: attention over exactly the true
    selection, its urgent fetches on the prefetch stream (FIFO)."""
    from ddbench.kernels.engine.engine import Engine, EngineConfig
    from ddbench.kernels.engine.model import Weights
    from ddbench.kernels.layout import alloc_host_kv
    from tests.test_engine_pipeline import TINY, reference_output
    g = torch.Generator().manual_seed(0)
    host = alloc_host_kv(3, 2, 2, 32, 8, 32, dtype=torch.float32)
    host.copy_(torch.randn(host.shape, generator=g))
    w = Weights.random(TINY, "cpu", 0, dtype=torch.float32)
    cfg = EngineConfig.of(context=256, batch=2, budget=64, local_chunks=1, gen_tokens=8, rank=16, cache_tokens=128,
                          miss_rate=0.25, churn_rate=0.25, seed=0)
    e = Engine(TINY, toy, cfg, w, "cpu", host_kv=host, ref=True, debug=True, log=True)
    for _ in range(3):
        e.step()
    assert e.sched.alias == {"urgent": "prefetch"} and e.debug
    for rec in e.debug:
        torch.testing.assert_close(rec["out"], reference_output(e, rec, host), rtol=1e-4, atol=1e-5)

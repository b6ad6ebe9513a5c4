"""The engine sweep's paper phase (kernels/engine/paper.py) on the CPU: the largest-batch search against
a brute force, the GPU memory cap's bad input (one line, exit 2), the engine's planned bytes against
what it allocates, the three paper models' head shapes (GQA 4 and 5, QKV bias) in the torch twin path,
aliased host KV, the phase's rows, resume and files; and one tiny paper run on the GPU."""

import csv
import json
import math

import pytest
import torch

from ddbench.core.catalog import get_model
from ddbench.core.catalog.models import ModelSpec
from ddbench.core.designs import DESIGNS
from ddbench.core.errors import DDBenchError
from ddbench.kernels.engine import paper
from ddbench.kernels.engine.engine import PLAN_CATEGORIES, Engine, EngineConfig, plan_bytes
from ddbench.kernels.engine.model import Weights, weight_bytes
from tests.cli import assert_one_line_error, module

sweep = pytest.importorskip("ddbench.kernels.engine.sweep")
from ddbench.kernels.engine import options, phases, points, results, runner  # noqa: E402
from ddbench.kernels.engine.points import PointSetup, PointTiming  # noqa: E402
GB = 10 ** 9
PAPER_MODELS = ("llama-3-8b", "qwen2.5-14b", "qwen2.5-32b")


def mini(name, layers=3):
    """A paper model's attention shape (heads, KV heads, head dim, QKV bias, RoPE base), small elsewhere."""
    m = get_model(name)
    return ModelSpec(f"mini-{name}", layers, m.num_heads, m.num_kv_heads, m.head_dim, 64, 96, 101,
                     qkv_bias=m.qkv_bias, rope_theta=m.rope_theta)


def small_cfg(miss_rate=0.3, batch=2, quant_values=False):
    return EngineConfig.of(context=256, batch=batch, budget=64, local_chunks=1, gen_tokens=8, rank=16,
                           outliers_per_1k=32, miss_rate=miss_rate, lowrank_layers=(1,), seed=0,
                           quant_values=quant_values)


def host_for(model, batch=2, ctx=256, gen=None):
    from ddbench.kernels.layout import alloc_host_kv
    h = alloc_host_kv(model.num_layers, batch, model.num_kv_heads, ctx // 8, 8, model.head_dim, dtype=torch.float32)
    return h.copy_(torch.randn(h.shape, generator=gen or torch.Generator().manual_seed(1)))


# ------------------------------------------------------------------ the search

def _fake(limit, base, per, ws):
    calls = []

    def planned(B):
        return base + per * B

    def measure(B):
        calls.append(B)
        used = planned(B) + ws(B)
        return used if used <= limit else None
    return planned, measure, calls


WORKSPACES = [lambda B: 0.0, lambda B: 0.1 * GB + 0.02 * GB * B, lambda B: 3 * GB if B > 20 else 0.5 * GB,
              lambda B: 0.9 * GB * B ** 1.2, lambda B: 5 * GB]


@pytest.mark.parametrize("ws", WORKSPACES)
@pytest.mark.parametrize("per", [1.0 * GB, 0.37 * GB, 11 * GB])
def test_search_finds_the_brute_force_largest(ws, per):
    limit, base = 80 * GB, 10 * GB
    planned, measure, calls = _fake(limit, base, per, ws)
    res = paper.search_largest(measure, planned, limit, 4096)
    truth = max([0] + [B for B in range(1, 5000) if planned(B) + ws(B) <= limit])
    assert res.largest == truth
    assert len(calls) == len(set(calls))                          # no batch measured twice
    assert all(planned(B) <= limit for B in calls)                # a batch over its plan is never allocated
    nxt = truth + 1
    assert res.basis == ("planned" if planned(nxt) > limit else "oom")
    if res.basis == "oom":
        assert nxt in calls                                       # "does not fit" was measured
    assert [B for B in calls if B & (B - 1) == 0][:3] == [1, 2, 4][:len(calls)]   # the series doubles from 1
    assert len(calls) <= 2 * math.log2(max(truth, 2)) + 4


def test_search_bounds_none_and_time():
    planned, measure, calls = _fake(80 * GB, 10 * GB, 1 * GB, lambda B: 0.0)
    res = paper.search_largest(measure, planned, 80 * GB, 8)
    assert (res.largest, res.basis, calls) == (8, "max-batch", [1, 2, 4, 8])
    planned, measure, calls = _fake(80 * GB, 90 * GB, 1 * GB, lambda B: 0.0)
    res = paper.search_largest(measure, planned, 80 * GB, 8)
    assert (res.largest, res.basis, calls) == (0, "planned", [])   # weights alone over: nothing allocated
    planned, measure, calls = _fake(80 * GB, 10 * GB, 1 * GB, lambda B: 100 * GB)
    res = paper.search_largest(measure, planned, 80 * GB, 8)
    assert (res.largest, res.basis, calls) == (0, "oom", [1])

    def late(B):
        if B > 4:
            raise paper.TimeUp
        return measure2(B)
    planned2, measure2, calls2 = _fake(80 * GB, 10 * GB, 1 * GB, lambda B: 0.0)
    res = paper.search_largest(late, planned2, 80 * GB, 4096)
    assert (res.largest, res.basis) == (4, "time")


# ------------------------------------------------------------------ the cap

def test_cap_parse_and_check():
    assert paper.parse_cap(None) == (None, "none")
    assert paper.parse_cap("80") == (80 * GB, "80gb")
    assert paper.parse_cap("h100-80gb") == (81559 * 2 ** 20, "h100-80gb")
    for bad in ("0", "-3", "nan", "inf", "h900"):
        with pytest.raises(DDBenchError):
            paper.parse_cap(bad)
    m = get_model("qwen2.5-32b")
    paper.check_cap(80 * GB, m, 150 * GB)
    with pytest.raises(DDBenchError, match="weights"):
        paper.check_cap(60 * GB, m)
    with pytest.raises(DDBenchError, match="above this GPU's memory"):
        paper.check_cap(200 * GB, m, 150 * GB)
    g = paper.cap_gpu(80 * GB, "80gb", "h200")
    assert g.hbm_bytes == 80 * GB and g.runtime_overhead_bytes > 0
    assert paper.cap_gpu(None, "none", "h200").name == "h200"


def test_bad_cap_is_one_line_exit_2():
    r = module("ddbench.kernels.engine.sweep", "--phases", "paper", "--model", "qwen2.5-32b", "--gpu-mem-cap", "60",
               timeout=120)
    assert_one_line_error(r, contains="weights")


@pytest.mark.parametrize("argv,word", [
    (["--gpu-mem-cap", "abc"], "GPU name"), (["--gpu-mem-cap", "-1"], "positive"),
    (["--gpu-mem-cap", "10"], "weights"), (["--contexts", "1k"], "budget"), (["--model", "nosuch"], "model"),
    (["--phases", "papers"], "paper"), (["--max-batch", "0"], "max-batch")])
def test_bad_paper_flags_in_process(argv, word, capsys):
    assert sweep.main(["--phases", "paper"] + argv if "--phases" not in argv else argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and word in err and "Traceback" not in err


def test_bench_engine_passes_parsed_options(monkeypatch):
    """`ddbench bench engine` hands the sweep its options parsed (typed), not an argv to parse again."""
    from ddbench import cli
    from ddbench.commands import bench_cmd as bench
    seen = []
    monkeypatch.setattr(bench, "_need_cuda", lambda: None)
    monkeypatch.setattr(runner, "run_options", lambda opts: seen.append(opts) or 0)
    assert cli.main(["bench", "engine", "--phases", "paper", "--model", "qwen2.5-32b", "--gpu-mem-cap", "h100-80gb",
                     "--contexts", "64k,128k", "--budget-s", "300", "--reps", "2", "--out", "/tmp/x-engine",
                     "--resume"]) == 0
    opts = seen[0]
    assert isinstance(opts, options.SweepOptions)
    assert (opts.phases, opts.model, opts.gpu_mem_cap, opts.contexts) == ("paper", "qwen2.5-32b", "h100-80gb", "64k,128k")
    assert opts.budget_s == 300.0 and opts.reps == 2 and opts.resume and not opts.force and opts.out == "/tmp/x-engine"
    assert opts.host_gib == options.SweepOptions().host_gib               # not given: the sweep's default
    assert options.check_args(opts, ("paper",)).paper_contexts == (65536, 131072)


def test_phases_and_folders():
    assert "paper" not in sweep.PHASES and sweep.parse_phases("paper") == ("paper",)
    assert sweep.parse_phases("paper,floor") == ("floor", "paper")
    assert sweep.out_folder("h200", ("paper",), model="qwen2.5-32b") == "h200-paper"
    assert sweep.out_folder("h200", sweep.PHASES) == "h200"
    assert sweep.out_folder("h200", ("floor",), model="qwen2.5-14b") == "h200-floor-qwen2.5-14b"
    assert sweep.plan_points(True, 3, ("paper",)) == []          # --quick --phases paper: the phase alone


# ------------------------------------------------------------------ the engine's memory plan and shapes

def _storages(obj, out):
    if isinstance(obj, torch.Tensor):
        out.setdefault(obj.untyped_storage().data_ptr(), obj.untyped_storage().nbytes())
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _storages(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            _storages(x, out)
    elif hasattr(obj, "__dataclass_fields__"):
        for f in obj.__dataclass_fields__:
            _storages(getattr(obj, f), out)
    elif type(obj).__name__ == "ChunkCache":      # dualdecoder-cache's cache and its metadata
        _storages(vars(obj), out)
    return out


@pytest.mark.parametrize("name", PAPER_MODELS)
def test_weight_bytes_is_what_random_allocates(name):
    m = mini(name)
    w = Weights.random(m, "cpu", 0, dtype=torch.float32)
    assert sum(_storages(w, {}).values()) == weight_bytes(m, 4)
    assert (w.bqkv is not None) == m.qkv_bias
    full = get_model(name)                                      # within the norms of the catalog's count
    assert 0 <= full.weight_bytes - weight_bytes(full) <= 2 * (2 * full.num_layers + 1) * full.hidden


@pytest.mark.parametrize("name", PAPER_MODELS)
def test_plan_bytes_is_what_the_engine_allocates(name):
    """Every design: the engine's own tensors after three steps (weights and host KV apart) are its plan,
    to the few KiB of token ids, RoPE tables and counters; each plan category is really used."""
    m = mini(name)
    w = Weights.random(m, "cpu", 0, dtype=torch.float32)
    skip = set(_storages(w, {}))
    for dname, spec in DESIGNS.items():
        if spec.gather == "cpu" or dname == "ideal":
            continue
        for qv in ((False, True) if spec.quant_bits else (False,)):
            _check_plan(m, spec, w, skip, small_cfg(quant_values=qv), dname)


def _check_plan(m, spec, w, skip, cfg, dname):
    host = host_for(m)
    e = Engine(m, spec, cfg, w, "cpu", host_kv=None if spec.kv_on_gpu else host, ref=True)
    for _ in range(3):
        e.step()
    own = {k: v for k, v in vars(e).items() if k not in ("w", "host", "m", "sys", "cfg", "ops", "sched", "debug")}
    have = sum(v for k, v in _storages(own, {}).items() if k not in skip and k != host.untyped_storage().data_ptr())
    plan = plan_bytes(m, spec, cfg, 4)
    assert 0 <= have - sum(plan.values()) <= 4096, (dname, have, plan)
    assert plan["resident_kv"] > 0
    assert (plan["landmarks"] > 0) == bool(spec.landmarks)
    assert (plan["sparse_kv_buffers"] > 0) == (not spec.kv_on_gpu)


def test_plan_grows_with_batch_and_is_the_memory_model():
    from ddbench.core.catalog import get_gpu
    from ddbench.core.memory import memory_breakdown
    m = get_model("qwen2.5-32b")
    cfg1, cfg4 = sweep.make_config(131072, 1), sweep.make_config(131072, 4, quant_values=True)
    for d in ("full-kv", "dualdecoder", "shadowkv", "specache"):
        p1, p4 = plan_bytes(m, DESIGNS[d], cfg1), plan_bytes(m, DESIGNS[d], sweep.make_config(131072, 4))
        assert sum(p4.values()) == 4 * sum(p1.values())          # every planned tensor is per request
        b = memory_breakdown(DESIGNS[d], m, get_gpu("h200"), cfg4.workload)
        assert plan_bytes(m, DESIGNS[d], cfg4) == {c: getattr(b, c) for c in PLAN_CATEGORIES}, d


@pytest.mark.parametrize("name", PAPER_MODELS)
@pytest.mark.parametrize("design", ["dualdecoder", "shadowkv", "specache"])
def test_paper_model_shapes_in_the_twin_path(name, design):
    """Each paper model's heads (32/8 or 40/8 of 128, QKV bias for Qwen): per-layer attention equals
    attention over the true selection, with forced misses, and the QKV bias changes the step."""
    from ddbench.kernels.engine.selfcheck import reference_output
    m = mini(name)
    w = Weights.random(m, "cpu", 0, dtype=torch.float32)
    host = host_for(m)
    e = Engine(m, DESIGNS[design], small_cfg(), w, "cpu", host_kv=host, ref=True, debug=True)
    toks = [e.step() for _ in range(3)]
    assert e.Hq == m.num_heads and e.H == m.num_kv_heads and e.d == 128
    for rec in e.debug:
        assert rec["q"].shape[2:] == (m.num_heads, 128)
        torch.testing.assert_close(rec["out"], reference_output(e, rec, host), rtol=1e-4, atol=1e-5)
    if m.qkv_bias:
        w.bqkv = None
        e2 = Engine(m, DESIGNS[design], small_cfg(), w, "cpu", host_kv=host, ref=True, debug=True)
        e2.step()
        assert not torch.equal(e2.debug[0]["q"], e.debug[0]["q"])
    assert all(t.shape[0] == 2 for t in toks)


# ------------------------------------------------------------------ aliased host KV

def test_host_kv_view_aliases_layers_then_requests():
    from ddbench.kernels.layout import check_host_kv, host_kv_view
    H, N, C, d = 2, 16, 8, 32
    per = H * N * 2 * C * d
    flat = torch.arange(per * 5, dtype=torch.float32)
    v, a = host_kv_view(flat, 4, 1, H, N, C, d)
    assert (a, v.shape[0]) == ("none", 4)
    v, a = host_kv_view(flat, 4, 2, H, N, C, d)
    assert (a, v.shape[0]) == ("layers", 2)
    v, a = host_kv_view(flat, 4, 7, H, N, C, d)
    assert a == "layers+requests" and v.shape[:2] == (1, 7) and 0 < v.stride(1) < per
    check_host_kv(v)
    assert v[0, 6].flatten()[-1] <= flat[-1]                    # the last window ends inside the buffer
    assert host_kv_view(flat[:per - 1], 4, 2, H, N, C, d) == (None, None)


def test_gathers_read_aliased_requests_as_their_twins():
    from ddbench.kernels.engine.transfer import gather_slots, gather_slots_ref, perturb, plan_misses
    from ddbench.kernels.gather import gather_ref, gather_uva
    from ddbench.kernels.layout import host_kv_view
    g = torch.Generator().manual_seed(5)
    B, H, N, C, d, k = 5, 2, 16, 8, 32, 6
    flat = torch.randn(2 * H * N * 2 * C * d + 3 * 2 * C * d, generator=g)
    host, alias = host_kv_view(flat, 2, B, H, N, C, d)
    assert alias == "layers+requests"
    dense = host.contiguous()                                   # the same values, every request its own copy
    idx = torch.rand(B, H, N, generator=g).argsort(-1)[..., :k].sort(-1).values.int()
    outs = []
    for fn, src in ((gather_uva, host), (gather_ref, host), (gather_ref, dense)):
        kb = torch.full((B, H, k * C, d), float("nan"))
        vb = kb.clone()
        fn(src, 0, idx, kb, vb)
        outs.append((kb, vb))
    for kb, vb in outs[:2]:
        assert torch.equal(kb, outs[2][0]) and torch.equal(vb, outs[2][1])
    plan = plan_misses(idx, perturb(idx, 0.5, N, g))
    outs = []
    for fn, src in ((gather_slots, host), (gather_slots_ref, host), (gather_slots_ref, dense)):
        kb = torch.zeros(B, H, k * C, d)
        vb = kb.clone()
        fn(src, 0, plan, kb, vb)
        outs.append((kb, vb))
    for kb, vb in outs[:2]:
        assert torch.equal(kb, outs[2][0]) and torch.equal(vb, outs[2][1])
    assert int(plan.count) > 0


# ------------------------------------------------------------------ the phase: rows, resume, files

def _fake_run_point(limit, calls, ws=0.05 * 2 ** 30):
    from ddbench.kernels.engine.points import design_spec

    def run_point(setup, d, ctx, B, timing, *, cfg):
        model, miss_rate = setup.model, timing.miss_rate
        calls.append((d, ctx, B) if not DESIGNS[d].chunk_cache else (d, ctx, B, cfg.workload.cache_tokens,
                                                                      cfg.miss_rate, cfg.churn_rate))
        assert cfg.batch == B and cfg.context == ctx and cfg.quant_values
        planned = sum(plan_bytes(model, design_spec(d), cfg).values())
        row = dict(model=model.name, design=d, context=ctx, batch=B, miss_rate="none" if miss_rate is None else miss_rate,
                   transfers=1, graph=1, urgent_programs=64, status="ok", model_max_batch=7,
                   planned_gib=planned / 2 ** 30)
        if planned + ws > limit:
            row["status"] = "oom"
            return row
        row.update(step_ms=10.0 + B, tok_s=B / (10.0 + B) * 1e3, tok_s_min=1.0, tok_s_max=2.0, peak_gib=1.0,
                   peak_reserved_gib=(planned + ws) / 2 ** 30, link_mib=1.0, link_gbps=1.0, prefetch_mib=1.0,
                   urgent_mib=0.0, mem_weights_gib=0.0, mem_activations_gib=ws / 2 ** 30)
        return row
    return run_point


def _run_paper(monkeypatch, limit, *, done=None, deadline=1e18, contexts=(32768,), **kw):
    calls, journal = [], []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 0)
    setup = PointSetup(get_model("llama-3-8b"), hbm=4000.0, limit=limit, log=lambda t: None)
    search = paper.PaperSearch(cap=80 * GB, cap_label="80gb", miss_rate=0.12, deadline=deadline, reps=3, max_batch=4096,
                               **kw)
    rows = paper.run_paper(setup, contexts, search, paper.PaperJournal(done or {}, lambda k, r: journal.append((k, r))),
                           run_point=_fake_run_point(limit, calls))
    return rows, calls, journal


def test_the_cache_design_is_searched_at_each_capacity_with_its_rates(monkeypatch):
    limit = 30 * 2 ** 30
    seen = []

    def rates(ctx, ct, prediction):
        seen.append((ctx, ct, prediction))
        return 0.05, (None if prediction == "none" else 0.2), f"test rates at {ct}"
    rows, calls, _ = _run_paper(monkeypatch, limit, designs=("dualdecoder-cache", "lru-cache", "shadowkv"),
                                cache_tokens=(2048, 8192), cache_rates=rates)
    assert sorted(seen) == sorted([(32768, 2048, "speculative"), (32768, 8192, "speculative"),
                                   (32768, 2048, "none"), (32768, 8192, "none")])
    s = {e["design"]: e for e in paper.summarize(rows)}
    assert set(s) == {"dualdecoder-cache@2048", "dualdecoder-cache@8192", "lru-cache@2048", "lru-cache@8192",
                      "shadowkv"}
    assert s["dualdecoder-cache@8192"]["largest_batch"] < s["dualdecoder-cache@2048"]["largest_batch"]
    cache_calls = [c for c in calls if c[0] == "dualdecoder-cache"]
    assert cache_calls and {c[4:] for c in cache_calls} == {(0.05, 0.2)} and {c[3] for c in cache_calls} == {2048, 8192}
    r = next(r for r in rows if r.get("design_label") == "dualdecoder-cache@2048")
    assert r["cache_tokens"] == 2048 and r["churn_rate"] == 0.2 and r["rates_note"] == "test rates at 2048"


def test_repeats_build_the_largest_batch_again_and_a_fixed_batch_is_not_searched(monkeypatch):
    limit = 30 * 2 ** 30
    rows, calls, journal = _run_paper(monkeypatch, limit, repeats=3)
    for d in paper.DESIGNS:
        rs = [r for r in rows if r["design"] == d]
        big = rs[0]["largest_batch"]
        reps = sorted(r["rep"] for r in rs if r["paper_role"] == "repeat")
        assert reps == [1, 2] and all(r["batch"] == big for r in rs if r["paper_role"] == "repeat"), d
        assert calls.count((d, 32768, big)) == 3
    assert len({k for k, r in journal if r is not None and r.get("rep")}) == 2 * len(paper.DESIGNS)  # own keys
    s = {e["design"]: e for e in paper.summarize(rows)}
    assert s["shadowkv"]["builds_tok_s"]["n"] == 3 and len(s["shadowkv"]["builds"]) == 3
    assert [x["batch"] for x in s["shadowkv"]["series"]].count(s["shadowkv"]["largest_batch"]) == 1
    # Fig. 14: one batch per design, no search; a batch over the cap is `oom`, largest 0
    rows, calls, _ = _run_paper(monkeypatch, limit, fixed_batch=12, repeats=2)
    for d in paper.DESIGNS:
        rs = [r for r in rows if r["design"] == d]
        assert {r["batch"] for r in rs} == {12}
        ok = rs[0]["status"] == "ok"
        assert rs[0]["largest_basis"] == ("fixed" if ok else "oom") and rs[0]["largest_batch"] == (12 if ok else 0)
        assert calls.count((d, 32768, 12)) == (2 if ok else 1)
    assert {r["status"] for r in rows if r["design"] == "full-kv"} == {"oom"}
    assert {r["status"] for r in rows if r["design"] == "shadowkv"} == {"ok"}


def test_run_paper_rows_roles_and_resume(monkeypatch):
    limit = 30 * 2 ** 30
    rows, calls, journal = _run_paper(monkeypatch, limit)
    by = {}
    for r in rows:
        by.setdefault(r["design"], []).append(r)
    assert set(by) == set(paper.DESIGNS)
    m = get_model("llama-3-8b")
    for d, rs in by.items():
        spec = DESIGNS[d]
        miss = None if spec.kv_on_gpu else 0.12
        cfg = lambda B: sweep.make_config(32768, B, PointTiming(miss), quant_values=True)   # noqa: E731
        truth = max([0] + [B for B in range(1, 4097) if sum(plan_bytes(m, spec, cfg(B)).values()) + 0.05 * 2 ** 30
                           <= limit])
        assert {r["largest_batch"] for r in rs} == {truth}, d
        largest = [r for r in rs if r["paper_role"] == "largest"]
        assert (len(largest) == 1 and largest[0]["batch"] == truth) or (truth == 0 and not largest)
        series = sorted(r["batch"] for r in rs if r["status"] == "ok")
        assert series[:3] == [1, 2, 4][:len(series)] and series[-1] == truth
        assert all(r["phase"] == "paper" and r["gpu_mem_cap"] == "80gb" for r in rs)
        assert rs[0]["largest_basis"] in ("planned", "oom")
    assert truth >= 1 and by["dualdecoder"][0]["largest_batch"] > by["shadowkv"][0]["largest_batch"]
    marks = [k for k, r in journal if r is None]
    assert len(marks) == len(paper.DESIGNS)
    # resume: every design searched is taken from the journal, nothing runs again
    done = {k: (dict(key=k) if r is None else dict(key=k, row=r)) for k, r in journal}
    rows2, calls2, _ = _run_paper(monkeypatch, limit, done=done)
    assert calls2 == [] and len(rows2) == len(rows)
    # no time left: every design reports skipped-time, nothing runs, nothing is marked done
    rows3, calls3, journal3 = _run_paper(monkeypatch, limit, deadline=0.0)
    assert calls3 == [] and {r["status"] for r in rows3} == {"skipped-time"} and all(r for _, r in journal3)


def test_write_paper_rows_schema_and_readers(monkeypatch, tmp_path):
    from ddbench.core.calibration import engine_section_rows
    from ddbench.core.traces import load_engine
    rows, _, _ = _run_paper(monkeypatch, 30 * 2 ** 30)
    floor = [dict(phase="floor", model="llama-3-8b", rep=0, design="shadowkv", context=32768, batch=1, miss_rate="none",
                  transfers=0, graph=1, status="ok", step_ms=10.0, floor_ms=5.0, step_over_floor=2.0,
                  urgent_programs=64, prefetch_mib=0.0, urgent_mib=0.0, link_mib=0.0, link_gbps=0.0)]
    prov = {"gpu": "NVIDIA H200", "git_sha": "abc", "date_utc": "2026-12-01T00:00:00Z", "command": "pytest"}
    d = tmp_path / "h200-paper"
    results.write(str(d), floor + rows, dict(provenance=prov, run_id="x", phases=["floor", "paper"], seed=0))
    with open(d / "engine.csv", newline="") as fh:
        eng = list(csv.DictReader(fh))
    assert {r["schema"] for r in eng} == {str(results.SCHEMA)} and results.SCHEMA == 3
    assert all(r["model"] == "llama-3-8b" for r in eng)
    pr = [r for r in eng if r["phase"] == "paper"]
    assert {r["paper_role"] for r in pr} >= {"largest", "series"} and all(r["largest_batch"] for r in pr)
    for c in results.MEM_COLUMNS + ["planned_gib", "peak_reserved_gib", "tok_s_min", "tok_s_max", "gpu_mem_cap"]:
        assert c in eng[0]
    df = load_engine(str(d / "engine.csv"))                      # the typed reader takes the new schema
    assert len(df) == len(eng)
    assert {r["layer"] for r in engine_section_rows(str(d / "engine.csv"))} == {"step"}   # floor rows only
    summary = json.loads((d / "summary.json").read_text())
    assert summary["schema"] == 3
    pp = {e["design"]: e for e in summary["paper"]}
    assert set(pp) == set(paper.DESIGNS) and pp["dualdecoder"]["largest_batch"] >= 1
    assert pp["dualdecoder"]["series"][0]["batch"] == 1 and "largest" in pp["dualdecoder"]


# ------------------------------------------------------------------ GPU

@pytest.mark.gpu
def test_paper_phase_tiny_gpu(tmp_path):
    """The phase end to end on a small Qwen-shaped model (config.json path): under a 3 GB cap at 64K,
    full-kv's largest batch is bounded by memory (measured, not the search bound), every sparse design
    reaches the search bound, host KV is aliased across requests, the rows carry memory by category."""
    cfg = dict(num_hidden_layers=2, num_attention_heads=40, num_key_value_heads=8, head_dim=128, hidden_size=512,
               intermediate_size=1024, vocab_size=1000, model_type="qwen2", rope_theta=1e6)
    mdir = tmp_path / "tiny-qwen"
    mdir.mkdir()
    (mdir / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "out"
    assert sweep.main(["--phases", "paper", "--model", str(mdir), "--contexts", "64k", "--gpu-mem-cap", "3",
                       "--max-batch", "8", "--reps", "2", "--host-gib", "1", "--budget-s", "300",
                       "--out", str(out), "--folder", "p"]) == 0
    with open(out / "p" / "engine.csv", newline="") as fh:
        eng = [r for r in csv.DictReader(fh) if r["phase"] == "paper"]
    by = {}
    for r in eng:
        by.setdefault(r["design"], []).append(r)
    assert set(by) == set(paper.DESIGNS)
    fk = by["full-kv"]
    assert 1 <= int(fk[0]["largest_batch"]) < 8 and fk[0]["largest_basis"] in ("planned", "oom")
    for d in ("dualdecoder", "shadowkv", "specache"):
        rs = by[d]
        assert rs[0]["largest_batch"] == "8" and rs[0]["largest_basis"] == "max-batch"
        big = [r for r in rs if r["paper_role"] == "largest"][0]
        assert big["host_alias"] == "layers+requests" and float(big["tok_s"]) > 0
        assert float(big["tok_s_min"]) <= float(big["tok_s"]) <= float(big["tok_s_max"])
        assert float(big["peak_gib"]) <= 3e9 / 2 ** 30
        _check_categories(big, get_model(str(mdir)), d)
        assert float(big["link_mib"]) > 0
    big = [r for r in fk if r["paper_role"] == "largest"][0]
    _check_categories(big, get_model(str(mdir)), "full-kv")
    summary = json.loads((out / "p" / "summary.json").read_text())
    assert summary["gpu_mem_cap"] == "3gb" and len(summary["paper"]) == 4
    assert summary["gpu_state"] == "ok" and summary["completed"] and len(summary["source_hash"]) == 16


def _check_categories(row, m, d):
    """A measured row's memory by category (engine.csv text): each planned category is the engine's plan
    for the row's point, nonzero exactly where the design holds it (landmarks: DualDecoder and ShadowKV;
    2-bit keys, outliers or low-rank factors: SpeCache and ShadowKV; no selected-KV buffers in full-kv),
    and weights + plan + activations make the allocated peak."""
    from ddbench.kernels.engine.engine import PLAN_CATEGORIES
    spec = DESIGNS[d]
    miss = None if spec.kv_on_gpu else float(row["miss_rate"])
    plan = plan_bytes(m, spec, sweep.make_config(int(row["context"]), int(row["batch"]), PointTiming(miss),
                                                quant_values=True))
    for c in PLAN_CATEGORIES:
        assert float(row[f"mem_{c}_gib"]) == pytest.approx(plan[c] / 2 ** 30, rel=1e-9, abs=1e-12), (d, c)
    assert (float(row["mem_landmarks_gib"]) > 0) == bool(spec.landmarks), d
    assert (float(row["mem_aux_residency_gib"]) > 0) == (d in ("shadowkv", "specache")), d
    assert (float(row["mem_sparse_kv_buffers_gib"]) > 0) == (not spec.kv_on_gpu), d
    assert float(row["mem_resident_kv_gib"]) > 0 and float(row["mem_weights_gib"]) > 0
    assert float(row["mem_activations_gib"]) >= 0
    total = float(row["mem_weights_gib"]) + sum(float(row[f"mem_{c}_gib"]) for c in PLAN_CATEGORIES)
    assert total + float(row["mem_activations_gib"]) == pytest.approx(float(row["peak_gib"]), rel=1e-9)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["dualdecoder", "shadowkv", "specache"])
def test_qwen_heads_triton_path_gpu(name):
    """Qwen2.5's 40 / 8 heads (a group of 5, padded in the kernels) and QKV bias through the Triton path,
    eagerly: every layer's attention equals attention over the true selection."""
    from ddbench.kernels.engine.selfcheck import SMALL_QWEN, build, reference_output
    e, host = build(name, 0.33, model=SMALL_QWEN)
    for _ in range(3):
        e.step()
    torch.cuda.synchronize()
    assert e.Hq == 40 and e.w.bqkv is not None
    for rec in e.debug:
        ref = reference_output(e, rec, host)
        torch.testing.assert_close(rec["out"].float(), ref.float(), rtol=2e-2, atol=2e-2)


def test_run_point_refuses_a_planned_oom_before_allocating(monkeypatch):
    """Over the limit by its plan: status oom with the planned bytes, and no engine is built."""
    import ddbench.kernels.engine.engine as eng
    for name in ("synchronize", "empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 16 * 2 ** 30)
    monkeypatch.setattr(eng, "Engine", lambda *a, **k: pytest.fail("allocated past the plan"))
    m = get_model("llama-3-8b")
    r = sweep.run_point(PointSetup(m, hbm=4000.0, limit=70 * 2 ** 30, log=lambda t: None), "full-kv", 131072, 4,
                        PointTiming(miss_rate=None))
    assert r["status"] == "oom" and "not allocated" in r["error"] and r["model"] == "llama-3-8b"
    assert r["planned_gib"] == pytest.approx(16 + 4 * 16.02, abs=0.1)         # 16 GiB of KV per request at 128K
    assert r["model_max_batch"] >= 1 and r["model_mem_gib"] > 70


def test_run_point_measures_a_fake_engine(monkeypatch):
    """The measured path of run_point on the CPU (the engine, its graph and the CUDA timing faked): the
    eager steps, the capture and the timed replays in that order; the row's times, link traffic, floor
    and memory by category; the log line."""
    import ddbench.kernels.engine.engine as eng
    import ddbench.kernels.timing as timing
    for name in ("synchronize", "empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 16 * 2 ** 30)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 40 * 2 ** 30)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda: 42 * 2 ** 30)
    done = []

    class FakeEngine:
        def __init__(self, model, spec, cfg, weights, device, host_kv=None, host_scales=None):
            done.append(("build", host_kv is not None))

        def step(self):
            done.append("step")

        def capture(self, steps):
            done.append(("capture", steps))

        def replay(self):
            pass

        def step_bytes(self):
            return 96 * 2 ** 20, 32 * 2 ** 20

        def floor_bytes(self):
            return dict(total=20 * 2 ** 30, weights=15 * 2 ** 30, selection=2 ** 30, kv=4 * 2 ** 30)
    monkeypatch.setattr(eng, "Engine", FakeEngine)
    monkeypatch.setattr(timing, "event_times", lambda fn, reps, warmup=0, per_call=1: [10.0, 12.0, 11.0][:reps])
    lines = []
    flat = torch.zeros(1 << 28, dtype=torch.bfloat16)
    setup = PointSetup(get_model("llama-3-8b"), None, flat, hbm=4000.0, limit=140 * 2 ** 30, overhead=2 ** 29,
                       log=lines.append)
    r = sweep.run_point(setup, "dualdecoder", 32768, 4, PointTiming(0.33, reps=3))
    assert done == [("build", True), "step", "step", ("capture", 2)]
    assert r["status"] == "ok" and r["steps"] == 6 and r["host_layers"] >= 1 and r["kv_bits"] == 16
    assert (r["step_ms"], r["step_ms_min"], r["step_ms_max"]) == (11.0, 10.0, 12.0)
    assert r["tok_s"] == pytest.approx(4 / 11.0 * 1e3) and r["link_mib"] == 128.0
    assert r["link_gbps"] == pytest.approx(128 * 2 ** 20 / 11e-3 / 1e9)
    assert r["floor_ms"] == pytest.approx(20 * 2 ** 30 / 4e12 * 1e3) and r["step_over_floor"] > 1
    assert r["mem_weights_gib"] == 16 and r["peak_reserved_gib"] == 42 and r["mem_runtime_overhead_gib"] == 0.5
    planned = sum(r[c] for c in results.MEM_COLUMNS if c not in ("mem_weights_gib", "mem_activations_gib",
                                                                 "mem_runtime_overhead_gib"))
    assert r["mem_activations_gib"] == pytest.approx(40 - 16 - planned) and r["planned_gib"] == pytest.approx(16 + planned)
    assert len(lines) == 1 and "dualdecoder" in lines[0] and "step=  11.000 ms [10.000-12.000]" in lines[0]


def test_run_paper_stops_a_design_on_an_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 0)
    calls = []

    def boom(setup, d, ctx, B, timing, **kw):
        calls.append((d, B))
        raise RuntimeError("Triton compile failed")
    journal = []
    rows = paper.run_paper(PointSetup(get_model("llama-3-8b"), hbm=4000.0, limit=100 * GB, log=lambda t: None),
                           (32768,), paper.PaperSearch(cap=None, cap_label="none", miss_rate=0.12, reps=3, max_batch=64),
                           paper.PaperJournal({}, lambda k, r: journal.append((k, r))), run_point=boom)
    assert len(calls) == len(paper.DESIGNS) and all(B == 1 for _, B in calls)   # one try per design, then the next
    assert {r["status"] for r in rows} == {"error"} and all("Triton" in r["error"] for r in rows)
    assert {r["largest_basis"] for r in rows} == {"error"} and not [k for k, r in journal if r is None]


def test_tables_render_the_paper_phase(monkeypatch, tmp_path):
    from ddbench.kernels.engine.tables import paper_table, render, render_markdown
    rows, _, _ = _run_paper(monkeypatch, 30 * 2 ** 30)
    prov = {"gpu": "NVIDIA H200", "git_sha": "abc", "date_utc": "2026-12-01T00:00:00Z", "command": "pytest"}
    d = tmp_path / "p"
    results.write(str(d), rows, dict(provenance=prov, run_id="x", phases=["paper"], seed=0))
    summary = json.loads((d / "summary.json").read_text())
    t = paper_table(summary)
    assert t.count("| llama-3-8b | 80gb | 32K |") == 4 and "DualDecoder / ShadowKV" in t
    assert "largest batch under the memory cap" in render_markdown(str(d)) and "dualdecoder" in render(str(d))


def test_paper_points_flag():
    pts = options.parse_paper_points("qwen2.5-32b:128k,llama-3-8b:128k:12,qwen2.5-32b:64k", 80 * GB)
    assert [(m.name, c, b) for m, c, b in pts] == [("qwen2.5-32b", 131072, None), ("llama-3-8b", 131072, 12),
                                                   ("qwen2.5-32b", 65536, None)]
    assert pts[0][0] is pts[2][0]                                   # one spec per model: its weights are kept
    for bad, word in (("qwen2.5-32b", "MODEL:CONTEXT"), ("nosuch:128k", "model"), ("qwen2.5-32b:1k", "budget"),
                      ("qwen2.5-32b:128k:0", "batch")):
        with pytest.raises(DDBenchError, match=word):
            options.parse_paper_points(bad, None)
    with pytest.raises(DDBenchError, match="weights"):
        options.parse_paper_points("llama-3-8b:128k,qwen2.5-32b:128k", 40 * GB)


def test_cap_is_checked_against_the_models_the_run_uses(tmp_path, capsys):
    """A 3 GB cap suits a small model given by --paper-points though the default --model (8B) would not
    fit: the checks pass and the run stops only for want of a GPU (here); with the 8B model it is refused."""
    cfg = dict(num_hidden_layers=2, num_attention_heads=40, num_key_value_heads=8, head_dim=128, hidden_size=512,
               intermediate_size=1024, vocab_size=1000, model_type="qwen2")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    if not torch.cuda.is_available():                              # (on a GPU this would run the sweep)
        code = sweep.main(["--phases", "paper", "--paper-points", f"{tmp_path / 'config.json'}:32k",
                           "--gpu-mem-cap", "3"])
        err = capsys.readouterr().err
        assert code == 2 and "CUDA" in err and "weights" not in err
    assert sweep.main(["--phases", "paper,floor", "--paper-points", f"{tmp_path / 'config.json'}:32k",
                       "--gpu-mem-cap", "3"]) == 2
    assert "llama-3-8b's weights" in capsys.readouterr().err


# ------------------------------------------------------------------ failures: capture, classification, the sweep going on

class _St(str):
    """A fake stream: its name."""

    def wait_stream(self, other):
        pass


class _FakeCuda:
    """torch.cuda as kernels/engine/capture.py uses it, recording the calls."""

    def __init__(self, syncs_move=True):
        self.log, self.cur, self.n, self.syncs, self.syncs_move = [], _St("default"), 0, 0, syncs_move

    def graph_pool_handle(self):
        return (0, 7)

    def current_stream(self):
        return self.cur

    def default_stream(self):
        return _St("default")

    def Stream(self):                         # noqa: N802 - torch's name
        self.n += 1
        return _St(f"S{self.n}")

    def set_stream(self, s):
        self.log.append(("stream", s))
        self.cur = s

    def synchronize(self):
        pass

    def empty_cache(self):
        self.syncs += 1 if self.syncs_move else 0

    def memory_stats(self):
        return {"num_sync_all_streams": self.syncs}

    def current_device(self):
        return 0

    def is_available(self):
        return True

    def is_current_stream_capturing(self):
        return False


class _FakeGraph:
    """A CUDA graph whose end fails while forked work is unjoined, as cudaStreamEndCapture does."""

    def __init__(self, log, end_error=None):
        self.log, self.forks, self.end_error = log, 0, end_error

    def capture_begin(self, pool, capture_error_mode):
        self.log.append(("begin", pool, capture_error_mode))

    def capture_end(self):
        self.log.append(("end", self.forks))
        if self.forks:
            raise RuntimeError("CUDA error: capturing stream has unjoined work")
        if self.end_error:
            raise self.end_error


class _FakeTorchC:
    def __init__(self, log, present=True):
        self.log = log
        if present:
            self._cuda_endAllocateToPool = lambda dev, pool: log.append(("endAllocateToPool", dev, pool))
            self._cuda_releasePool = lambda dev, pool: log.append(("releasePool", dev, pool))


def test_capture_joins_the_forks_and_ends_before_an_error_propagates():
    """The H200 failure (kernels/engine/engine.py capture: an allocation out of memory inside the captured
    steps while prefetches were forked): the forks are joined and the capture ended before the error
    leaves, so it is the out-of-memory error that propagates, the stream is restored, the allocator never
    needs a recovery; the normal path joins once and ends."""
    from ddbench.kernels.engine import capture as cap
    cuda = _FakeCuda()
    g = _FakeGraph(cuda.log)
    oom = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")

    def body():
        g.forks += 1                          # a prefetch forked onto its side stream
        raise oom

    def join():
        cuda.log.append(("join", g.forks))
        g.forks = 0
    with pytest.raises(torch.cuda.OutOfMemoryError) as ei:
        cap.capture(g, body, join, cuda=cuda, torch_c=_FakeTorchC(cuda.log))
    assert ei.value is oom and cuda.cur == "default"
    assert [x[0] for x in cuda.log] == ["stream", "begin", "join", "end", "stream"]
    assert ("end", 0) in cuda.log and not [x for x in cuda.log if x[0] == "endAllocateToPool"]
    assert cap.classify(ei.value)[0::2] == ("oom", False)
    # the normal path: body's value, one join, one end, the stream restored
    cuda = _FakeCuda()
    g = _FakeGraph(cuda.log)
    assert cap.capture(g, lambda: 5, lambda: cuda.log.append(("join",)), cuda=cuda, torch_c=_FakeTorchC([])) == 5
    assert [x[0] for x in cuda.log] == ["stream", "begin", "join", "end", "stream"] and cuda.cur == "default"
    # the capture stream is none of the engine's side streams (torch's stream pool is round-robin)
    cuda = _FakeCuda()
    cap.capture(_FakeGraph(cuda.log), lambda: None, lambda: None, avoid=("S1", "S2", None), cuda=cuda,
                torch_c=_FakeTorchC([]))
    assert cuda.log[0] == ("stream", "S3")


def test_a_capture_whose_end_fails_is_recovered_or_sticky():
    """Ending the capture fails after the error (an invalidated capture): the allocator is taken out of the
    capture's pool with the pool id the capture chose, and the pool given back; CaptureFailed says whether
    that worked (sticky where torch lacks the bindings), with the out-of-memory error as its cause."""
    from ddbench.kernels.engine import capture as cap
    for present in (True, False):
        cuda = _FakeCuda()
        g = _FakeGraph(cuda.log, end_error=RuntimeError("CUDA error: operation failed due to a previous error"
                                                        " during capture"))

        def body():
            raise torch.cuda.OutOfMemoryError("CUDA out of memory.")
        with pytest.raises(cap.CaptureFailed) as ei:
            cap.capture(g, body, lambda: None, cuda=cuda, torch_c=_FakeTorchC(cuda.log, present))
        exc = ei.value
        assert cuda.cur == "default" and exc.recovered == present and exc.sticky == (not present)
        assert isinstance(exc.cause, torch.cuda.OutOfMemoryError)
        status, text, sticky = cap.classify(exc)
        assert status == "oom" and sticky == (not present) and "previous error during capture" in text
        if present:
            assert ("endAllocateToPool", 0, (0, 7)) in cuda.log and ("releasePool", 0, (0, 7)) in cuda.log


def test_classify_point_failures():
    """What the H200 run got (capture_end's 'unjoined work' raised while handling the capture's out of
    memory): oom (the batch does not fit) and sticky (torch's state is suspect); a plain out of memory:
    oom, not sticky; a compile error: error, not sticky; an illegal access: error, sticky."""
    from ddbench.kernels.engine import capture as cap
    oom = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has ...")
    try:
        try:
            raise oom
        except torch.cuda.OutOfMemoryError:
            raise RuntimeError("CUDA error: capturing stream has unjoined work\nSearch for ...")
    except RuntimeError as exc:
        h200 = exc
    status, text, sticky = cap.classify(h200)
    assert (status, sticky) == ("oom", True) and "unjoined" in text and "OutOfMemoryError" in text
    assert cap.classify(oom)[0::2] == ("oom", False)
    assert cap.classify(RuntimeError("Triton compile failed"))[0::2] == ("error", False)
    assert cap.classify(RuntimeError("CUDA error: an illegal memory access was encountered"))[0::2] == ("error", True)
    assert cap.classify(RuntimeError("CUDA out of memory"))[0] == "oom"


def test_gpu_health_tells_a_stuck_allocator():
    """gpu_health after a failed point: usable; empty_cache that releases nothing (the allocator left in a
    capture's pool mode: its num_sync_all_streams does not move); a side stream left current; synchronize
    failing."""
    from ddbench.kernels.engine import capture as cap
    assert cap.gpu_health(_FakeCuda(), alloc=lambda: None) == (True, "")
    ok, why = cap.gpu_health(_FakeCuda(syncs_move=False), alloc=lambda: None)
    assert not ok and "releases nothing" in why
    c = _FakeCuda()
    c.cur = _St("S9")
    assert not cap.gpu_health(c, alloc=lambda: None)[0]
    c = _FakeCuda()
    c.synchronize = lambda: (_ for _ in ()).throw(RuntimeError("CUDA error: an illegal memory access"))
    ok, why = cap.gpu_health(c, alloc=lambda: None)
    assert not ok and "synchronize" in why


def test_point_memory_classifies_out_of_memory(monkeypatch):
    """run_point's guard: an out of memory anywhere in the chain is the row's oom with where it ran out;
    a sticky capture failure (even of an out of memory) and any other error propagate."""
    from ddbench.kernels.engine import capture as cap
    for name in ("synchronize", "empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda: None)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda: 78 * 2 ** 30)
    row, stage = {"status": "ok"}, {"now": "the capture"}
    with points.point_memory(row, stage):
        raise cap.CaptureFailed("x", cause=torch.cuda.OutOfMemoryError("CUDA out of memory."), recovered=True)
    assert row["status"] == "oom" and "in the capture" in row["error"] and row["peak_reserved_gib"] == 78
    with pytest.raises(cap.CaptureFailed):
        with points.point_memory({}, stage):
            raise cap.CaptureFailed("x", cause=torch.cuda.OutOfMemoryError("CUDA out of memory."))
    with pytest.raises(RuntimeError, match="Triton"):
        with points.point_memory({}, stage):
            raise RuntimeError("Triton compile failed")


def _raising_run_point(limit, calls, fail):
    """_fake_run_point, but `fail(d, B)` may return an exception to raise (the point's failure)."""
    ok = _fake_run_point(limit, calls)

    def run_point(setup, d, ctx, B, timing, **kw):
        exc = fail(setup.model.name, d, ctx, B)
        if exc is not None:
            calls.append((d, ctx, B))
            raise exc
        return ok(setup, d, ctx, B, timing, **kw)
    return run_point


def _paper_with(monkeypatch, fail, health=lambda: (True, ""), limit=30 * 2 ** 30, gpu_state=None):
    calls, journal = [], []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 0)
    seen = []

    def h():
        seen.append(1)
        return health()
    rows = paper.run_paper(PointSetup(get_model("llama-3-8b"), hbm=4000.0, limit=limit, log=lambda t: None), (32768,),
                           paper.PaperSearch(cap=80 * GB, cap_label="80gb", miss_rate=0.12, reps=3, max_batch=4096),
                           paper.PaperJournal({}, lambda k, r: journal.append((k, r))), gpu_state=gpu_state, health=h,
                           run_point=_raising_run_point(limit, calls, fail))
    return rows, calls, journal, seen


def test_an_out_of_memory_raised_in_a_point_is_does_not_fit(monkeypatch):
    """SpeCache's capture running out at batch 11 (now a plain out-of-memory error out of the capture):
    an `oom` row with its planned bytes, the search's largest batch 10 with basis oom, the GPU state
    checked, and the next design searched."""
    def fail(m, d, ctx, B):
        if d == "specache" and B > 10:
            return torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
    rows, calls, journal, seen = _paper_with(monkeypatch, fail)
    sp = [r for r in rows if r["design"] == "specache"]
    assert {r["largest_batch"] for r in sp} == {10} and {r["largest_basis"] for r in sp} == {"oom"}
    bad = [r for r in sp if r["status"] == "oom"]
    assert bad and all(r["batch"] > 10 and r["planned_gib"] > 0 and "OutOfMemoryError" in r["error"] for r in bad)
    assert seen and {r["design"] for r in rows} == set(paper.DESIGNS)
    assert [k for k, r in journal if r is None and "specache" in k]          # searched to its end: resumable
    assert any(d == "full-kv" for d, _, _ in calls) or all(r["status"] == "oom" for r in rows if r["design"] == "full-kv")


def test_a_sticky_failure_stops_every_later_point(monkeypatch):
    """The H200 chain (out of memory in the capture, then 'unjoined work'): its row is oom with the reason
    the GPU state is unusable; the design's search ends (error) and every later design reads error, not
    run, without calling run_point; gpu_state says after which point. A health check that fails after an
    ordinary error does the same."""
    def h200(m, d, ctx, B):
        if d == "shadowkv" and B == 4:
            try:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory.")
            except torch.cuda.OutOfMemoryError:
                try:
                    raise RuntimeError("CUDA error: capturing stream has unjoined work")
                except RuntimeError as exc:
                    return exc
    state = {}
    rows, calls, journal, _ = _paper_with(monkeypatch, h200, gpu_state=state)
    sk = [r for r in rows if r["design"] == "shadowkv"]
    hit = [r for r in sk if r["batch"] == 4][0]
    assert hit["status"] == "oom" and "unusable" in hit["error"] and {r["largest_basis"] for r in sk} == {"error"}
    assert "shadowkv" in state["poisoned"] and "B=4" in state["poisoned"]
    later = [r for r in rows if r["design"] in ("specache", "full-kv")]
    assert later and {r["status"] for r in later} == {"error"} and all("not run" in r["error"] for r in later)
    assert not [c for c in calls if c[0] in ("specache", "full-kv")]
    assert not [k for k, r in journal if r is None and ("shadowkv" in k or "specache" in k)]   # searched again on --resume
    state = {}
    rows, calls, _, _ = _paper_with(monkeypatch, lambda m, d, ctx, B: RuntimeError("Triton compile failed")
                                    if d == "dualdecoder" else None,
                                    health=lambda: (False, "torch.cuda.empty_cache() releases nothing"), gpu_state=state)
    assert "releases nothing" in state["poisoned"] and [c[0] for c in calls] == ["dualdecoder"]
    assert {r["status"] for r in rows if r["design"] != "dualdecoder"} == {"error"}


def _fake_gpu_sweep(monkeypatch, *, weights_fail=(), point_fail=lambda m, d, ctx, B: None,
                    health=lambda: (True, "")):
    """sweep.main on the CPU: every GPU call replaced (start-up rates, the host buffer, the cap, the
    weights, run_point, the health check); returns the (model, ...) calls to Weights.random and run_point."""
    import types

    import ddbench.kernels.timing as timing
    from ddbench.kernels.engine import capture as cap
    from ddbench.kernels.engine.model import Weights
    built, calls = [], []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name in ("synchronize", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(total_memory=150 * GB))
    monkeypatch.setattr(timing, "provenance", lambda command: dict(
        gpu="NVIDIA H200", driver="580", cuda="13.0", torch="2.11", triton="3.6", git_sha="abc+dirty",
        date_utc="2026-12-01T00:00:00Z", command=command))

    def gpu_memory(a):
        return dict(total=150 * GB, overhead=GB // 2, limit=(a.cap or 150 * GB) - GB // 2, cap=a.cap,
                    cap_label=a.cap_label,
                    gpu="h200", mem_gpu=paper.cap_gpu(a.cap, a.cap_label, "h200"))
    monkeypatch.setattr(runner, "gpu_memory", gpu_memory)
    monkeypatch.setattr(points, "copy_gbps", lambda: 55.0)
    monkeypatch.setattr(points, "hbm_gbps", lambda: 4200.0)
    monkeypatch.setattr(points, "gather_gbps", lambda hv: 50.0)
    monkeypatch.setattr(points, "alloc_host", lambda gib, seed=0: (torch.zeros(1024, dtype=torch.bfloat16), 0.0, 0.0))
    monkeypatch.setattr(runner, "apply_cap", lambda mem: None)
    monkeypatch.setattr(cap, "gpu_health", health)

    def random(model, device, seed, **kw):
        built.append(model.name)
        if model.name in weights_fail:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 70.00 MiB.")
        return object()
    monkeypatch.setattr(Weights, "random", staticmethod(random))
    monkeypatch.setattr(points, "run_point", _raising_run_point(70 * 2 ** 30, calls, point_fail))
    return built, calls


def _read(folder):
    with open(folder / "engine.csv", newline="") as fh:
        eng = list(csv.DictReader(fh))
    return eng, json.loads((folder / "summary.json").read_text()), json.loads((folder / "meta.json").read_text())


def test_the_sweep_goes_on_after_a_failed_point_and_model_switch(monkeypatch, tmp_path):
    """--paper-points through sweep.main with the GPU faked: a point that raises (ShadowKV at batch 2) is a
    row and the search goes on to the next design; a model whose weights run out of memory (qwen2.5-14b)
    is oom rows and the next point (llama-3-8b again: its weights rebuilt) runs; engine.csv (read by the
    typed reader) and summary.json are written; meta.json and every row carry the source hash."""
    from ddbench.core.traces import load_engine
    built, calls = _fake_gpu_sweep(monkeypatch, weights_fail=("qwen2.5-14b",),
                                   point_fail=lambda m, d, ctx, B: RuntimeError("Triton compile failed")
                                   if (m, d, ctx, B) == ("llama-3-8b", "shadowkv", 32768, 2) else None)
    out = tmp_path / "out"
    assert sweep.main(["--phases", "paper", "--paper-points", "llama-3-8b:32k,qwen2.5-14b:32k,llama-3-8b:64k",
                       "--gpu-mem-cap", "h100-80gb", "--max-batch", "8", "--out", str(out), "--folder", "p"]) == 0
    folder = out / "p"
    eng, summary, meta = _read(folder)
    assert built == ["llama-3-8b", "qwen2.5-14b", "llama-3-8b"]
    q = [r for r in eng if r["model"] == "qwen2.5-14b"]
    assert len(q) == len(paper.DESIGNS) and {r["status"] for r in q} == {"oom"}
    assert all("weights of qwen2.5-14b failed" in r["error"] and r["largest_basis"] == "error" for r in q)
    sk = [r for r in eng if r["model"] == "llama-3-8b" and r["context"] == "32768" and r["design"] == "shadowkv"]
    assert {(r["batch"], r["status"]) for r in sk} == {("1", "ok-no-twin"), ("2", "error")}   # (no compute-only twin)
    assert {r["design"] for r in eng if r["context"] == "65536"} == set(paper.DESIGNS)
    assert [c for c in calls if c[:2] == ("specache", 32768)]                 # the next design was searched
    assert summary["gpu_state"] == "ok" and summary["completed"] and len(summary["paper"]) == 3 * len(paper.DESIGNS)
    assert not (folder / "current.json").exists()
    assert meta["source_hash"] == runner.source_hash() == meta["provenance"]["source_hash"]
    assert {r["source_hash"] for r in eng} == {meta["source_hash"]}
    with open(folder / "rows.jsonl") as fh:
        assert all(e["row"]["source_hash"] == meta["source_hash"] for e in map(json.loads, fh) if e.get("row"))
    assert len(load_engine(str(folder / "engine.csv"))) == len(eng)


def test_the_files_are_written_when_the_gpu_state_is_lost_or_the_sweep_crashes(monkeypatch, tmp_path):
    """A failed model switch after which the GPU state is unusable: the remaining points are error rows,
    not run, and the files are written (gpu_state says why). A crash of the sweep itself (a bug outside
    any point): engine.csv and summary.json are still written (completed false) and the exception
    propagates."""
    built, calls = _fake_gpu_sweep(monkeypatch, weights_fail=("qwen2.5-14b",),
                                   health=lambda: (False, "torch.cuda.empty_cache() releases nothing"))
    out = tmp_path / "out"
    assert sweep.main(["--phases", "paper", "--paper-points", "qwen2.5-14b:32k,llama-3-8b:32k", "--gpu-mem-cap",
                       "h100-80gb", "--max-batch", "4", "--out", str(out), "--folder", "p"]) == 0
    eng, summary, _ = _read(out / "p")
    assert built == ["qwen2.5-14b"] and calls == []
    ll = [r for r in eng if r["model"] == "llama-3-8b"]
    assert len(ll) == len(paper.DESIGNS) and {r["status"] for r in ll} == {"error"}
    assert all("not run" in r["error"] for r in ll) and "qwen2.5-14b" in summary["gpu_state"]

    def boom(*a, **k):
        raise RuntimeError("a bug in the sweep")
    _fake_gpu_sweep(monkeypatch)
    monkeypatch.setattr(phases, "run_paper_points", boom)
    with pytest.raises(RuntimeError, match="a bug"):
        sweep.main(["--phases", "paper", "--paper-points", "llama-3-8b:32k", "--gpu-mem-cap", "h100-80gb",
                    "--out", str(out), "--folder", "q"])
    eng, summary, meta = _read(out / "q")
    assert eng == [] and summary["completed"] is False and summary["run_id"] == meta["run_id"]


def test_source_hash_is_of_the_sources_only(tmp_path):
    """source_hash: 16 hex digits over the *.py files of kernels/ and ddbench/ (paths and bytes): a change
    of content changes it, file times and caches (__pycache__, hidden folders, other files) do not."""
    import os
    import time
    for rel, text in (("kernels/a.py", "x = 1\n"), ("kernels/engine/b.py", "y = 2\n"), ("ddbench/c.py", "z\n"),
                      ("kernels/__pycache__/a.cpython-312.pyc", "junk"), ("kernels/.git/d.py", "junk"),
                      ("kernels/notes.txt", "junk"), ("other/e.py", "junk")):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    h = runner.source_hash(str(tmp_path))
    assert len(h) == 16 and int(h, 16) >= 0
    t = time.time() + 100
    os.utime(tmp_path / "kernels/a.py", (t, t))
    for rel in ("kernels/__pycache__/a.cpython-312.pyc", "kernels/.git/d.py", "kernels/notes.txt", "other/e.py"):
        (tmp_path / rel).write_text("changed")
    assert runner.source_hash(str(tmp_path)) == h
    (tmp_path / "kernels/engine/b.py").write_text("y = 3\n")
    assert runner.source_hash(str(tmp_path)) != h
    assert len(runner.source_hash()) == 16


# ------------------------------------------------------------------ GPU: the capture failure itself

@pytest.mark.gpu
def test_engine_capture_out_of_memory_leaves_torch_usable_gpu():
    """The H200 failure on a small engine: an allocation inside the captured steps runs out of memory
    while prefetches are forked (injected at the first MLP with side streams in use). Engine.capture
    raises the out-of-memory error itself (not 'unjoined work'), the default stream is current again,
    empty_cache really releases (capture.gpu_health), and a new engine captures and replays."""
    from ddbench.kernels.engine import capture as cap
    from ddbench.kernels.engine.selfcheck import build
    e, _ = build("dualdecoder", 0.33, debug=False)
    e.step()
    e.step()
    real, hit = e.ops.swiglu, []

    def swiglu(x):
        if torch.cuda.is_current_stream_capturing() and e.sched.used:
            hit.append(sorted(e.sched.used))
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected inside the capture)")
        return real(x)
    e.ops.swiglu = swiglu
    with pytest.raises(torch.cuda.OutOfMemoryError):
        e.capture(2)
    assert hit and "prefetch" in hit[0] and e.graph is None
    e = None                                  # the failed engine (its tensors) goes
    cap.release()
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    assert cap.gpu_health() == (True, "") and cap.cache_releases() is not False
    f, _ = build("dualdecoder", 0.33, debug=False)
    f.step()
    f.step()
    f.capture(2)
    f.replay()
    torch.cuda.synchronize()
    assert f.sched.streams["prefetch"] != torch.cuda.current_stream()


@pytest.mark.gpu
def test_torch_graph_failure_is_told_by_gpu_health_gpu():
    """In a child process, the failure as torch.cuda.graph leaves it (forked work, then an out-of-memory
    error inside `with torch.cuda.graph`): the error is classified oom, and where torch masked it with its
    end error (the H200 run: 'unjoined work'), it is sticky and gpu_health reports the state unusable."""
    import subprocess
    import sys
    code = """
import json, torch
from ddbench.kernels.engine import capture as cap
x = torch.ones(1 << 20, device="cuda")
s = torch.cuda.Stream()
g = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(g):
        y = x * 2
        ev = torch.cuda.Event(); ev.record(); s.wait_event(ev)
        with torch.cuda.stream(s):
            z = x + 1
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
except Exception as exc:
    st, text, sticky = cap.classify(exc)
    res = dict(type=type(exc).__name__, status=st, sticky=sticky)
del g
ok, why = cap.gpu_health()
res.update(ok=ok, why=why)
torch.cuda.set_stream(torch.cuda.default_stream())   # the stream put right: is the allocator still stuck?
try:
    res["cache_releases"] = cap.cache_releases()
except Exception as exc:
    res["cache_releases"] = cap.describe(exc)
print(json.dumps(res))
"""
    from pathlib import Path
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=str(Path(__file__).resolve().parents[1]))
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    print(res)                                   # cache_releases: False (or an assert) = the allocator diagnosis
    assert res["status"] == "oom"
    if res["type"] != "OutOfMemoryError":           # torch's end error masked it: the state is poisoned
        assert res["sticky"] and not res["ok"], res


def test_the_default_phases_go_on_after_a_point_raises(monkeypatch, tmp_path):
    """The plan_points phases (here validation): a point that raises a compile error is an error row, one
    whose exception chain is out of memory an oom row, every other point still runs, the files are written."""
    _fake_gpu_sweep(monkeypatch)
    seen = []

    def run_point(setup, d, c, B, timing):
        seen.append((d, c, B, timing.transfers))
        if len(seen) == 1:
            raise RuntimeError("Triton compile failed")
        if len(seen) == 2:
            try:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory.")
            except torch.cuda.OutOfMemoryError:
                raise RuntimeError("while building the engine")
        return dict(status="ok", step_ms=10.0, tok_s=100.0, prefetch_mib=1.0, urgent_mib=0.0, link_mib=1.0,
                    link_gbps=1.0, peak_gib=1.0)
    monkeypatch.setattr(points, "run_point", run_point)
    out = tmp_path / "out"
    assert sweep.main(["--phases", "validation", "--out", str(out), "--folder", "v"]) == 0
    eng, summary, _ = _read(out / "v")
    assert len(eng) == len(seen) == len(sweep.plan_points(False, 3, ("validation",)))
    assert [r["status"] for r in eng[:2]] == ["error", "oom"] and "Triton" in eng[0]["error"]
    assert {r["status"] for r in eng[2:]} <= {"ok", "ok-no-twin"} and summary["gpu_state"] == "ok"


def test_resume_keeps_the_run_and_makes_the_crashed_point_its_row(monkeypatch, tmp_path):
    """--resume: the points of rows.jsonl are not run again, the point current.json names (the one
    running when the process died) is a `crashed` row and not retried, meta.json keeps its run_id; a
    run without --resume (and --force) starts over."""
    _fake_gpu_sweep(monkeypatch)
    seen = []

    def run_point(setup, d, c, B, timing, **kw):
        seen.append((d, c, B, timing.transfers))
        return dict(status="ok", step_ms=10.0, tok_s=100.0, prefetch_mib=1.0, urgent_mib=0.0, link_mib=1.0,
                    link_gbps=1.0, peak_gib=1.0)
    monkeypatch.setattr(points, "run_point", run_point)
    out, args = tmp_path / "out", ["--phases", "validation", "--out", str(tmp_path / "out"), "--folder", "v"]
    assert sweep.main(args) == 0
    folder = out / "v"
    run_id = json.loads((folder / "meta.json").read_text())["run_id"]
    lines = (folder / "rows.jsonl").read_text().splitlines()
    n = len(lines)
    (folder / "rows.jsonl").write_text("\n".join(lines[:5]) + "\n")       # died while running the 6th point
    (folder / "current.json").write_text(json.dumps(dict(key=json.loads(lines[5])["key"])))
    seen.clear()
    assert sweep.main(args + ["--resume"]) == 0
    eng, _, meta = _read(folder)
    assert meta["run_id"] == run_id and len(eng) == n and len(seen) == n - 6
    assert [r["status"].startswith("ok") for r in eng[:6]] == [True] * 5 + [False] and eng[5]["status"] == "crashed"
    assert not (folder / "current.json").exists()
    seen.clear()
    assert sweep.main(args + ["--force"]) == 0
    assert len(seen) == n and json.loads((folder / "meta.json").read_text())["run_id"] != run_id


def test_the_memory_model_predicts_the_measured_largest_batches():
    """traces/engine/h200-paper: at every measured point (3 models, 64K-256K, 80 GB cap) the memory
    model's largest batch (model_max_batch, priced on the capped GPU) is within one request, or 2 %,
    of the largest batch the engine ran without running out of memory."""
    from ddbench.core.paths import traces_dir
    with open(traces_dir("engine", "h200-paper", "summary.json"), encoding="utf-8") as f:
        pts = json.load(f)["paper"]
    assert len(pts) == 24
    for p in pts:
        got, want = p["largest_batch"], p["model_max_batch"]
        assert abs(got - want) <= max(1, 0.02 * got), (p["model"], p["context"], p["design"], got, want)
        if got:
            assert p["builds_tok_s"]["n"] == 3

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
from kernels.engine import paper
from kernels.engine.engine import Engine, EngineConfig, plan_bytes
from kernels.engine.model import Weights, weight_bytes
from tests.cli import assert_one_line_error, module

sweep = pytest.importorskip("kernels.engine.sweep")
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
    from kernels.layout import alloc_host_kv
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
    r = module("kernels.engine.sweep", "--phases", "paper", "--model", "qwen2.5-32b", "--gpu-mem-cap", "60",
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


def test_bench_engine_passes_the_flags_through(monkeypatch):
    from ddbench import cli
    from ddbench.commands import bench
    seen = []
    monkeypatch.setattr(bench, "_need_cuda", lambda: None)
    monkeypatch.setattr(sweep, "main", lambda argv: seen.append(argv) or 0)
    assert cli.main(["bench", "engine", "--phases", "paper", "--model", "qwen2.5-32b", "--gpu-mem-cap", "h100-80gb",
                     "--contexts", "64k,128k", "--budget-s", "300", "--out", "/tmp/x-engine", "--resume"]) == 0
    argv = seen[0]
    for pair in (("--phases", "paper"), ("--model", "qwen2.5-32b"), ("--gpu-mem-cap", "h100-80gb"),
                 ("--contexts", "64k,128k"), ("--budget-s", "300")):
        i = argv.index(pair[0])
        assert argv[i + 1] == pair[1]
    assert "--resume" in argv


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


def test_plan_grows_with_batch_and_matches_the_memory_model_where_they_agree():
    from ddbench.core.memory import landmark_bytes, resident_kv_bytes
    m = get_model("qwen2.5-32b")
    cfg1, cfg4 = sweep.make_config(131072, 1), sweep.make_config(131072, 4)
    for d in ("full-kv", "dualdecoder", "shadowkv", "specache"):
        p1, p4 = plan_bytes(m, DESIGNS[d], cfg1), plan_bytes(m, DESIGNS[d], cfg4)
        assert sum(p4.values()) == 4 * sum(p1.values())          # every planned tensor is per request
    s = DESIGNS["dualdecoder"]
    p = plan_bytes(m, s, cfg4)
    # landmarks: the model adds an int64 chunk index per landmark that the engine does not keep
    assert p["landmarks"] == landmark_bytes(s, m, cfg4.workload) - 4 * 64 * 8 * 16384 * 8
    sc = DESIGNS["specache"]                                     # keys and values in 2 bits, as the model has them
    from ddbench.core.memory import aux_residency_bytes
    q = plan_bytes(m, sc, sweep.make_config(131072, 4, quant_values=True))["aux_residency"]
    gap = aux_residency_bytes(sc, m, cfg4.workload) - q           # the model quantizes the generated tokens too
    assert 0 <= gap <= cfg4.workload.gen_tokens * 4 * m.num_layers * 8 * 96
    full = plan_bytes(m, DESIGNS["full-kv"], cfg1)["resident_kv"]
    assert abs(full - resident_kv_bytes(DESIGNS["full-kv"], m, cfg1.workload)) <= 2 * m.kv_bytes_per_token


@pytest.mark.parametrize("name", PAPER_MODELS)
@pytest.mark.parametrize("design", ["dualdecoder", "shadowkv", "specache"])
def test_paper_model_shapes_in_the_twin_path(name, design):
    """Each paper model's heads (32/8 or 40/8 of 128, QKV bias for Qwen): per-layer attention equals
    attention over the true selection, with forced misses, and the QKV bias changes the step."""
    from kernels.engine.selfcheck import reference_output
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
    from kernels.layout import check_host_kv, host_kv_view
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
    from kernels.engine.transfer import gather_slots, gather_slots_ref, perturb, plan_misses
    from kernels.gather import gather_ref, gather_uva
    from kernels.layout import host_kv_view
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
    from kernels.engine.sweep import design_spec

    def run_point(model, weights, flat, d, ctx, B, *, miss_rate, transfers, graph, reps, hbm, cfg, limit, mem_gpu,
                  overhead, seed, log):
        calls.append((d, ctx, B))
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


def _run_paper(monkeypatch, limit, *, done=None, deadline=1e18, contexts=(32768,)):
    import kernels.engine.sweep as sw
    calls, journal = [], []
    monkeypatch.setattr(sw, "run_point", _fake_run_point(limit, calls))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 0)
    rows = paper.run_paper(get_model("llama-3-8b"), None, None, contexts, cap=80 * GB, cap_label="80gb", limit=limit,
                           mem_gpu=None, overhead=0, reps=3, max_batch=4096, miss_rate=0.12, hbm=4000.0,
                           deadline=deadline, done=done or {}, append=lambda k, r: journal.append((k, r)),
                           log=lambda t: None)
    return rows, calls, journal


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
        cfg = lambda B: sweep.make_config(32768, B, miss, True, quant_values=True)   # noqa: E731
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
    sweep.write(str(d), floor + rows, dict(provenance=prov, run_id="x", phases=["floor", "paper"], seed=0))
    with open(d / "engine.csv", newline="") as fh:
        eng = list(csv.DictReader(fh))
    assert {r["schema"] for r in eng} == {str(sweep.SCHEMA)} and sweep.SCHEMA == 3
    assert all(r["model"] == "llama-3-8b" for r in eng)
    pr = [r for r in eng if r["phase"] == "paper"]
    assert {r["paper_role"] for r in pr} >= {"largest", "series"} and all(r["largest_batch"] for r in pr)
    for c in sweep.MEM_COLUMNS + ["planned_gib", "peak_reserved_gib", "tok_s_min", "tok_s_max", "gpu_mem_cap"]:
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
        assert float(big["mem_landmarks_gib"]) > 0 and float(big["mem_activations_gib"]) >= 0
        assert float(big["link_mib"]) > 0
    summary = json.loads((out / "p" / "summary.json").read_text())
    assert summary["gpu_mem_cap"] == "3gb" and len(summary["paper"]) == 4


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["dualdecoder", "shadowkv", "specache"])
def test_qwen_heads_triton_path_gpu(name):
    """Qwen2.5's 40 / 8 heads (a group of 5, padded in the kernels) and QKV bias through the Triton path,
    eagerly: every layer's attention equals attention over the true selection."""
    from kernels.engine.selfcheck import SMALL_QWEN, build, reference_output
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
    import kernels.engine.engine as eng
    for name in ("synchronize", "empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 16 * 2 ** 30)
    monkeypatch.setattr(eng, "Engine", lambda *a, **k: pytest.fail("allocated past the plan"))
    m = get_model("llama-3-8b")
    r = sweep.run_point(m, None, None, "full-kv", 131072, 4, miss_rate=None, hbm=4000.0, limit=70 * 2 ** 30,
                        log=lambda t: None)
    assert r["status"] == "oom" and "not allocated" in r["error"] and r["model"] == "llama-3-8b"
    assert r["planned_gib"] == pytest.approx(16 + 4 * 16.02, abs=0.1)         # 16 GiB of KV per request at 128K
    assert r["model_max_batch"] >= 1 and r["model_mem_gib"] > 70


def test_run_paper_stops_a_design_on_an_error(monkeypatch):
    import kernels.engine.sweep as sw
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 0)
    calls = []

    def boom(model, weights, flat, d, ctx, B, **kw):
        calls.append((d, B))
        raise RuntimeError("Triton compile failed")
    monkeypatch.setattr(sw, "run_point", boom)
    journal = []
    rows = paper.run_paper(get_model("llama-3-8b"), None, None, (32768,), cap=None, cap_label="none", limit=100 * GB,
                           mem_gpu=None, overhead=0, reps=3, max_batch=64, miss_rate=0.12, hbm=4000.0, deadline=1e18,
                           done={}, append=lambda k, r: journal.append((k, r)), log=lambda t: None)
    assert len(calls) == len(paper.DESIGNS) and all(B == 1 for _, B in calls)   # one try per design, then the next
    assert {r["status"] for r in rows} == {"error"} and all("Triton" in r["error"] for r in rows)
    assert {r["largest_basis"] for r in rows} == {"error"} and not [k for k, r in journal if r is None]


def test_tables_render_the_paper_phase(monkeypatch, tmp_path):
    from kernels.engine.tables import paper_table, render, render_markdown
    rows, _, _ = _run_paper(monkeypatch, 30 * 2 ** 30)
    prov = {"gpu": "NVIDIA H200", "git_sha": "abc", "date_utc": "2026-12-01T00:00:00Z", "command": "pytest"}
    d = tmp_path / "p"
    sweep.write(str(d), rows, dict(provenance=prov, run_id="x", phases=["paper"], seed=0))
    summary = json.loads((d / "summary.json").read_text())
    t = paper_table(summary)
    assert t.count("| llama-3-8b | 80gb | 32K |") == 4 and "DualDecoder / ShadowKV" in t
    assert "largest batch under the memory cap" in render_markdown(str(d)) and "dualdecoder" in render(str(d))


def test_paper_points_flag():
    pts = sweep.parse_paper_points("qwen2.5-32b:128k,llama-3-8b:128k,qwen2.5-32b:64k", 80 * GB)
    assert [(m.name, c) for m, c in pts] == [("qwen2.5-32b", 131072), ("llama-3-8b", 131072), ("qwen2.5-32b", 65536)]
    assert pts[0][0] is pts[2][0]                                   # one spec per model: its weights are kept
    for bad, word in (("qwen2.5-32b", "MODEL:CONTEXT"), ("nosuch:128k", "model"), ("qwen2.5-32b:1k", "budget")):
        with pytest.raises(DDBenchError, match=word):
            sweep.parse_paper_points(bad, None)
    with pytest.raises(DDBenchError, match="weights"):
        sweep.parse_paper_points("llama-3-8b:128k,qwen2.5-32b:128k", 40 * GB)


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

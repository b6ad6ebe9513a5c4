"""The engine sweep's phases: which points each measures, in run order, and the loop that runs them.

    plan_points(quick, reps, phases) -> [Point]   floor, mechanism, validation, reuse-fetch (the default run)
    run_points(...)        those points, one row each (kernels/engine/points.py measures one)
    run_paper_points(...)  the paper phase's MODEL:CONTEXT points (kernels/engine/paper.py searches one)
    Journal                rows.jsonl (every row as it comes: --resume) and current.json (the point running)

What each phase measures and why: kernels/engine/sweep.py's docstring.
"""

from __future__ import annotations

import json
import os
import time
from typing import NamedTuple

from ddbench.core.defaults import FORCED_MISS
from ddbench.core.designs import (DUALDECODER, DUALDECODER_CPU_GATHER, DUALDECODER_FIFO, DUALDECODER_PER_LAYER,
                                    DUALDECODER_TWO_PASS, FULL_KV, SHADOWKV, SPECACHE)
from ddbench.core.enginepoint import EnginePoint
from ddbench.core.errors import DDBenchError
from ddbench.kernels.engine import paper as paper_phase
from ddbench.kernels.engine import points as pt

PHASES = ("floor", "mechanism", "validation", "reuse-fetch")     # the default run
PAPER = paper_phase.PAPER
ALL_PHASES = PHASES + (PAPER,)            # `paper` only when asked for (--phases paper)
REUSE = "reuse-fetch"
DEFAULT_MODEL = "llama-3-8b"
K128, K32 = 131072, 32768
MECH_POINTS = ((1, 0.33), (2, 0.33), (4, 0.33), (16, 0.33), (2, FORCED_MISS), (4, FORCED_MISS))   # (batch, miss) at 128K
REUSE_BATCHES = ((K32, (1, 2, 4, 8, 16, 32, 64)), (K128, (16,)))   # (context, batches) of the reuse-fetch record
REUSE_MISS = (0.0, 0.25, 1.0)             # all hits (HBM), the mix, all host reads
VAL_MISS = 0.25                           # validation: miss rates and batches the other phases do not use
VAL_BATCHES = (2, 8, 32)
DUALDECODER_SINGLE = EnginePoint.named(DUALDECODER, single=True).design   # its dual-token step, one query token


class Point(NamedTuple):
    """One point of the plan_points phases; a tuple in this order (rows.jsonl keys are its json)."""
    phase: str
    rep: int
    design: str
    context: int
    batch: int
    miss: float | None        # forced miss rate; None: the model's own selection
    transfers: bool
    graph: bool


def parse_phases(text):
    """'floor,validation' -> ('floor', 'validation') in run order; one-line error for an unknown name."""
    names = [x.strip() for x in str(text).split(",") if x.strip()]
    bad = [x for x in names if x not in ALL_PHASES]
    if bad or not names:
        raise DDBenchError(f"--phases takes a comma-separated subset of {', '.join(ALL_PHASES)}, got {text!r}")
    return tuple(p for p in ALL_PHASES if p in names)


def out_folder(gpu, phases, folder=None, model=DEFAULT_MODEL):
    """The sweep's folder name under --out: --folder, else the GPU's catalog name for all phases, else
    '<gpu>-<phases joined by +>' (a partial run never overwrites a full sweep's folder); another model
    than the default adds '-<model>', except to the paper phase's folder (one folder, every model)."""
    if folder:
        return folder
    name = gpu if tuple(phases) == PHASES else gpu + "-" + "+".join(phases)
    return name if model == DEFAULT_MODEL or tuple(phases) == (PAPER,) else f"{name}-{model}"


# ------------------------------------------------------------------ the plan

def plan_points(quick, reps, phases=PHASES):
    """[Point] in run order, for the selected phases.

    floor: compute-only steps with the model's own selection (the simulator's calibration), and for
    the designs that draw forced misses the same steps with a forced miss rate: their difference is
    the harness's cost of drawing the misses (not a design cost), which sim/validate.py adds to
    forced-miss points. validation: points the floor phase does not measure (batches 2, 8, 32, miss
    rates 0.25 and 0.1), full steps with their compute-only twins."""
    if quick:
        return [p for p in _quick_points() if p.phase in phases]
    pts = []
    for c in (K32, K128):
        for B in (1, 16, 64):
            for d in (DUALDECODER, DUALDECODER_SINGLE, SHADOWKV, SPECACHE, FULL_KV):
                pts.append(Point("floor", 0, d, c, B, None, False, True))   # the model's own selection
            for d in (DUALDECODER, SHADOWKV, SPECACHE):      # the harness's forced-miss draw
                pts.append(Point("floor", 0, d, c, B, FORCED_MISS, False, True))
    pts = [p for p in pts if p.phase in phases]
    if "mechanism" in phases:
        pts += _mechanism_points(reps)
    if "validation" in phases:
        pts += _validation_points()
    if REUSE in phases:
        pts += reuse_points()
    return pts


def _quick_points():
    pts = [Point("floor", 0, d, K32, 4, FORCED_MISS, False, True)
           for d in (DUALDECODER, DUALDECODER_SINGLE, SHADOWKV, SPECACHE, FULL_KV)]
    for d, B in ((DUALDECODER, 16), (DUALDECODER, 64), (DUALDECODER_SINGLE, 64), (SHADOWKV, 16),
                 (SPECACHE, 16), (FULL_KV, 1)):
        pts.append(Point("floor", 0, d, K128, B, FORCED_MISS, False, True))
    for d in (DUALDECODER, DUALDECODER_FIFO, SHADOWKV, SPECACHE, DUALDECODER_PER_LAYER,
              DUALDECODER_TWO_PASS):
        pts.append(Point("mechanism", 0, d, K32, 4, 0.33, True, True))
    pts.append(Point("mechanism", 0, DUALDECODER_CPU_GATHER, K32, 2, 0.33, True, False))
    pts.append(Point(REUSE, 0, SHADOWKV, K32, 4, 0.25, True, True))
    return pts


def reuse_points():
    """The reuse-fetch record's points: ShadowKV (its fetch, values only), every batch of REUSE_BATCHES
    at its context, each forced miss rate of REUSE_MISS; graph, with transfers (a fetch alone)."""
    return [Point(REUSE, 0, SHADOWKV, c, B, m, True, True) for c, bs in REUSE_BATCHES for B in bs for m in REUSE_MISS]


def _mechanism_points(reps):
    pts = []
    for r in range(reps):
        for B, m in MECH_POINTS:
            for d in (DUALDECODER, DUALDECODER_FIFO):
                pts.append(Point("mechanism", r, d, K128, B, m, True, True))
            pts.append(Point("mechanism", r, DUALDECODER, K128, B, m, False, True))
        pts.append(Point("mechanism", r, DUALDECODER_TWO_PASS, K128, 16, 0.33, True, True))
        pts.append(Point("mechanism", r, DUALDECODER_TWO_PASS, K128, 16, 0.33, False, True))
        pts.append(Point("mechanism", r, DUALDECODER_PER_LAYER, K128, 16, 0.33, True, True))
        pts.append(Point("mechanism", r, DUALDECODER_CPU_GATHER, K128, 16, 0.33, True, False))
        pts.append(Point("mechanism", r, DUALDECODER, K128, 16, 0.33, True, False))
    return pts


def _validation_points():
    pts = []
    for c in (K32, K128):
        for B in VAL_BATCHES:
            for d in (DUALDECODER, SHADOWKV, SPECACHE):
                pts.append(Point("validation", 0, d, c, B, VAL_MISS, True, True))
                pts.append(Point("validation", 0, d, c, B, VAL_MISS, False, True))   # its compute-only twin
        for B in ((2, 8) if c == K32 else ()):   # full-kv at 128K: calibrated at batch 1 only (16 is oom)
            pts.append(Point("validation", 0, FULL_KV, c, B, None, True, True))
    for B in VAL_BATCHES:
        pts.append(Point("validation", 0, DUALDECODER_FIFO, K128, B, VAL_MISS, True, True))
    for x in (True, False):
        pts.append(Point("validation", 0, DUALDECODER, K128, 8, 0.1, x, True))
    return pts


# ------------------------------------------------------------------ the journal

def link_share(r, cg):
    """Link share of a measured row, against the run's pinned copy rate `cg` (GB/s)."""
    if r.get("step_ms"):
        r["floor_link_ms"] = r["link_mib"] * 2**20 / (cg * 1e9) * 1e3
        r["link_util"] = r["link_gbps"] / cg


class Journal:
    """The rows of one run as they come: `rows` (what engine.csv gets), rows.jsonl (each row with its key,
    and the paper phase's done markers: --resume and `rebuild` read it) and current.json (the key of the
    point running: a process killed outright leaves it for --resume). Every journalled row carries the
    run's source hash and, where measured, its link share against the run's copy rate `cg`."""

    def __init__(self, out, source_hash, cg):
        self.jl, self.cur = os.path.join(out, "rows.jsonl"), os.path.join(out, "current.json")
        self.src, self.cg = source_hash, cg
        self.rows, self.done = [], {}

    def current(self, key):
        with open(self.cur, "w", encoding="utf-8") as fh:
            json.dump(dict(key=key), fh)

    def record(self, key, row):
        """rows.jsonl gets the row under `key` (row None: the key alone, a done marker)."""
        if row is not None:
            row.setdefault("source_hash", self.src)
            link_share(row, self.cg)
        self._append(dict(key=key) if row is None else dict(key=key, row=row))

    def add(self, key, row):
        self.record(key, row)
        self.rows.append(row)

    def _append(self, obj):
        with open(self.jl, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(obj) + "\n")

    def load(self, resume, paper_miss):
        """--resume: self.done = rows.jsonl's entries by key, and the point that was running when the last
        process died (current.json) a `crashed` row (a paper design's search is not retried: its crash is
        its result). Without --resume an earlier rows.jsonl is removed."""
        if not os.path.exists(self.jl):
            return
        if not resume:
            os.remove(self.jl)
            return
        with open(self.jl, encoding="utf-8") as fh:
            for line in fh:
                r = json.loads(line)
                self.done[r["key"]] = r
        if not os.path.exists(self.cur):
            return
        with open(self.cur, encoding="utf-8") as fh:
            k = json.load(fh)["key"]
        if k in self.done:
            return
        kk = json.loads(k)
        if kk[0] == PAPER:
            _, m0, cap0, c0, d0, b0 = kk
            row = dict(phase=PAPER, model=m0, gpu_mem_cap=cap0, design=d0, context=c0, batch=b0, miss_rate=paper_miss,
                       transfers=1, graph=1, urgent_programs=64, status="crashed")
            dk = paper_phase.paper_key(m0, cap0, c0, d0)
            self.done[k], self.done[dk] = dict(key=k, row=row), dict(key=dk)
            self._append(self.done[k])
            self._append(self.done[dk])
        else:
            ph, rep, d0, c0, b0, m0, x0, g0 = kk[:8]
            self.done[k] = dict(key=k, row=dict(phase=ph, rep=rep, design=d0, context=c0, batch=b0, miss_rate=m0,
                                                transfers=int(x0), graph=int(g0), status="crashed"))
            self._append(self.done[k])

    def finish(self):
        """The run completed: no point is running."""
        if os.path.exists(self.cur):
            os.remove(self.cur)


# ------------------------------------------------------------------ running them

def _log(text):
    print(text, flush=True)


def run_points(a, phases, model, weights, flat, hbm, mem, journal, t_start, gpu_state):
    """The plan_points phases (floor, mechanism, validation, reuse-fetch): one row each into the journal.
    A point that raises is a row (`oom` where its exception's chain is out of memory, else `error`) and
    the sweep goes on; once the GPU state is unusable (capture.gpu_health) the remaining points are
    `error`, not run. `a`: the sweep's checked options (kernels/engine/options.py)."""
    for p in plan_points(a.quick, a.reps, phases):
        key = json.dumps(list(p) + ([] if model.name == DEFAULT_MODEL else [model.name]))
        if key in journal.done:
            journal.rows.append(journal.done[key]["row"])
            continue
        base = dict(phase=p.phase, model=model.name, rep=p.rep, design=p.design, context=p.context, batch=p.batch,
                    miss_rate="none" if p.miss is None else p.miss, transfers=int(p.transfers), graph=int(p.graph))
        if p.phase != REUSE:
            base["urgent_programs"] = 64
        if time.perf_counter() - t_start > a.budget_s:
            journal.rows.append(dict(base, status="skipped-time"))
            continue
        if gpu_state["poisoned"]:
            journal.add(key, dict(base, status="error",
                                  error=f"not run: the GPU state is unusable after {gpu_state['poisoned']}"))
            continue
        journal.current(key)
        r = _measure_point(a, p, model, weights, flat, hbm, mem, gpu_state)
        r = {**base, **r}
        r["phase"], r["rep"] = p.phase, p.rep
        journal.add(key, r)


def _measure_point(a, p, model, weights, flat, hbm, mem, gpu_state):
    """One planned point's row: measured, or the failure it raised (the GPU state checked after it)."""
    from ddbench.kernels.engine import capture as cap_mod
    failure = None
    try:
        if p.phase == REUSE:
            r = pt.reuse_fetch_point(model, flat, p.context, p.batch, p.miss, reps=a.replays, seed=a.seed, log=_log)
        else:
            setup = pt.PointSetup(model, weights, flat, hbm, mem["limit"], mem["mem_gpu"], mem["overhead"], _log)
            r = pt.run_point(setup, p.design, p.context, p.batch,
                             pt.PointTiming(p.miss, p.transfers, p.graph, a.replays, seed=a.seed))
    except Exception as exc:  # noqa: BLE001 - reported in the row and the log; the sweep goes on
        import traceback
        _log(f"  {p.design} ctx={p.context} B={p.batch}: ERROR\n" + traceback.format_exc(limit=8))
        failure = cap_mod.classify(exc)
    if failure is not None:                   # out of the except block: the point's engine is gone
        r = dict(status=failure[0], error=failure[1])
    if r.get("status") != "ok":
        pt.check_gpu_state(r, failure is not None and failure[2], gpu_state,
                                    f"{p.phase} {p.design} {p.context // 1024}K B={p.batch}",
                                    log=lambda t: _log("[engine] " + t))
    return r


def run_paper_points(a, model, box, flat, hbm, mem, journal, t_start, gpu_state):
    """The paper phase's --paper-points in order, into the journal: each model's weights built where the
    model changes, after every reference to the last model's (weights, engines, graphs) is dropped and
    the cache released (`box`: [the weights of `model` or None], emptied here: the caller keeps no
    reference). A model whose weights fail (out of memory included), or a search that raises, is rows
    (`oom` / `error`) and the next point runs; once the GPU state is unusable every later point is
    `error`, not run. Returns the weights of `model` if they are the ones held last."""
    weights = box.pop() if box else None
    held = (model, weights) if weights is not None else (None, None)
    weights = None
    for pm, ctx, fixed in a.paper_points:    # in the order given: the budget cuts the tail
        if gpu_state["poisoned"]:
            _not_run(a, journal, pm, ctx, "error", f"not run: the GPU state is unusable after {gpu_state['poisoned']}")
            continue
        if held[0] is not pm:
            held = None                       # the last model's weights: their only reference
            held = _model_weights(a, journal, pm, ctx, gpu_state)
            if held[0] is None:
                continue
        setup = pt.PointSetup(pm, held[1], flat, hbm, mem["limit"], mem["mem_gpu"], mem["overhead"], _log)
        _search_point(a, journal, setup, (ctx, fixed), t_start, gpu_state)
        setup = None                          # no reference to the weights beside `held`
    if held[0] is model:
        weights = held[1]
    held = None
    if a.resume:      # the searches of other models, caps and contexts in this folder stay in its files
        mine = {(r.get("model"), r.get("gpu_mem_cap"), r["context"], r["design"]) for r in journal.rows
                if r.get("phase") == PAPER}
        journal.rows += [e["row"] for k, e in journal.done.items() if e.get("row") and json.loads(k)[0] == PAPER
                         and tuple(json.loads(k)[1:5]) not in mine]
    return weights


def _not_run(a, journal, pm, ctx, status, error):
    """Rows for every label of a paper point that cannot run (status and error say why)."""
    labels = pt.design_labels(a.paper_designs, a.paper_cache_tokens, a.paper_kv_bits, a.paper_cache_bits)
    for r in paper_phase.not_run_rows(pm.name, (ctx,), cap_label=a.cap_label,
                                      cap_gib=None if a.cap is None else a.cap / pt.GIB, miss_rate=a.paper_miss,
                                      status=status, error=error, designs=labels):
        journal.add(paper_phase.paper_key(pm.name, a.cap_label, ctx, r["design"], r["batch"]), r)


def _model_weights(a, journal, pm, ctx, gpu_state):
    """(pm, its random weights), or (None, None) with the point's rows where they fail."""
    from ddbench.kernels.engine import capture as cap_mod
    from ddbench.kernels.engine.model import Weights
    cap_mod.release()
    failure = None
    try:
        return pm, Weights.random(pm, "cuda", seed=a.seed)
    except Exception as exc:  # noqa: BLE001 - the model's points are rows; the next point runs
        import traceback
        _log(f"  [paper] the weights of {pm.name} failed:\n" + traceback.format_exc(limit=6))
        failure = cap_mod.classify(exc)
    row = dict(error=f"the weights of {pm.name} failed: {failure[1]}")     # out of the except block
    pt.check_gpu_state(row, failure[2], gpu_state, f"the weights of {pm.name}")
    _not_run(a, journal, pm, ctx, failure[0], row["error"])
    return None, None


def _search_point(a, journal, setup, point, t_start, gpu_state):
    """One MODEL:CONTEXT[:BATCH] point of the paper phase (point: (context, fixed batch or None)): every
    label searched (paper.run_paper) on `setup` (points.PointSetup: the model, its weights, the host buffer)."""
    from ddbench.kernels.engine import capture as cap_mod
    pm, (ctx, fixed) = setup.model, point
    search = paper_phase.PaperSearch(
        cap=a.cap, cap_label=a.cap_label, miss_rate=a.paper_miss, deadline=t_start + a.budget_s, reps=a.reps,
        max_batch=a.paper_max_batch, fixed_batch=fixed, repeats=a.repeats, designs=a.paper_designs,
        cache_tokens=a.paper_cache_tokens, cache_rates=a.paper_cache_rates, kv_bits=a.paper_kv_bits,
        cache_bits=a.paper_cache_bits, seed=a.seed)
    failure = None
    try:
        journal.rows.extend(paper_phase.run_paper(
            setup, (ctx,), search, paper_phase.PaperJournal(journal.done, journal.record, journal.current),
            gpu_state=gpu_state, health=cap_mod.gpu_health, run_point=pt.run_point))
    except Exception as exc:  # noqa: BLE001 - run_paper makes rows of its failures; this is a last guard
        import traceback
        _log(f"  [paper] {pm.name} {ctx // 1024}K failed:\n" + traceback.format_exc(limit=8))
        failure = cap_mod.classify(exc)
    if failure is not None:
        cap_mod.release()
        _not_run(a, journal, pm, ctx, "error", f"the paper phase failed at {pm.name} {ctx // 1024}K: {failure[1]}")

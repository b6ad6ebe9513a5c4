"""Validate the simulator against the decode-step engine measured on the H200.

    python -m sim.validate [--engine traces/engine/h200] [--out traces/validation/h200-engine.csv]

Every engine point of `engine.csv` (kernels/engine/bench.py) is replayed in the simulator's per-layer
timeline mode (sim/timeline.py) with the same design (by its registry switches), model
(llama-3-8b), GPU (h200, its own calibration bundle), link (pcie5), context, batch and miss rate.

- Miss rate: the engine forces round(rate * k) of the k = budget / chunk predicted chunks of every
  (request, head) to miss, so the replay uses that effective rate on every layer (hit = 1 - it);
  then the planned link bytes are the engine's to the byte.
- `transfers = 0` rows (compute only, no host reads) are replayed with the plan's link work removed.
- Rows whose miss rate is `none` ran the model's own prediction with random weights: its miss rate
  is unknown, so offloading designs' rows are skipped. Designs that keep the KV cache on the GPU
  (full-kv) move nothing and predict nothing; their `none` rows are replayed.
- Rows that did not complete (`status` other than ok, e.g. oom) are skipped.

The engine's steps are CUDA-graph replays, so the GPU, not the host, sets their pace; eager steps
(ablations the engine cannot capture) are skipped. The simulator's compute per layer comes from the
calibration bundle's engine section (compute-only graph steps of the same sweep's floor phase,
piecewise linear in the batch); no replayed point is one of those. Regime of each point:
  compute-only   the engine ran without host reads (transfers = 0)
  link-bound     engine link bytes per step / engine step >= LINK_BOUND x the thin-gather rate
                 measured in the same engine run (meta.json)
  overlap        the rest: transfers overlap compute and neither saturates
Writes the per-point CSV and `<out stem>-summary.json` (median and worst error in the link-bound
regime, bytes agreement). Imports no torch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import replace

from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir
from ddbench.core.traces import load_engine

MODEL, GPU, LINK = "llama-3-8b", "h200", "pcie5"
ENGINE_REL = "traces/engine/h200"    # under the data root; named so in outputs
LINK_BOUND = 0.75      # share of the measured gather rate the engine's link must sustain
STEPS, WARMUP = 6, 2
MIB = 2 ** 20

def load_meta(engine_dir: str) -> dict:
    path = os.path.join(engine_dir, "meta.json")
    try:
        with open(path) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise DDBenchError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise DDBenchError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    for k in ("copy_h2d_gbps", "thin_gather_gbps"):
        if not isinstance(meta.get(k), (int, float)) or meta[k] <= 0:
            raise DDBenchError(f"{path}: {k} missing or not a positive number")
    return meta


def effective_miss(rate: float, budget: int, chunk: int) -> float:
    """The engine's forced miss rate: round(rate * k) of k = budget / chunk chunks per (request, head)."""
    k = budget // chunk
    return round(rate * k) / k


def replay_plan(design: str, context: int, batch: int, miss: float, transfers: bool, cm=None):
    """The simulator's plan of one engine point."""
    from ddbench.core.catalog import get_model
    from ddbench.core.memory import Workload
    from ddbench.core.systems import get_system
    from sim.plan import step_plan
    from sim.setup import cost_model
    m = get_model(MODEL)
    cm = cm or cost_model(MODEL, GPU, LINK)
    hit = [1.0 - miss] * m.num_layers
    plan = step_plan(get_system(design), m, cm, Workload(context=context, batch=batch), batch, context, hit, hit)
    if not transfers and plan.rates is not None:   # compute only: no host reads, nothing on the link
        z = [0.0] * m.num_layers
        plan = replace(plan, pf_bytes=z, ur_bytes=z, d2h_bytes=z, pf_work=z, ur_work=z, d2h_work=z,
                       cpu_pf_work=z, cpu_ur_work=z, rates=None)
    return plan


COMPUTE_TWIN = {"dualdecoder-fifo": "dualdecoder", "dualdecoder-per-layer": "dualdecoder",
                "dualdecoder-cpu-gather": "dualdecoder"}


def classify(transfers: int, link_gbps: float, thin_gbps: float) -> str:
    if not transfers:
        return "compute-only"
    if link_gbps >= LINK_BOUND * thin_gbps:
        return "link-bound"
    return "overlap"


def scale_compute(plan, f: float):
    """The plan with every GPU compute term scaled by f (link work untouched)."""
    return replace(plan, pre=[x * f for x in plan.pre], mid=[x * f for x in plan.mid], att=[x * f for x in plan.att],
                   post=[x * f for x in plan.post], lm_s=plan.lm_s * f)


def validate(engine_dir: str | None = None):
    """(table of replayed points, list of (row, reason) skipped, meta, cost-model notes).

    The simulator's compute of a point is the engine section of the calibration bundle (the
    engine's compute-only CUDA-graph steps of the sweep's `floor` phase, batch 1/16/64 at 32K and
    128K), interpolated in the batch; the link is the simulator's own (the bundle's link and
    interference sections). Every point replayed here is one that calibration did not use: full
    steps with transfers, and compute-only steps at batches 2 and 4."""
    import pandas as pd
    from ddbench.core.memory import Workload
    engine_dir = engine_dir or str(traces_dir("engine", GPU))
    from sim.setup import cost_model
    from sim.timeline import run_timeline
    df = load_engine(os.path.join(engine_dir, "engine.csv"))
    meta = load_meta(engine_dir)
    thin = float(meta["thin_gather_gbps"])
    cm = cost_model(MODEL, GPU, LINK)
    if not getattr(cm, "engine_tab", None):
        raise DDBenchError("the calibration bundle has no engine section: run `ddbench calibrate --sections engine`"
                           " after `ddbench bench engine`")
    w0 = Workload(context=1)
    rows, skipped = [], []
    for r in df.itertuples():
        label = f"{r.design} {r.context // 1024}K b{r.batch} miss {r.miss_rate} transfers {r.transfers}"
        phase = getattr(r, "phase", "")
        if r.status != "ok":
            skipped.append((label, f"status {r.status}"))
            continue
        if phase == "floor":
            continue                      # the calibration itself (the bundle's engine section)
        if not int(getattr(r, "graph", 1)):
            skipped.append((label, "eager step (the host launches inside the step; the simulator has GPU time only)"))
            continue
        key = COMPUTE_TWIN.get(r.design, r.design)
        eng_s = cm.engine_step_s(key, int(r.batch), int(r.context))
        if eng_s is None:
            skipped.append((label, f"no engine calibration for {key} at this context and batch"))
            continue
        rate = 0.0 if r.miss_rate == "none" else float(r.miss_rate)
        miss = effective_miss(rate, w0.budget, w0.chunk)
        plan = replay_plan(r.design, r.context, r.batch, miss, bool(r.transfers), cm)
        f = eng_s / plan.compute_s
        plan = scale_compute(plan, f)
        tl = run_timeline(plan, steps=STEPS, warmup=WARMUP)
        sim_ms = tl.steady_step_s * 1e3
        sim_bytes = plan.h2d_bytes
        eng_bytes = r.link_mib * MIB
        regime = classify(int(r.transfers), r.link_gbps, thin)
        rows.append(dict(
            phase=phase, rep=getattr(r, "rep", 0), design=r.design, context=r.context, batch=r.batch,
            miss_rate=r.miss_rate, miss_replayed=miss, transfers=r.transfers, urgent_programs=r.urgent_programs,
            regime=regime, engine_step_ms=r.step_ms, sim_step_ms=sim_ms, sim_over_engine=sim_ms / r.step_ms,
            sim_gpu_compute_ms=plan.compute_s * 1e3, compute_scale=f,
            sim_stall_ms=statistics.fmean(tl.stall_s[tl.warmup:]) * 1e3, engine_exposed_ms=r.exposed_ms,
            engine_link_bytes=eng_bytes, sim_link_bytes=sim_bytes, link_bytes_diff=sim_bytes - eng_bytes,
            engine_link_gbps=r.link_gbps, sim_link_gbps=sim_bytes / (sim_ms * 1e-3) / 1e9 if sim_ms else 0.0,
            sim_link_util=tl.link_util, note=""))
    return pd.DataFrame(rows), skipped, meta, list(cm.notes)


def fifo_pairs(t) -> list[dict]:
    """FIFO / priority step ratios, engine (median, min, max over repetitions) and simulator."""
    out = []
    key = ["context", "batch", "miss_rate", "transfers", "phase", "rep"]
    t = t[t.transfers == 1]
    p = t[t.design == "dualdecoder"].set_index(key)
    f = t[t.design == "dualdecoder-fifo"].set_index(key)
    groups: dict = {}
    for k in p.index.intersection(f.index):
        groups.setdefault(k[:3], []).append((float(f.engine_step_ms[k] / p.engine_step_ms[k]),
                                             float(f.sim_step_ms[k] / p.sim_step_ms[k])))
    for k, v in sorted(groups.items()):
        eng = sorted(x for x, _ in v)
        out.append(dict(context=int(k[0]), batch=int(k[1]), miss_rate=k[2], reps=len(v),
                        engine=statistics.median(eng), engine_min=eng[0], engine_max=eng[-1],
                        sim=statistics.median(y for _, y in v)))
    return out


def _errors(sub) -> dict:
    if not len(sub):
        return {"points": 0}
    err = (sub.sim_over_engine - 1.0).abs()
    worst = sub.loc[err.idxmax()]
    return {"points": int(len(sub)), "median_abs_error": float(err.median()), "worst_abs_error": float(err.max()),
            "median_sim_over_engine": float(sub.sim_over_engine.median()),
            "worst_point": f"{worst.design} {worst.context // 1024}K b{worst.batch} miss {worst.miss_rate}"
                           f" transfers {worst.transfers}: engine {worst.engine_step_ms:.2f} ms,"
                           f" sim {worst.sim_step_ms:.2f} ms"}


def summarize(t, skipped, meta) -> dict:
    off = t[t.transfers == 1]
    exact = int((off.link_bytes_diff == 0).sum())
    regimes = {k: _errors(t[t.regime == k]) for k in ("link-bound", "overlap", "compute-only")}
    lb = t[t.regime == "link-bound"]
    if len(lb):
        regimes["link-bound"]["median_link_gbps_engine"] = float(lb.engine_link_gbps.median())
        regimes["link-bound"]["median_link_gbps_sim"] = float(lb.sim_link_gbps.median())
    return {
        "points": int(len(t)), "skipped": [f"{a}: {b}" for a, b in skipped],
        "calibration": "compute: the bundle's engine section (the sweep's floor phase, compute-only CUDA-graph"
                       " steps at batch 1/16/64, 32K and 128K), piecewise linear in the batch; link: the"
                       " bundle's link and interference sections. No replayed point is a calibration point.",
        "rule": f"link-bound: engine link GB/s >= {LINK_BOUND} x the thin-gather rate of the same run"
                f" ({meta['thin_gather_gbps']:.1f} GB/s); compute-only: no transfers; overlap: the rest",
        "regimes": regimes,
        "link_bytes": {"points_with_transfers": int(len(off)), "exact": exact,
                       "max_abs_diff_bytes": float(off.link_bytes_diff.abs().max()) if len(off) else 0.0},
        "fifo_over_priority": fifo_pairs(t),
    }


def write(t, summary, notes, out: str) -> str:
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"# sim vs engine: {MODEL} on {GPU} + {LINK}, timeline mode {STEPS} steps ({WARMUP} warm-up)\n")
        for n in notes:
            f.write(f"# cost model: {n}\n")
        f.write(f"# regime rule: {summary['rule']}\n")
        t.to_csv(f, index=False, float_format="%.6g")
    os.replace(tmp, out)
    js = os.path.splitext(out)[0] + "-summary.json"
    with open(js + ".tmp", "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    os.replace(js + ".tmp", js)
    return js


def report(summary: dict) -> str:
    lines = [f"{summary['points']} engine points replayed (none used for calibration)"]
    for s in summary["skipped"]:
        lines.append(f"  skipped {s}")
    for k, v in summary["regimes"].items():
        if v["points"]:
            lines.append(f"{k} ({v['points']} points): median |error| {v['median_abs_error']:.1%}, worst"
                         f" {v['worst_abs_error']:.1%} ({v['worst_point']}); sim / engine median"
                         f" {v['median_sim_over_engine']:.3f}")
    b = summary["link_bytes"]
    lines.append(f"link bytes per step: {b['exact']} of {b['points_with_transfers']} points with transfers equal"
                 f" to the byte (largest difference {b['max_abs_diff_bytes']:.0f} B)")
    for p in summary["fifo_over_priority"]:
        lines.append(f"FIFO / priority {p['context'] // 1024}K b{p['batch']} miss {p['miss_rate']} ({p['reps']} reps):"
                     f" engine {p['engine']:.3f} ({p['engine_min']:.3f}-{p['engine_max']:.3f}), sim {p['sim']:.3f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.validate", description=__doc__.splitlines()[0])
    ap.add_argument("--engine", help="engine trace folder (engine.csv, meta.json; default the data root's engine/h200)")
    ap.add_argument("--out", help="output CSV (default the data root's validation/h200-engine.csv)")
    a = ap.parse_args(argv)
    a.out = a.out or str(traces_dir("validation", "h200-engine.csv"))
    try:
        t, skipped, meta, notes = validate(a.engine)
    except DDBenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary = summarize(t, skipped, meta)
    js = write(t, summary, notes, a.out)
    print(report(summary))
    print(f"wrote {a.out} and {js}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

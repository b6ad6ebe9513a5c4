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

The simulator models GPU time only; this engine launches its kernels from Python (about 2.3 ms of
host time per layer), so it is compared where the GPU, not the host, sets the pace. Regime of each
point, by this rule (engine quantities, and the simulator's GPU work for the compute test):
  link-bound     engine link bytes per step / engine step >= LINK_BOUND x the thin-gather rate
                 measured in the same engine run (meta.json)
  compute-bound  otherwise, if the simulator's GPU compute of the step (plan.compute_s) is at least
                 COMPUTE_BOUND x the engine step
  launch-bound   otherwise: the engine step is more than 1 / COMPUTE_BOUND times the GPU work;
                 host-side launch overhead sets it
Writes the per-point CSV and `<out stem>-summary.json` (median and worst error in the link-bound
regime, bytes agreement). Imports no torch.
"""

from __future__ import annotations

import argparse
import json
import math
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
COMPUTE_BOUND = 0.5    # share of the engine step the simulated GPU work must reach
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


def classify(link_gbps: float, thin_gbps: float, gpu_ms: float, engine_ms: float) -> str:
    if link_gbps >= LINK_BOUND * thin_gbps:
        return "link-bound"
    if gpu_ms >= COMPUTE_BOUND * engine_ms:
        return "compute-bound"
    return "launch-bound"


def validate(engine_dir: str | None = None):
    """(table of replayed points, list of (row, reason) skipped, meta, cost-model notes)."""
    import pandas as pd
    from ddbench.core.memory import Workload
    engine_dir = engine_dir or str(traces_dir("engine", GPU))
    from ddbench.core.systems import get_system
    from sim.setup import cost_model
    from sim.timeline import run_timeline
    df = load_engine(os.path.join(engine_dir, "engine.csv"))
    meta = load_meta(engine_dir)
    thin = float(meta["thin_gather_gbps"])
    cm = cost_model(MODEL, GPU, LINK)
    w0 = Workload(context=1)
    rows, skipped = [], []
    for r in df.itertuples():
        label = f"{r.design} {r.context // 1024}K b{r.batch} miss {r.miss_rate} transfers {r.transfers}"
        if r.status != "ok":
            skipped.append((label, f"status {r.status}"))
            continue
        sysx = get_system(r.design)
        offloads = not sysx.kv_on_gpu and sysx.fetch != "none"
        if r.miss_rate == "none" and offloads and r.transfers:
            skipped.append((label, "miss rate 'none': the model's own prediction with random weights, unknown"))
            continue
        rate = 0.0 if r.miss_rate == "none" else float(r.miss_rate)
        miss = effective_miss(rate, w0.budget, w0.chunk)
        plan = replay_plan(r.design, r.context, r.batch, miss, bool(r.transfers), cm)
        tl = run_timeline(plan, steps=STEPS, warmup=WARMUP)
        sim_ms = tl.steady_step_s * 1e3
        sim_bytes = plan.h2d_bytes
        eng_bytes = r.link_mib * MIB
        gpu_ms = plan.compute_s * 1e3
        regime = classify(r.link_gbps, thin, gpu_ms, r.step_ms)
        notes = []
        if r.urgent_programs != 64:
            notes.append(f"urgent gather with {r.urgent_programs} programs (engine default 64): the simulator has no"
                         " program count; same replay as 64")
        if not offloads and r.miss_rate == "none":
            notes.append("KV on the GPU: no prediction, no transfers")
        rows.append(dict(
            design=r.design, context=r.context, batch=r.batch, miss_rate=r.miss_rate, miss_replayed=miss,
            transfers=r.transfers, urgent_programs=r.urgent_programs, regime=regime,
            engine_step_ms=r.step_ms, sim_step_ms=sim_ms, sim_over_engine=sim_ms / r.step_ms,
            sim_gpu_compute_ms=gpu_ms, sim_stall_ms=statistics.fmean(tl.stall_s[tl.warmup:]) * 1e3,
            engine_exposed_ms=r.exposed_ms,
            engine_link_bytes=eng_bytes, sim_link_bytes=sim_bytes, link_bytes_diff=sim_bytes - eng_bytes,
            engine_link_gbps=r.link_gbps, sim_link_gbps=sim_bytes / (sim_ms * 1e-3) / 1e9 if sim_ms else 0.0,
            sim_link_util=tl.link_util, note="; ".join(notes)))
    return pd.DataFrame(rows), skipped, meta, list(cm.notes)


def fifo_pairs(t) -> list[dict]:
    """FIFO / priority step ratios, engine and simulator, at every point measured in both orders."""
    out = []
    key = ["context", "batch", "miss_rate", "transfers", "urgent_programs"]
    p = t[t.design == "dualdecoder"].set_index(key)
    f = t[t.design == "dualdecoder-fifo"].set_index(key)
    for k in p.index.intersection(f.index):
        out.append(dict(context=int(k[0]), batch=int(k[1]), miss_rate=k[2],
                        engine=float(f.engine_step_ms[k] / p.engine_step_ms[k]),
                        sim=float(f.sim_step_ms[k] / p.sim_step_ms[k])))
    return out


def summarize(t, skipped, meta) -> dict:
    lb = t[(t.regime == "link-bound") & (t.note == "")]
    err = (lb.sim_over_engine - 1.0).abs()
    worst = lb.loc[err.idxmax()] if len(lb) else None
    off = t[t.transfers == 1]
    exact = int((off.link_bytes_diff == 0).sum())
    return {
        "points": int(len(t)), "skipped": [f"{a}: {b}" for a, b in skipped],
        "regimes": {k: int(v) for k, v in t.regime.value_counts().items()},
        "rule": f"link-bound: engine link GB/s >= {LINK_BOUND} x the thin-gather rate of the same run"
                f" ({meta['thin_gather_gbps']:.1f} GB/s); compute-bound: else simulated GPU compute >="
                f" {COMPUTE_BOUND} x engine step; launch-bound: else",
        "link_bound": {
            "points": int(len(lb)),
            "median_abs_error": float(err.median()) if len(lb) else None,
            "median_sim_over_engine": float(lb.sim_over_engine.median()) if len(lb) else None,
            "worst_abs_error": float(err.max()) if len(lb) else None,
            "worst_point": (f"{worst.design} {worst.context // 1024}K b{worst.batch} miss {worst.miss_rate}:"
                            f" engine {worst.engine_step_ms:.1f} ms, sim {worst.sim_step_ms:.1f} ms")
            if worst is not None else None,
            "median_link_gbps_engine": float(lb.engine_link_gbps.median()) if len(lb) else None,
            "median_link_gbps_sim": float(lb.sim_link_gbps.median()) if len(lb) else None,
        },
        "launch_bound_median_sim_over_engine": float(t[t.regime == "launch-bound"].sim_over_engine.median())
        if (t.regime == "launch-bound").any() else None,
        "link_bytes": {"points_with_transfers": int(len(off)), "exact": exact,
                       "max_abs_diff_bytes": float(off.link_bytes_diff.abs().max()) if len(off) else 0.0},
        "fifo_over_priority": fifo_pairs(t),
        "excluded_from_error": [f"{r.design} {r.context // 1024}K b{r.batch}: {r.note}"
                                for r in t[(t.regime == "link-bound") & (t.note != "")].itertuples()],
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
    lb = summary["link_bound"]
    lines = [f"{summary['points']} engine points replayed; regimes: "
             + ", ".join(f"{k} {v}" for k, v in sorted(summary["regimes"].items()))]
    for s in summary["skipped"]:
        lines.append(f"  skipped {s}")
    if lb["points"]:
        lines.append(f"link-bound ({lb['points']} points): sim / engine median {lb['median_sim_over_engine']:.3f},"
                     f" median |error| {lb['median_abs_error']:.1%}, worst {lb['worst_abs_error']:.1%}"
                     f" ({lb['worst_point']}); link GB/s median engine {lb['median_link_gbps_engine']:.1f},"
                     f" sim {lb['median_link_gbps_sim']:.1f}")
    for s in summary["excluded_from_error"]:
        lines.append(f"  not in the error: {s}")
    if summary["launch_bound_median_sim_over_engine"] is not None:
        lines.append(f"launch-bound: sim / engine median {summary['launch_bound_median_sim_over_engine']:.2f}"
                     " (the simulator has GPU time only)")
    b = summary["link_bytes"]
    lines.append(f"link bytes per step: {b['exact']} of {b['points_with_transfers']} points with transfers equal"
                 f" to the byte (largest difference {b['max_abs_diff_bytes']:.0f} B)")
    for p in summary["fifo_over_priority"]:
        lines.append(f"FIFO / priority {p['context'] // 1024}K b{p['batch']} miss {p['miss_rate']}:"
                     f" engine {p['engine']:.3f}, sim {p['sim']:.3f}")
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

"""Where a compute-only engine step goes, kernel by kernel, against its floor (H200).

    PYTHONPATH=. python -m ddbench.kernels.engine.breakdown [--out DIR] [--points 32768:1,131072:16]

For each design (dualdecoder, its single-token step, shadowkv, specache, full-kv) at each point
(context:batch, compute only, the model's own selection, CUDA graph): the step as timed by
kernels/engine/sweep.run_point (median of graph replays), then one replay profiled with
torch.profiler. Kernels are put into categories by name (GEMM, selection, attention, misses,
key rebuild, on-GPU gathers, glue); per category the summed kernel time and the kernel count per step; `busy_ms`
is the union of all kernel intervals (overlapping streams counted once) and `idle_ms` the step
minus it: the time the GPU ran no kernel inside the step (graph node launch gaps, dependencies).
The floor is the sweep's (weights + resident selection state + attended K/V at the HBM copy rate of
the same run); `weights_floor_ms` is the weights' share of it, against which the GEMMs are set.

Writes <out>/breakdown.json (default: the data root's engine/<gpu>/) with provenance.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

import torch

from ddbench.core.designs import DUALDECODER, FULL_KV, SHADOWKV, SPECACHE
from ddbench.core.enginepoint import EnginePoint
from ddbench.core.flags import OneLineParser

CATEGORIES = (   # first match wins; names of the kernels in one replay
    ("gemm", ("nvjet", "gemm", "cutlass", "splitkreduce", "sm90_xmma", "cublas")),
    ("selection", ("score_pass", "norm_topk", "spec_pass", "_topk", "_spec", "_codes_kernel")),
    ("attention", ("_attn", "_combine")),
    ("misses", ("_plan", "_perturb")),
    ("rebuild", ("rebuild",)),
    ("gather", ("gather",)),
)
DESIGNS = (DUALDECODER, EnginePoint.named(DUALDECODER, single=True).design, SHADOWKV, SPECACHE, FULL_KV)


def category(name: str) -> str:
    n = name.lower()
    for cat, keys in CATEGORIES:
        if any(k in n for k in keys):
            return cat
    return "glue"


def union_ms(intervals: list[tuple[float, float]]) -> float:
    """Total length (ms) of the union of [start, end) intervals given in microseconds."""
    tot, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        tot += b - max(a, end)
        end = b
    return tot / 1e3


def profile_replay(e, steps: int) -> list[dict]:
    """Kernel events (name, start us, duration us, stream) of one graph replay of `steps` steps."""
    from ddbench.kernels.timing import kernel_events
    return kernel_events(e.replay)


def summarize(row: dict, events: list[dict], steps: int, hbm_gbps: float) -> dict:
    cats: dict[str, dict] = {}
    names: dict[str, float] = {}
    for ev in events:
        c = cats.setdefault(category(ev["name"]), dict(ms=0.0, kernels=0))
        c["ms"] += ev["dur"] / 1e3 / steps
        c["kernels"] += 1
        names[ev["name"][:60]] = names.get(ev["name"][:60], 0.0) + ev["dur"] / 1e3 / steps
    for c in cats.values():
        c["kernels"] = c["kernels"] / steps
    busy = union_ms([(ev["ts"], ev["ts"] + ev["dur"]) for ev in events]) / steps
    step = row["step_ms"]
    wfloor = row["weights_gib"] * 2 ** 30 / (hbm_gbps * 1e9) * 1e3
    gemm = cats.get("gemm", {}).get("ms", 0.0)
    return dict(design=row["design"], context=row["context"], batch=row["batch"], step_ms=step,
                floor_ms=row["floor_ms"], step_over_floor=row["step_over_floor"], weights_floor_ms=wfloor,
                gemm_over_weights_floor=gemm / wfloor if wfloor else None,
                kernels_per_step=len(events) / steps, busy_ms=busy, idle_ms=step - busy,
                categories={k: dict(ms=round(v["ms"], 4), kernels=v["kernels"]) for k, v in sorted(cats.items())},
                top_kernels_ms={n: round(t, 4) for n, t in sorted(names.items(), key=lambda x: -x[1])[:12]})


def main(argv=None) -> int:
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="output folder (default: the data root's engine/<gpu>/)")
    ap.add_argument("--points", default="32768:1,131072:16", help="context:batch list (compute only)")
    ap.add_argument("--replays", type=int, default=5)
    a = ap.parse_args(argv)
    from ddbench.core.catalog import get_model
    from ddbench.core.catalog.gpus import catalog_gpu_name
    from ddbench.core.errors import DDBenchError
    from ddbench.core.io import write_json
    from ddbench.core.paths import traces_dir
    try:
        pts = [tuple(int(v) for v in p.split(":")) for p in a.points.split(",")]
        if any(len(p) != 2 or min(p) < 1 for p in pts):
            raise ValueError
    except ValueError:
        print(f"error: --points {a.points!r}: expected CONTEXT:BATCH[,CONTEXT:BATCH...]", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: the breakdown needs a CUDA GPU; none is visible to torch", file=sys.stderr)
        return 2
    from ddbench.kernels.engine.points import PointSetup, PointTiming, hbm_gbps, run_point
    from ddbench.kernels.engine.model import Weights
    from ddbench.kernels.timing import provenance
    from ddbench.core.provenance import command_line
    prov = provenance(command_line("python -m ddbench.kernels.engine.breakdown", argv))     # local paths cut
    gpu = catalog_gpu_name(prov["gpu"], torch.cuda.get_device_properties(0).total_memory)
    out = a.out or os.path.join(str(traces_dir("engine")), gpu)
    os.makedirs(out, exist_ok=True)
    model = get_model("llama-3-8b")
    hbm = hbm_gbps()
    weights = Weights.random(model, "cuda", seed=0)
    rows = []
    for ctx, batch in pts:
        for d in DESIGNS:
            try:
                r = run_point(PointSetup(model, weights, hbm=hbm), d, ctx, batch,
                              PointTiming(miss_rate=None, transfers=False, reps=a.replays), keep=True)
            except DDBenchError as exc:
                print(f"  {d} {ctx}:{batch}: {exc}", flush=True)
                continue
            if not isinstance(r, tuple):
                print(f"  {d} {ctx}:{batch}: {r['status']}", flush=True)
                rows.append(dict(design=d, context=ctx, batch=batch, status=r["status"]))
                continue
            row, e = r
            s = summarize(row, profile_replay(e, e.graph_steps), e.graph_steps, hbm)
            rows.append(dict(s, status="ok"))
            cat = " ".join(f"{k}={v['ms']:.2f}/{v['kernels']:.0f}" for k, v in s["categories"].items())
            print(f"  {d:20s} {ctx:6d} B={batch:3d} step={s['step_ms']:.2f} floor={s['floor_ms']:.2f} "
                  f"x{s['step_over_floor']:.2f} gemm/wfloor={s['gemm_over_weights_floor']:.2f} "
                  f"kernels={s['kernels_per_step']:.0f} busy={s['busy_ms']:.2f} idle={s['idle_ms']:.2f} | {cat}",
                  flush=True)
            del e
            gc.collect()
            torch.cuda.empty_cache()
    write_json(os.path.join(out, "breakdown.json"), dict(provenance=prov, hbm_copy_gbps=hbm, points=rows,
                                                         note=__doc__.split("\n\n")[1].replace("\n", " ")))
    print(f"wrote {os.path.join(out, 'breakdown.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`ddbench sweep SPEC.yaml`: a grid of serving runs of the simulator.

The spec (YAML, validated; see ddbench/planner/spec.py and examples/) gives lists of models,
GPUs, links, hosts, designs, contexts, output lengths, budgets, knobs, hit rates, where prefill
runs, arrival rates and seeds; the sweep runs their product, one seeded serving run per point, on
local processes (default) or a Ray cluster (--executor ray [--address HOST:PORT]; without an
address a local Ray instance is started). Finished points are kept in OUT/points.jsonl as they
finish: rerun the same command to resume. Writes OUT/results.parquet and OUT/results.csv (one
tidy row per point, units in the column names), OUT/summary.png and OUT/spec.json.
"""

from __future__ import annotations

import argparse
import os
import time

from ddbench.core.errors import DDBenchError

EXAMPLE = """examples:
  ddbench sweep examples/fig13-load.yaml
  ddbench sweep examples/fig20-load.yaml --workers 2 --out sweep-out/fig20
  ddbench sweep examples/fig13-load.yaml --executor ray                      # a local Ray instance
  ddbench sweep big.yaml --executor ray --address 10.0.0.5:6379 --max-points 50000 --yes"""


def register(sub) -> None:
    p = sub.add_parser("sweep", help="grid of serving simulations from a YAML spec (local processes or Ray)",
                       description=__doc__, epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", help="sweep spec (YAML)")
    p.add_argument("--out", help="output folder (default sweep-out/<spec name or file stem>)")
    p.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="local process pool (default) or Ray")
    p.add_argument("--address", help="Ray cluster address HOST:PORT (with --executor ray; default: start a local"
                                     " Ray instance)")
    p.add_argument("--workers", type=int, help="local processes, or CPUs of the local Ray instance"
                                               " (default: the CPUs here)")
    p.add_argument("--max-points", type=int, default=2000,
                   help="refuse a grid larger than this unless --yes (default 2000)")
    p.add_argument("--yes", action="store_true", help="run a grid above --max-points")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args) -> int:
    from ddbench.planner.executors import check_ray_address, import_ray, run_tasks
    from ddbench.planner.spec import check_points, count_points, load_spec, point_key, points
    from ddbench.planner.sweeprun import Store, read_store, summary_plot, sweep_point, write_table

    # everything a user can get wrong is checked before anything is written
    spec = load_spec(args.spec)
    n = count_points(spec)
    if args.max_points < 1:
        raise DDBenchError(f"--max-points must be at least 1, got {args.max_points}")
    if n > args.max_points and not args.yes:
        raise DDBenchError(f"the grid has {n} points, above --max-points {args.max_points}; pass --yes to run it"
                           " (or raise --max-points)")
    if args.workers is not None and args.workers < 1:
        raise DDBenchError(f"--workers must be at least 1, got {args.workers}")
    if args.address is not None and args.executor != "ray":
        raise DDBenchError("--address is for --executor ray")
    check_points(spec, args.spec)
    if args.executor == "ray":
        import_ray()
        if args.address is not None:
            check_ray_address(args.address)
    name = spec.get("name") or os.path.splitext(os.path.basename(args.spec))[0]
    out = args.out or os.path.join("sweep-out", name)
    pts = points(spec)
    keys = [point_key(p) for p in pts]
    os.makedirs(out, exist_ok=True)
    from ddbench.core.io import write_json
    write_json(os.path.join(out, "spec.json"), spec)
    store_path = os.path.join(out, "points.jsonl")
    done = read_store(store_path)
    todo = [i for i, k in enumerate(keys) if k not in done]
    reused = n - len(todo)
    store = Store(store_path)
    t0 = time.perf_counter()
    rows: dict = {k: done[k] for k in keys if k in done}
    workers_seen = set()

    def keep(j, row):
        store.append(row)
        rows[row["key"]] = row
        workers_seen.add(row.get("worker_pid"))
    try:
        info = run_tasks(sweep_point, [pts[i] for i in todo], keep, executor=args.executor, workers=args.workers,
                  address=args.address, desc=f"sweep {name}", quiet=args.quiet)
    finally:
        store.close()
    wall = time.perf_counter() - t0 - info["startup_s"]
    ordered = [rows[k] for k in keys]
    write_table(ordered, out)
    summary_plot(ordered, spec, os.path.join(out, "summary.png"))
    ran = len(todo)
    cpu = sum(rows[keys[i]].get("sim_cpu_s") or 0.0 for i in todo)
    speed = f", {ran / wall:.1f} points/s, {cpu:.0f} CPU-s in the simulator" if ran and wall > 0 else ""
    print(f"sweep {name}: {n} points ({ran} run, {reused} reused from {store_path}) in {wall:.1f} s{speed}"
          f" on {args.executor} ({len(workers_seen - {None})} worker processes"
          + (f"; Ray startup {info['startup_s']:.1f} s not counted)" if info["startup_s"] else ")"))
    print(f"wrote {os.path.join(out, 'results.parquet')}, results.csv, summary.png")
    return 0

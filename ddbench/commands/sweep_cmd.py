"""`ddbench sweep SPEC.yaml`: a grid of serving runs of the simulator.

The spec (YAML, validated; see ddbench/planner/spec.py and examples/) gives lists of models,
GPUs, links, hosts, designs, contexts, output lengths, budgets, knobs, hit rates, where prefill
runs, arrival rates and seeds; the sweep runs their product, one seeded serving run per point, on
local processes (default) or a Ray cluster (--executor ray [--address HOST:PORT]; without an
address a local Ray instance is started). Finished points are kept in OUT/points.jsonl as they
finish: rerun the same command to resume. Writes OUT/results.parquet and OUT/results.csv (one
tidy row per point, units in the column names; a point where not one request fits, in GPU memory
or in host memory, is a row with status "does-not-fit"), OUT/summary.png, OUT/spec.json and
OUT/provenance.json (the command's arguments, version and git sha).

Host memory: the grid's host_mem_gb (GB for one GPU's requests; default: a host's memory / its GPUs,
and without a host no bound), or --host-mem GB for every point. Each row gives
host_bytes_per_request, max_batch_gpu, max_batch_host, bound_by and max_batch_fit (what admission
allows).
"""

from __future__ import annotations

import argparse
import os
import time

from ddbench.commands import wrap
from ddbench.core import defaults as D
from ddbench.core import flags
from ddbench.core.errors import DDBenchError

EXAMPLE = """examples:
  ddbench sweep examples/fig13-load.yaml
  ddbench sweep examples/fig20-load.yaml --workers 2 --out sweep-out/fig20
  ddbench sweep examples/fig20-load.yaml --host-mem 200 --out sweep-out/fig20-host200
  ddbench sweep examples/fig13-load.yaml --executor ray                      # a local Ray instance
  ddbench sweep big.yaml --executor ray --address 10.0.0.5:6379 --max-points 50000 --yes

exit status: 0 when the table is written, 2 for bad input (nothing runs), 3 when not one point fits
in GPU memory (the table is still written)."""

NO_FIT = 3


def register(sub) -> None:
    p = sub.add_parser("sweep", help="grid of serving simulations from a YAML spec (local processes or Ray)",
                       description=__doc__, epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", type=flags.text(), help="sweep spec (YAML)")
    p.add_argument("--out", type=flags.text(), help="output folder (default sweep-out/<spec name or file stem>)")
    p.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="local process pool (default) or Ray")
    p.add_argument("--address", type=flags.text(), help="Ray cluster address HOST:PORT (with --executor ray;"
                                                         " default: start a local Ray instance)")
    p.add_argument("--workers", type=flags.integer(lo=1, hi=4096), help="local processes, or CPUs of the local"
                                                                        " Ray instance (default: the CPUs here)")
    p.add_argument("--max-points", type=flags.integer(lo=1, hi=D.MAX_COUNT), default=D.MAX_POINTS,
                   help=f"refuse a grid larger than this unless --yes (default {D.MAX_POINTS})")
    p.add_argument("--yes", action="store_true", help="run a grid above --max-points")
    p.add_argument("--host-mem", metavar="GB", type=flags.number(lo=0, lo_open=True, hi=D.MAX_HOST_MEM_GB),
                   help="host memory for one GPU's requests, GB (1e9 bytes), at every point: replaces the spec's"
                        " grid.host_mem_gb")
    from ddbench.planner.scenario_args import add_rate_args
    add_rate_args(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--force", action="store_true",
                   help="write into an --out that holds files ddbench did not write (they are kept)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ddbench.planner.executors import check_ray_address, import_ray, run_tasks
    from ddbench.planner.spec import check_points, count_points, load_spec, point_key, points
    from ddbench.planner.sweeprun import Store, read_store, summary_plot, sweep_point, write_table

    # everything a user can get wrong is checked before anything is written
    spec = beside_spec(load_spec(args.spec), args.spec)
    _rates(spec, args)
    if args.host_mem is not None:
        spec["grid"]["host_mem_gb"] = [args.host_mem]
    n = count_points(spec)
    if n > args.max_points and not args.yes:
        raise DDBenchError(f"the grid has {n} points, above --max-points {args.max_points}; pass --yes to run it"
                           " (or raise --max-points)")
    if args.address is not None and args.executor != "ray":
        raise DDBenchError("--address is for --executor ray")
    check_points(spec, args.spec)
    if args.executor == "ray":
        import_ray()
        if args.address is not None:
            check_ray_address(args.address)
    name = spec.get("name") or os.path.splitext(os.path.basename(args.spec))[0]
    out = args.out if args.out is not None else os.path.join("sweep-out", name)
    pts = points(spec)
    keys = [point_key(p) for p in pts]
    from ddbench.core.outputs import output_folder
    from ddbench.core.provenance import provenance
    # the store of finished points is written in place as points finish (a rerun resumes from it);
    # everything else is staged and moves in at the end; the lock keeps a second sweep out
    with output_folder(out, command="ddbench sweep", force=args.force, own_ok=True, prune=False) as w:
        # refused now, before a point runs, where one cannot be written (another command's, a user's)
        w.claim(["spec.json", "provenance.json", "points.jsonl", "results.parquet", "results.csv", "summary.png"])
        w.write_json("spec.json", spec)
        w.write_json("provenance.json", provenance("sweep", args))
        store_path = w.live("points.jsonl")
        done = read_store(store_path, dict(zip(keys, pts)))
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
            info = run_tasks(sweep_point, [pts[i] for i in todo], keep, executor=args.executor,
                             workers=args.workers, address=args.address, desc=f"sweep {name}", quiet=args.quiet)
        finally:
            store.close()
        wall = time.perf_counter() - t0 - info["startup_s"]
        ordered = [rows[k] for k in keys]
        write_table(ordered, w)
        summary_plot(ordered, spec, w.stage_path("summary.png"))
    ran = len(todo)
    cpu = sum(rows[keys[i]].get("sim_cpu_s") or 0.0 for i in todo)
    speed = f", {ran / wall:.1f} points/s, {cpu:.0f} CPU-s in the simulator" if ran and wall > 0 else ""
    print("\n".join(wrap([
        f"sweep {name}: {n} points ({ran} run, {reused} reused from {store_path}) in {wall:.1f} s{speed}"
        f" on {args.executor} ({len(workers_seen - {None})} worker processes"
        + (f"; Ray startup {info['startup_s']:.1f} s not counted)" if info["startup_s"] else ")"),
        f"wrote {os.path.join(out, 'results.parquet')}, results.csv, summary.png"])))
    if not any(r.get("completed") for r in ordered):
        print(f"sweep {name}: not one point fits in GPU memory (every row's status is does-not-fit)")
        return NO_FIT
    return 0


def _rates(spec: dict, args) -> None:
    """The spec's `rates:` resolved beside it (never from the current folder), or --rates (which wins, from the
    current folder, as a command-line path); --rate appended to the spec's `rate:`; each checked now."""
    from ddbench.core.ratefile import load_source, parse_override, resolve_path
    if args.rates:
        spec["rates"] = resolve_path(args.rates, None, "--rates")
    elif spec.get("rates"):
        spec["rates"] = resolve_path(spec["rates"], os.path.dirname(os.path.abspath(args.spec)),
                                     f"sweep spec {args.spec}")
    if spec.get("rates"):                # the points' keys hash its content: an edited file is not resumed
        import hashlib
        src = load_source(spec["rates"])
        with open(src.path, "rb") as fh:
            spec["rates_sha"] = hashlib.sha256(fh.read()).hexdigest()[:16]
    spec["rate"] = list(spec.get("rate") or []) + list(args.rate_what_if or [])
    for x in spec["rate"]:
        parse_override(x)


FILES = ("model", "gpu", "link", "host", "hit_rate")


def beside_spec(spec: dict, path: str) -> dict:
    """The grid's files of your own named by relative paths (a model's config.json, gpu, link and host files,
    accuracy CSVs) as paths beside the spec, never in the current folder."""
    from ddbench.commands.config import names_a_file
    folder = os.path.dirname(os.path.abspath(path))
    for k in FILES:
        spec["grid"][k] = [os.path.join(folder, x) if names_a_file(k, x) else x for x in spec["grid"][k]]
    return spec

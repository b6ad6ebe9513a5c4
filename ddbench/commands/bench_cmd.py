"""`ddbench bench`: microbenchmarks on the local CUDA GPU.

Targets:
  engine    the decode-step engine (kernels/engine): every design at a model's shapes (default
            Llama-3-8B), 32K-128K; --phases paper: each design's largest batch under --gpu-mem-cap;
            writes traces/engine/<gpu>[-<phases>]/ (python -m ddbench.kernels.engine.sweep --help for its options)
  host      every GPU of the host fetching at once (1, 2, 4, 8 GPUs): the pinned big copy, the UVA
            gather of 4 and 2 KiB pieces, with --engine the engine's steps; writes
            traces/host/<gpu>-x<n>/ with the topology (python -m ddbench.kernels.hostbench --help)
  link      the gather against the pinned big copy at 8-256 MiB per call, bf16 and fp8 pieces, its
            interference with compute and the urgent fetch's latency with a prefetch in flight (gated
            and not); writes traces/link/<gpu>/ (python -m ddbench.kernels.linkbench --help)
  kernels   the Triton kernels (gather, dual-token attention, selection and its smaller indexes, key rebuild, SpeCache
            scoring) against their floors measured in the same run; writes
            traces/kernels/<gpu>/kernels.csv with provenance columns. --peer flashinfer: our sparse
            attention and top-k against flashinfer's (the optional extra ddbench[flashinfer]), each
            against its HBM floor (kernels/peerbench.py); writes traces/kernels/<gpu>/peer-flashinfer.csv.

Outputs go through the output guard (ddbench/core/outputs.py): written whole or not at all, never
over a file ddbench did not write; an earlier run's file is replaced only with --force.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys

from ddbench.core.catalog.gpus import catalog_gpu_name
from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir
from ddbench.core import flags
from ddbench.core.outputs import check_path, output_folder

TARGETS = ("kernels", "engine", "host", "link")
PEERS = ("flashinfer",)
EXAMPLE = """examples:
  ddbench bench kernels                     # into traces/kernels/<this gpu>/kernels.csv
  ddbench bench kernels --quick --out /tmp/bench
  ddbench bench kernels --peer flashinfer    # into traces/kernels/<this gpu>/peer-flashinfer.csv
  ddbench bench engine --quick --out /tmp/engine
  ddbench bench host --gpus 1,2,4,8 --engine
  ddbench bench link --out /tmp/link
  ddbench bench engine --phases paper --model qwen2.5-32b --contexts 64k,128k,256k --gpu-mem-cap h100-80gb"""
# engine target only: parsed here, then handed to the engine sweep as its options
# (ddbench.kernels.engine.options.SweepOptions, one field per flag; `python -m ddbench.kernels.engine.sweep --help` says more)
ENGINE_FLAGS = (("--phases", flags.text(), "comma-separated sweep phases (floor, mechanism, validation, reuse-fetch,"
                                           " paper)"),
                ("--model", flags.text(), "catalog model or path to a config.json (default llama-3-8b)"),
                ("--gpu-mem-cap", flags.text(), "emulate a GPU of this many GB, or a catalog GPU's memory (h100-80gb)"),
                ("--contexts", flags.text(), "paper phase: comma-separated contexts (default 128k)"),
                ("--paper-points", flags.text(), "paper phase: ordered MODEL:CONTEXT pairs"
                                                 " (qwen2.5-32b:128k,llama-3-8b:128k)"),
                ("--max-batch", flags.integer(), "paper phase: the largest batch searched"),
                ("--reps", flags.integer(), "repetitions (paper phase: timed replays per point)"),
                ("--budget-s", flags.number(), "stop starting new points after this many seconds"),
                ("--host-gib", flags.number(), "pinned host KV buffer in GiB"),
                ("--kv-bits", flags.text(), flags.ENGINE_KV_BITS_HELP))
PROVENANCE = ("gpu", "driver", "cuda", "torch", "triton", "git_sha", "date_utc", "command")


def register(sub) -> None:
    p = sub.add_parser("bench", help="GPU microbenchmarks (needs CUDA)", description=__doc__, epilog=EXAMPLE,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", choices=TARGETS, help="what to benchmark")
    p.add_argument("--out", type=flags.text(), help="output root (default: the data root's kernels/ or engine/)")
    p.add_argument("--force", action="store_true", help="replace an earlier run's files (ddbench's own only)")
    p.add_argument("--quick", action="store_true", help="fewer batch sizes (a smoke run)")
    p.add_argument("--peer", choices=PEERS, help="kernels: time ours against this library's kernels instead")
    for name, conv, help_ in ENGINE_FLAGS:
        p.add_argument(name, type=conv, help="engine: " + help_)
    p.add_argument("--resume", action="store_true", help="engine: skip points already measured in the folder")
    p.add_argument("--gpus", type=flags.text(), help="host: comma list of GPU counts fetching at once")
    p.add_argument("--seconds", type=flags.text(), help="host: timed seconds per test and count (default 2)")
    p.add_argument("--engine", action="store_true", help="host: also the engine's decode steps at 128K")
    p.set_defaults(func=run)


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def _engine(args) -> int:
    """The engine sweep with the options given here (the rest: its defaults); a DDBenchError is the CLI's."""
    from ddbench.kernels.engine.options import SweepOptions
    from ddbench.kernels.engine.runner import run_options
    given = {_dest(name): getattr(args, _dest(name)) for name, _, _ in ENGINE_FLAGS
             if getattr(args, _dest(name)) is not None}
    return run_options(SweepOptions(out=args.out or str(traces_dir("engine")), quick=args.quick, force=args.force,
                                    resume=args.resume, **given))


def _need_cuda():
    try:
        import torch
    except ImportError as exc:
        raise DDBenchError("bench needs torch with CUDA; torch is not installed") from exc
    if not torch.cuda.is_available():
        raise DDBenchError("bench needs a CUDA GPU; none is visible to torch")
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        raise DDBenchError("bench needs triton; it is not installed") from exc


def write_csv(path: str, rows: list[dict], prov: dict) -> None:
    """Write the kernels table to `path` (a staged file of the output guard)."""
    from ddbench.kernels.microbench import COLUMNS
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=["schema"] + COLUMNS + list(PROVENANCE))
        w.writeheader()
        for r in rows:
            w.writerow({"schema": 1, **r, **{k: prov[k] for k in PROVENANCE}})


def run(args) -> int:
    if args.out is not None:
        # --out is the root of the GPU's folder (kernels, engine) or that folder (link, host)
        args.out = str(check_path(args.out, data_ok={"kernels": ("kernels",), "engine": ("engine",),
                                                     "link": ("link/*",), "host": ("host/*",)}.get(args.target, ())))
    if args.target != "engine":
        given = [name for name, _, _ in ENGINE_FLAGS if getattr(args, _dest(name)) is not None]
        if given or args.resume:
            raise DDBenchError(f"{(given or ['--resume'])[0]} is a flag of `bench engine` only")
    if args.target != "host" and (args.gpus is not None or args.seconds is not None or args.engine):
        raise DDBenchError("--gpus, --seconds and --engine are flags of `bench host` only")
    if args.target != "kernels" and args.peer is not None:
        raise DDBenchError("--peer is a flag of `bench kernels` only")
    _need_cuda()
    if args.target == "host":
        from ddbench.kernels.hostbench import main as host_main
        return host_main((["--out", args.out] if args.out else []) + (["--force"] if args.force else [])
                         + (["--gpus", args.gpus] if args.gpus else []) + (["--engine"] if args.engine else [])
                         + (["--seconds", args.seconds] if args.seconds else []))
    if args.target == "link":
        from ddbench.kernels.linkbench import main as link_main
        return link_main((["--out", args.out] if args.out else []) + (["--force"] if args.force else [])
                         + (["--rounds", "1", "--sizes", "8,64"] if args.quick else []))
    if args.target == "engine":
        return _engine(args)
    return _kernels(args)


def _kernels(args) -> int:
    """The kernels table (kernels.csv), or with --peer the table against that library (peer-<name>.csv)."""
    from ddbench.kernels.timing import provenance
    import torch
    from ddbench.core.provenance import command_line
    if args.peer:
        from ddbench.kernels.peerbench import load_flashinfer, run_peer
        load_flashinfer()               # a missing extra: one line, before any folder is touched
        name, bench = f"peer-{args.peer}.csv", run_peer
    else:
        from ddbench.kernels.microbench import run_all
        name, bench = "kernels.csv", run_all
    prov = provenance(command_line() if sys.argv[1:] else "ddbench bench kernels")
    gpu = catalog_gpu_name(prov["gpu"], torch.cuda.get_device_properties(0).total_memory)
    folder = os.path.join(args.out or str(traces_dir("kernels")), gpu)
    with output_folder(folder, command="ddbench bench kernels", shared=True, force=args.force) as w:
        w.claim([name])
        rows, _ = bench(quick=args.quick)
        write_csv(w.stage_path(name), rows, prov)
    print(f"wrote {os.path.join(folder, name)} ({len(rows)} rows)")
    return 0

"""`ddbench bench`: microbenchmarks on the local CUDA GPU.

Targets:
  engine    the decode-step engine (kernels/engine): every design at Llama-3-8B shapes, 32K-128K;
            writes traces/engine/<gpu>/ (python -m kernels.engine.sweep --help for its options)
  kernels   the Triton kernels (gather, dual-token attention, selection, key rebuild, SpeCache
            scoring) against their floors measured in the same run; writes
            traces/kernels/<gpu>/kernels.csv with provenance columns.

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

TARGETS = ("kernels", "engine")
EXAMPLE = """examples:
  ddbench bench kernels                     # into traces/kernels/<this gpu>/kernels.csv
  ddbench bench kernels --quick --out /tmp/bench
  ddbench bench engine --quick --out /tmp/engine"""
PROVENANCE = ("gpu", "driver", "cuda", "torch", "triton", "git_sha", "date_utc", "command")


def register(sub) -> None:
    p = sub.add_parser("bench", help="GPU microbenchmarks (needs CUDA)", description=__doc__, epilog=EXAMPLE,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", choices=TARGETS, help="what to benchmark")
    p.add_argument("--out", type=flags.text(), help="output root (default: the data root's kernels/ or engine/)")
    p.add_argument("--force", action="store_true", help="replace an earlier run's files (ddbench's own only)")
    p.add_argument("--quick", action="store_true", help="fewer batch sizes (a smoke run)")
    p.set_defaults(func=run)


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
    from kernels.microbench import COLUMNS
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=["schema"] + COLUMNS + list(PROVENANCE))
        w.writeheader()
        for r in rows:
            w.writerow({"schema": 1, **r, **{k: prov[k] for k in PROVENANCE}})


def run(args) -> int:
    if args.out is not None:
        args.out = str(check_path(args.out))
    _need_cuda()
    if args.target == "engine":
        from kernels.engine.sweep import main as engine_main
        out = args.out or str(traces_dir("engine"))
        return engine_main(["--out", out] + (["--quick"] if args.quick else []) + (["--force"] if args.force else []))
    from kernels.microbench import run_all
    from kernels.timing import provenance
    import torch
    prov = provenance("ddbench " + " ".join(sys.argv[1:]) if sys.argv[1:] else "ddbench bench kernels")
    gpu = catalog_gpu_name(prov["gpu"], torch.cuda.get_device_properties(0).total_memory)
    folder = os.path.join(args.out or str(traces_dir("kernels")), gpu)
    with output_folder(folder, command="ddbench bench kernels", shared=True, force=args.force) as w:
        w.claim(["kernels.csv"])
        rows, _ = run_all(quick=args.quick)
        write_csv(w.stage_path("kernels.csv"), rows, prov)
    print(f"wrote {os.path.join(folder, 'kernels.csv')} ({len(rows)} rows)")
    return 0

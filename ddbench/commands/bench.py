"""`ddbench bench`: microbenchmarks on the local CUDA GPU.

Targets:
  engine    the decode-step engine (kernels/engine): every design at Llama-3-8B shapes, 32K-128K;
            writes traces/engine/<gpu>/ (python -m kernels.engine.bench --help for its options)
  kernels   the Triton kernels (gather, dual-token attention, selection, key rebuild, SpeCache
            scoring) against their floors measured in the same run; writes
            traces/kernels/<gpu>/kernels.csv with provenance columns.

Each output file is written whole (a temporary file renamed into place) or not at all.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys

from ddbench.core.catalog.gpus import catalog_gpu_name
from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir
from ddbench.core.io import atomic_path, check_out

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
    p.add_argument("--out", help="output root (default: the data root's kernels/ or engine/)")
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
    from kernels.bench import COLUMNS
    with atomic_path(path) as tmp:
        with open(tmp, "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=["schema"] + COLUMNS + list(PROVENANCE))
            w.writeheader()
            for r in rows:
                w.writerow({"schema": 1, **r, **{k: prov[k] for k in PROVENANCE}})


def run(args) -> int:
    if args.out is not None:
        args.out = check_out(args.out)
    _need_cuda()
    if args.target == "engine":
        from kernels.engine.bench import main as engine_main
        out = args.out or str(traces_dir("engine"))
        return engine_main(["--out", out] + (["--quick"] if args.quick else []))
    from kernels.bench import run_all
    from kernels.timing import provenance
    prov = provenance("ddbench " + " ".join(sys.argv[1:]) if sys.argv[1:] else "ddbench bench kernels")
    rows, _ = run_all(quick=args.quick)
    import torch
    gpu = catalog_gpu_name(prov["gpu"], torch.cuda.get_device_properties(0).total_memory)
    path = os.path.join(args.out or str(traces_dir("kernels")), gpu, "kernels.csv")
    write_csv(path, rows, prov)
    print(f"wrote {path} ({len(rows)} rows)")
    return 0

"""`ddbench calibrate`: measure this GPU and write a calibration bundle.

Runs the link, linear-layer, kernel and interference microbenchmarks on the local CUDA GPU
and writes traces/calibration/<gpu>/ (see ddbench/core/calibration.py for the schema). The kernels
section times torch SDPA/selection/rebuild and the Triton kernels of kernels/ (dual- and
single-token sparse attention, selection, key rebuild) that DualDecoder's designs are costed with. Every
finished measurement is written at once; an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from ddbench.core.errors import DDBenchError
from ddbench.core.io import check_out
from ddbench.core.paths import traces_dir

EXAMPLE = """examples:
  ddbench calibrate                         # every section, into traces/calibration/<this gpu>/
  ddbench calibrate --sections link,interference --budget-s 120
  ddbench calibrate --gpu h200 --out /tmp/cal --fresh"""

SECTION_NAMES = ("ceilings", "link", "linear", "kernels", "interference", "engine")


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="measure this GPU: link, linear layers, kernels, interference",
                       description=__doc__, epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="bundle root (default: the data root's calibration/)")
    p.add_argument("--gpu", help="catalog GPU name for the bundle folder (default: from the device name)")
    p.add_argument("--sections", default="all", help=f"'all' or a comma list of {', '.join(SECTION_NAMES)}")
    p.add_argument("--budget-s", type=float, default=1800.0,
                   help="stop starting measurements after this many seconds (rerun to resume)")
    p.add_argument("--fresh", action="store_true", help="discard an existing bundle instead of resuming it")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.sections.strip().lower() == "all":
        sections = list(SECTION_NAMES)
    else:
        sections = [s.strip() for s in args.sections.split(",") if s.strip()]
        bad = [s for s in sections if s not in SECTION_NAMES]
        if bad:
            raise DDBenchError(f"unknown section(s) {', '.join(bad)}; known: {', '.join(SECTION_NAMES)}")
    if not (args.budget_s > 0 and math.isfinite(args.budget_s)):
        raise DDBenchError(f"--budget-s must be positive and finite, got {args.budget_s}")
    if args.out is not None:
        args.out = check_out(args.out)
    try:
        import torch
    except ImportError:
        raise DDBenchError("ddbench calibrate needs torch with CUDA; torch is not installed") from None
    if not torch.cuda.is_available():
        raise DDBenchError("ddbench calibrate needs a CUDA GPU; none is visible to torch")
    from kernels.calibrate import run_calibration

    command = "ddbench " + " ".join(sys.argv[1:]) if sys.argv and sys.argv[0].endswith(("ddbench", "__main__.py")) \
        else "ddbench calibrate " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                                             if k not in ("func", "command") and v not in (None, False))
    from tqdm import tqdm
    bar = tqdm(total=len(sections), desc="calibrate", unit="section", disable=None, file=sys.stderr)
    started = []

    def log(message: str) -> None:
        """The calibration's log lines, above a bar that advances as each section starts."""
        if message.startswith("section "):
            if started:
                bar.update(1)
            started.append(message)
            bar.set_postfix_str(message.split()[1])
        if bar.disable:
            print(message, file=sys.stderr, flush=True)
        else:
            bar.write(message, file=sys.stderr)

    try:
        result = run_calibration(os.path.normpath(args.out or str(traces_dir("calibration"))), args.gpu, sections,
                                 args.budget_s, args.fresh, command, log=log)
        bar.update(bar.total - bar.n)
    finally:
        bar.close()
    print(f"wrote {result['path']}: {result['measured']} measured, {result['skipped']} already present, "
          f"{len(result['errors'])} failed; rows {result['rows']}")
    return 0

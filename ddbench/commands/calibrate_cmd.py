"""`ddbench calibrate`: measure this GPU and write a calibration bundle.

Runs the link, linear-layer, kernel and interference microbenchmarks on the local CUDA GPU
and writes traces/calibration/<gpu>/ (see ddbench/core/calibration.py for the schema). The kernels
section times torch SDPA/selection/rebuild and the Triton kernels of kernels/ (dual- and
single-token sparse attention, selection, key rebuild) that DualDecoder's designs are costed with. Every
finished measurement is written at once; an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import os
import sys

from ddbench.core.errors import DDBenchError
from ddbench.core import flags
from ddbench.core.outputs import check_path, output_folder
from ddbench.core.paths import traces_dir

EXAMPLE = """examples:
  ddbench calibrate                         # every section, into traces/calibration/<this gpu>/
  ddbench calibrate --sections link,interference --budget-s 120
  ddbench calibrate --gpu h200 --out /tmp/cal --fresh"""

SECTION_NAMES = ("ceilings", "link", "linear", "kernels", "interference", "compute_interference", "engine")


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="measure this GPU: link, linear layers, kernels, interference",
                       description=__doc__, epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=flags.text(), help="bundle root (default: the data root's calibration/)")
    p.add_argument("--gpu", type=flags.text(), help="catalog GPU name for the bundle folder (default: from the device name)")
    p.add_argument("--sections", default="all", type=flags.text(), help=f"'all' or a comma list of {', '.join(SECTION_NAMES)}")
    p.add_argument("--budget-s", type=flags.number(lo=0, lo_open=True), default=1800.0,
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
    if args.out is not None:
        args.out = str(check_path(args.out, data_ok=("calibration",)))    # the bundles' root: <gpu>/ goes in it
    try:
        import torch
    except ImportError:
        raise DDBenchError("ddbench calibrate needs torch with CUDA; torch is not installed") from None
    if not torch.cuda.is_available():
        raise DDBenchError("ddbench calibrate needs a CUDA GPU; none is visible to torch")
    from ddbench.kernels.calibrate import run_calibration

    from ddbench.core.provenance import command_line
    command = command_line() if sys.argv and sys.argv[0].endswith(("ddbench", "__main__.py")) \
        else command_line(argv=[f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
                                if k not in ("func", "command") and v not in (None, False)], prefix="ddbench calibrate")
    from ddbench.core.calibration import SECTIONS, bundle_dir
    from ddbench.core.catalog.gpus import catalog_gpu_name
    from ddbench.progress import bar as progress_bar
    from ddbench.progress import say
    root = os.path.normpath(args.out or str(traces_dir("calibration")))
    gpu = args.gpu or catalog_gpu_name(torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).total_memory)
    bar = progress_bar(total=len(sections), desc="calibrate", unit="section")
    started = []

    def log(message: str) -> None:
        """The calibration's log lines, above a bar that advances as each section starts."""
        if message.startswith("section "):
            if started:
                bar.update(1)
            started.append(message)
            bar.set_postfix_str(message.split()[1])
        say(bar, message)

    try:
        # the bundle is written in place as each measurement finishes (a rerun resumes): its files are
        # the guard's live files, refused up front where they exist and ddbench did not write them
        with output_folder(bundle_dir(gpu, root), command="ddbench calibrate", shared=True, own_ok=True) as w:
            for name in [s["file"] for s in SECTIONS.values()] + ["bundle.json"]:
                w.live(name)
            result = run_calibration(root, gpu, sections, args.budget_s, args.fresh, command, log=log)
        bar.update(bar.total - bar.n)
    finally:
        bar.close()
    print(f"wrote {result['path']}: {result['measured']} measured, {result['skipped']} already present, "
          f"{len(result['errors'])} failed; rows {result['rows']}")
    return 0

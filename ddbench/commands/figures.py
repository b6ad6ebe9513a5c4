"""`ddbench figures`: replay the paper's figures into figures/.

Each figure is written as <id>.png, <id>.pdf and <id>.csv (its data), and
figures/README.md gets the index and the paper-vs-replay table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

EXAMPLE = """examples:
  ddbench figures                 # all figures into figures/
  ddbench figures --only fig02,fig14 --out /tmp/figs"""

DEFAULT_OUT = "figures"


def register(sub) -> None:
    p = sub.add_parser("figures", help="replay the paper's figures (PNG, PDF, CSV + paper-vs-replay table)",
                       description=__doc__, epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", help="comma list of figure ids (default: all)")
    p.add_argument("--out", default=DEFAULT_OUT, help="output folder (default: figures)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ddbench.experiments import select
    from ddbench.core.io import atomic_path, write_text
    from ddbench.core.paper import reported
    from ddbench.plotting import new_figure, plt
    from ddbench.report import render_index

    experiments = select(args.only)
    paper = reported()
    os.makedirs(args.out, exist_ok=True)
    results = []
    for i, exp in enumerate(experiments, 1):
        t0 = time.perf_counter()
        res = exp.compute()
        for c in res.comparisons:
            if c.paper_id not in paper:
                raise KeyError(f"{exp.id}: comparison against unknown paper number {c.paper_id}")
        stem = os.path.join(args.out, exp.id)
        with atomic_path(stem + ".csv") as tmp:
            res.data.to_csv(tmp, index=False)
        fig = new_figure()
        exp.draw(res, fig)
        with atomic_path(stem + ".png") as png, atomic_path(stem + ".pdf") as pdf:
            fig.savefig(png, metadata={"Software": None})
            fig.savefig(pdf, metadata={"CreationDate": None, "Producer": None})
        plt.close(fig)
        results.append((exp, res))
        print(f"[{i}/{len(experiments)}] {exp.id}: {exp.title} ({time.perf_counter() - t0:.1f} s)",
              file=sys.stderr)
    if not args.only:
        write_text(os.path.join(args.out, "README.md"), render_index(results, paper))
        print(f"wrote {os.path.join(args.out, 'README.md')}", file=sys.stderr)
    return 0

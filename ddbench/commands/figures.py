"""`ddbench figures`: replay the paper's figures into figures/.

Each figure is written as <id>.png, <id>.pdf and <id>.csv (its data), and
figures/README.md gets the index and the paper-vs-replay table, which covers every
number in traces/paper/reported.json. The last line printed counts them.

Everything goes through the output guard (ddbench/core/outputs.py): the files are built in a
staging folder and moved in together at the end; the files of an earlier `ddbench figures` run are
replaced (with --only, the other figures stay as they were); files that ddbench did not write are
never deleted or overwritten: a non-empty --out that holds some is refused unless --force, and then
they are kept beside the figures.

A figure that fails (an error a user can cause: a missing trace, a paper number it compares that
reported.json does not mark replayed) prints one line naming it; the others are still written and
swapped in, figures/README.md lists the failed ones, and the exit status is 2. Each figure is
staged in its own folder and moved in only when all its files are written, so a failed figure
leaves none of its files (with --only, the previous run's copy of it stays as it was).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

from ddbench.commands import wrap
from ddbench.core.errors import DDBenchError
from ddbench.core.outputs import output_folder

EXAMPLE = """examples:
  ddbench figures                 # all figures into figures/
  ddbench figures --only fig02,fig14 --out /tmp/figs"""

DEFAULT_OUT = "figures"
# 10 significant digits: the last bits of a float differ between machines' math libraries; this keeps
# `make figures` byte-identical across them (the PNG and PDF carry no date or software version)
FLOAT_FORMAT = "%.10g"


def register(sub) -> None:
    p = sub.add_parser("figures", help="replay the paper's figures (PNG, PDF, CSV + paper-vs-replay table)",
                       description=__doc__, epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", help="comma list of figure ids (default: all)")
    p.add_argument("--out", default=DEFAULT_OUT, help="output folder (default: figures)")
    p.add_argument("--force", action="store_true",
                   help="write into a --out that holds files ddbench did not write (they are kept)")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no per-figure lines")
    p.set_defaults(func=run)


def _save(fig, stem: str) -> None:
    fig.savefig(stem + ".png", metadata={"Software": None})
    fig.savefig(stem + ".pdf", metadata={"CreationDate": None, "Producer": None})


def _one_line(msg: str) -> str:
    return " ".join(msg.split())


def _write_figure(exp, w, paper, new_figure, plt):
    """Compute and draw one figure into a folder of its own, then stage its files in the writer `w`;
    DDBenchError (nothing of this figure staged) where it cannot be made."""
    res = exp.compute()
    for c in res.comparisons:
        if c.paper_id not in paper:
            raise DDBenchError(f"{exp.id}: compares against {c.paper_id}, which is not in reported.json")
        if not paper[c.paper_id].replayed:
            raise DDBenchError(f"{exp.id}: compares against {c.paper_id}, which reported.json marks "
                               f"{paper[c.paper_id].status!r}; mark it replayed (with what replays it)")
    stage = w.scratch(exp.id + "-")     # inside the guard's staging folder: it goes with it
    try:
        stem = os.path.join(stage, exp.id)
        res.data.to_csv(stem + ".csv", index=False, float_format=FLOAT_FORMAT)
        fig = new_figure()
        try:
            exp.draw(res, fig)
            _save(fig, stem)
        finally:
            plt.close(fig)
        for name in sorted(os.listdir(stage)):
            os.replace(os.path.join(stage, name), w.stage_path(name))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return res


def run(args) -> int:
    from ddbench.core.paper_numbers import coverage, coverage_line, reported
    from ddbench.experiments import select
    from ddbench.plotting import new_figure, plt
    from ddbench.progress import bar, say
    from ddbench.report import render_index

    experiments = select(args.only)
    paper = reported()
    results = []
    failed: list[tuple[str, str]] = []
    line = None
    with output_folder(args.out, command="ddbench figures", force=args.force, own_ok=True,
                       prune=not args.only) as w:
        b = bar(experiments, quiet=args.quiet, desc="figures", unit="fig",
                bar_format="{desc}: {n_fmt}/{total_fmt} |{bar}| {elapsed} {postfix}")
        for exp in b:
            b.set_postfix_str(exp.id)
            t0 = time.perf_counter()
            try:
                res = _write_figure(exp, w, paper, new_figure, plt)
            except DDBenchError as exc:
                msg = _one_line(str(exc))
                failed.append((exp.id, msg))
                if not args.only:      # a chosen few are told at the end: in the error's one line if all fail
                    say(b, f"ddbench: figure {exp.id} failed: {msg}")
                continue
            results.append((exp, res))
            if not args.quiet:
                say(b, f"{exp.id}: {exp.title} ({time.perf_counter() - t0:.1f} s)")
        b.close()
        if failed and not results:
            what = "; ".join(f"{f}: {m}" for f, m in failed) if args.only else ", ".join(f for f, _ in failed)
            raise DDBenchError(f"every figure failed ({what}); --out {args.out} left as it was")
        if args.only:
            for fid, msg in failed:
                say(None, f"ddbench: figure {fid} failed: {msg}")
        if not args.only:
            cov = coverage(paper, {c.paper_id for _, r in results for c in r.comparisons})
            line = coverage_line(cov)
            text = render_index(results, paper, line)
            if failed:
                text += "\n## Figures that failed in this run\n\n" + "".join(
                    f"- `{fid}`: {_one_line(msg)}\n" for fid, msg in failed)
            w.write_text("README.md", text)
    print("\n".join(wrap([f"wrote {len(results)} figure(s) into {args.out}"
                          + (f"; {len(failed)} failed: {', '.join(f for f, _ in failed)}" if failed else "")])),
          file=sys.stderr)
    if line:
        print("\n".join(wrap([line])))
    return 2 if failed else 0

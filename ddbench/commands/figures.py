"""`ddbench figures`: replay the paper's figures into figures/.

Each figure is written as <id>.png, <id>.pdf and <id>.csv (its data), and
figures/README.md gets the index and the paper-vs-replay table, which covers every
number in traces/paper/reported.json. The last line printed counts them.

Everything is written into a temporary folder beside --out, which then replaces
--out in one step: an interrupted run leaves the previous folder as it was. A
figures folder carries a marker file (.ddbench-figures); a non-empty --out
without one is refused unless --force (its other files are then kept).

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
import signal
import sys
import tempfile
import time

from ddbench.core.errors import DDBenchError
from ddbench.core.io import umask

EXAMPLE = """examples:
  ddbench figures                 # all figures into figures/
  ddbench figures --only fig02,fig14 --out /tmp/figs"""

DEFAULT_OUT = "figures"
MARKER = ".ddbench-figures"
MARKER_TEXT = "Written by `ddbench figures`; this folder is replaced as a whole on every run.\n"


def register(sub) -> None:
    p = sub.add_parser("figures", help="replay the paper's figures (PNG, PDF, CSV + paper-vs-replay table)",
                       description=__doc__, epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", help="comma list of figure ids (default: all)")
    p.add_argument("--out", default=DEFAULT_OUT, help="output folder (default: figures)")
    p.add_argument("--force", action="store_true",
                   help="write into a non-empty --out that is not a figures folder (its other files are kept)")
    p.set_defaults(func=run)


def check_out(out: str, force: bool) -> tuple[str, bool]:
    """(absolute --out, whether its present files must be carried over); DDBenchError if unusable."""
    if not out or not out.strip():
        raise DDBenchError("--out is empty; give a folder, e.g. --out figures")
    path = os.path.abspath(out)
    if os.path.exists(path) and not os.path.isdir(path):
        raise DDBenchError(f"--out {out}: exists and is not a folder")
    parent = os.path.dirname(path)
    probe = parent
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise DDBenchError(f"--out {out}: {probe} is a file, not a folder")
    if os.path.isdir(path):
        entries = os.listdir(path)
        if entries and MARKER not in entries and not force:
            raise DDBenchError(f"--out {out}: not empty and not a figures folder (no {MARKER}); "
                               "pass --force to write into it anyway")
        return path, bool(entries) and MARKER not in entries
    return path, False


def _copy_over(src: str, dst: str) -> None:
    for name in os.listdir(src):
        s, d = os.path.join(src, name), os.path.join(dst, name)
        if os.path.isdir(s) and not os.path.islink(s):
            shutil.copytree(s, d, symlinks=True)
        else:
            shutil.copy2(s, d, follow_symlinks=False)


def _swap_in(tmp: str, path: str) -> None:
    """Replace `path` by `tmp` with Ctrl-C held off between the two renames."""
    old = None
    blocked = {signal.SIGINT, signal.SIGTERM}
    prev = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        if os.path.isdir(path):
            old = tempfile.mkdtemp(prefix=".old-" + os.path.basename(path) + "-", dir=os.path.dirname(path))
            os.rmdir(old)
            os.rename(path, old)
        os.rename(tmp, path)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, prev)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def _fix_modes(folder: str, mask: int) -> None:
    """mkstemp/mkdtemp make 0600/0700; give the files the modes the umask would."""
    for root, dirs, files in os.walk(folder):
        os.chmod(root, 0o777 & ~mask)
        for f in files:
            p = os.path.join(root, f)
            if not os.path.islink(p):
                os.chmod(p, 0o666 & ~mask)


def _save(fig, stem: str) -> None:
    fig.savefig(stem + ".png", metadata={"Software": None})
    fig.savefig(stem + ".pdf", metadata={"CreationDate": None, "Producer": None})


def _one_line(msg: str) -> str:
    return " ".join(msg.split())


def _write_figure(exp, tmp: str, paper, new_figure, plt):
    """Compute and draw one figure into a staging folder inside `tmp`, then move its files into
    `tmp`; DDBenchError (nothing of this figure moved) where it cannot be made."""
    res = exp.compute()
    for c in res.comparisons:
        if c.paper_id not in paper:
            raise DDBenchError(f"{exp.id}: compares against {c.paper_id}, which is not in reported.json")
        if not paper[c.paper_id].replayed:
            raise DDBenchError(f"{exp.id}: compares against {c.paper_id}, which reported.json marks "
                               f"{paper[c.paper_id].status!r}; mark it replayed (with what replays it)")
    stage = tempfile.mkdtemp(prefix=".fig-" + exp.id + "-", dir=tmp)
    try:
        stem = os.path.join(stage, exp.id)
        res.data.to_csv(stem + ".csv", index=False)
        fig = new_figure()
        try:
            exp.draw(res, fig)
            _save(fig, stem)
        finally:
            plt.close(fig)
        for name in sorted(os.listdir(stage)):
            os.replace(os.path.join(stage, name), os.path.join(tmp, name))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return res


def run(args) -> int:
    from tqdm import tqdm

    from ddbench.core.paper import coverage, coverage_line, reported
    from ddbench.experiments import select
    from ddbench.plotting import new_figure, plt
    from ddbench.report import render_index

    path, carry = check_out(args.out, args.force)
    experiments = select(args.only)
    paper = reported()
    mask = umask()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".tmp-" + os.path.basename(path) + "-", dir=os.path.dirname(path))
    except OSError as exc:
        raise DDBenchError(f"--out {args.out}: cannot write there ({exc.strerror or exc})") from None
    try:
        if os.path.isdir(path) and (carry or args.only):
            _copy_over(path, tmp)      # keep the figures (or foreign files) this run does not rewrite
        results = []
        failed: list[tuple[str, str]] = []
        bar = tqdm(experiments, desc="figures", unit="fig", file=sys.stderr, dynamic_ncols=True,
                   bar_format="{desc}: {n_fmt}/{total_fmt} |{bar}| {elapsed} {postfix}")
        for exp in bar:
            bar.set_postfix_str(exp.id)
            t0 = time.perf_counter()
            try:
                res = _write_figure(exp, tmp, paper, new_figure, plt)
            except DDBenchError as exc:
                msg = _one_line(str(exc))
                failed.append((exp.id, msg))
                bar.write(f"ddbench: figure {exp.id} failed: {msg}", file=sys.stderr)
                continue
            results.append((exp, res))
            bar.write(f"{exp.id}: {exp.title} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
        bar.close()
        if failed and not results:
            raise DDBenchError(f"every figure failed ({', '.join(f for f, _ in failed)}); --out {args.out} "
                               "left as it was")
        line = None
        if not args.only:
            cov = coverage(paper, {c.paper_id for _, r in results for c in r.comparisons})
            line = coverage_line(cov)
            with open(os.path.join(tmp, "README.md"), "w", encoding="utf-8") as fh:
                fh.write(render_index(results, paper, line))
                if failed:
                    fh.write("\n## Figures that failed in this run\n\n" + "".join(
                        f"- `{fid}`: {_one_line(msg)}\n" for fid, msg in failed))
        with open(os.path.join(tmp, MARKER), "w", encoding="utf-8") as fh:
            fh.write(MARKER_TEXT)
        _fix_modes(tmp, mask)
        _swap_in(tmp, path)
    except OSError as exc:
        raise DDBenchError(f"--out {args.out}: cannot write there ({exc.strerror or exc})") from None
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {len(results)} figure(s) into {args.out}"
          + (f"; {len(failed)} failed: {', '.join(f for f, _ in failed)}" if failed else ""), file=sys.stderr)
    if line:
        print(line)
    return 2 if failed else 0

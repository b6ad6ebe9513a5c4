"""The result tables of README.md and docs/*.md, generated from the committed traces.

    python -m ddbench.doctables            rewrite every generated block in README.md and docs/*.md
    python -m ddbench.doctables --check    change nothing; exit 1 naming each block that is stale

A generated block is everything between a start marker and the next end marker:

    <!-- generated: NAME -->
    ...                          (replaced by GENERATORS[NAME](root))
    <!-- end -->

so a table edited by hand fails `--check` (tests/test_doctables.py runs it in `make test`).
An unknown NAME or a start marker without its end is an error (exit 2).

The table generators read files committed under the repository (traces/, figures/) with pandas
and json (a few price a point with the simulator's cost model); none imports torch or kernels. Numbers are formatted here, not by pandas, so the
text depends on the data alone. Where a trace holds several repetitions of a point, the cell is
`median (min-max, n runs)`; a single measurement is printed as it is.

Example outputs of commands (`example-NAME`) and the prose that quotes their numbers (`notes-NAME`)
are generated the same way: the command is run (ddbench/doctables/examples.py) and its output kept.

The package: `common` (formatting, readers), `results_table` (the README's one results table), `verdict` (its
break-even), `engine_tables` (the engine's and the simulator's tables, earlier engines included),
`trace_tables` (calibration, kernels, accuracy, figures), `examples` (commands and their outputs).
"""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

from ddbench.core.flags import OneLineParser
from ddbench.doctables import examples
from ddbench.doctables.ablation import ablation
from ddbench.doctables.fp8_cache import fp8_cache
from ddbench.doctables.index_rates import (index_rates, index_rates_gemma, index_rates_gemma_32k,
                                           index_recall_gemma)
from ddbench.doctables.index_tables import index_predictions, index_recall, notes_index_plan
from ddbench.doctables.peer import peer_flashinfer
from ddbench.doctables.common import CALIBRATION_SWEEP, CTX, ROOT, DocTablesError  # noqa: F401
from ddbench.doctables.engine_tables import (cache, engine_floor, engine_mechanism, engine_transfers, fp8, headline,  # noqa: F401
                                      paper_points, validation, validation_line)
from ddbench.doctables.trace_tables import (accuracy, calibration, contexts, fig12, kernels_attention, kernels_gather,
                                      sensitivity)

START = re.compile(r"<!-- generated: ([a-z0-9-]+) -->")
END = "<!-- end -->"

from ddbench.doctables.verdict import verdict  # noqa: E402
from ddbench.doctables.results_table import results  # noqa: E402

GENERATORS = {
    "results": results,
    "headline": headline,
    "verdict": verdict,
    "kernels-gather": kernels_gather,
    "kernels-attention": kernels_attention,
    "kernels-peer-flashinfer": peer_flashinfer,
    "calibration": calibration,
    "fig12": fig12,
    "paper-points": paper_points,
    "cache": cache,
    "ablation": ablation,
    "fp8": fp8,
    "fp8-cache": fp8_cache,
    "index-predictions": index_predictions,
    "index-recall": index_recall,
    "index-rates": index_rates,
    "index-rates-gemma": index_rates_gemma,
    "index-rates-gemma-32k": index_rates_gemma_32k,
    "index-recall-gemma": index_recall_gemma,
    "notes-index-plan": notes_index_plan,
    "engine-floor": engine_floor,
    "engine-transfers": engine_transfers,
    "engine-mechanism": engine_mechanism,
    "validation": validation,
    "accuracy": accuracy,
    "contexts": contexts,
    "sensitivity": sensitivity,
    **examples.GENERATORS,
}


# -- blocks -------------------------------------------------------------------------------------

def _wrap(text: str, width: int = 100) -> str:
    """Prose paragraphs filled to `width`; tables, lists and fenced blocks (an example's output) as they are."""
    if text.startswith("```"):
        return text
    paras = []
    for p in text.split("\n\n"):
        if "\n" in p or p.startswith(("|", "- ")):
            paras.append(p)
        else:
            paras.append(textwrap.fill(p, width, break_long_words=False, break_on_hyphens=False))
    return "\n\n".join(paras)


def blocks(text: str, where: str = "text") -> list[tuple[str, str]]:
    """Every generated block of `text`: (name, its body as it stands), in order."""
    out, pos = [], 0
    while True:
        m = START.search(text, pos)
        if not m:
            return out
        end = text.find(END, m.end())
        nxt = START.search(text, m.end())
        if end < 0 or (nxt and nxt.start() < end):
            raise DocTablesError(f"{where}: block {m.group(1)!r} has no {END}")
        out.append((m.group(1), text[m.end():end]))
        pos = end + len(END)


def generate(name: str, root: Path = ROOT) -> str:
    """A block's body as `render` writes it."""
    if name not in GENERATORS:
        raise DocTablesError(f"unknown generated block {name!r}; known: {', '.join(GENERATORS)}")
    return "\n" + _wrap(GENERATORS[name](root).strip("\n")) + "\n"


def render(text: str, root: Path = ROOT, where: str = "text", only: set[str] | None = None) -> tuple[str, list[str]]:
    """`text` with every generated block rewritten (with `only`, those blocks alone), and the names of
    the blocks that changed."""
    out, changed, pos, cache = [], [], 0, {}
    while True:
        m = START.search(text, pos)
        if not m:
            out.append(text[pos:])
            break
        name = m.group(1)
        if name not in GENERATORS:
            raise DocTablesError(f"{where}: unknown generated block {name!r}; known: {', '.join(GENERATORS)}")
        end = text.find(END, m.end())
        nxt = START.search(text, m.end())
        if end < 0 or (nxt and nxt.start() < end):
            raise DocTablesError(f"{where}: block {name!r} has no {END}")
        if only is not None and name not in only:
            out.append(text[pos:end + len(END)])
            pos = end + len(END)
            continue
        if name not in cache:
            cache[name] = generate(name, root)
        body = cache[name]
        if text[m.end():end] != body:
            changed.append(name)
        out.append(text[pos:m.end()] + body + END)
        pos = end + len(END)
    return "".join(out), changed


def documents(root: Path = ROOT) -> list[Path]:
    return [p for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))] if p.is_file()]


def run(root: Path = ROOT, check: bool = False) -> list[str]:
    """Rewrite (or with check, only compare) every document; returns `FILE: block` for each stale block."""
    stale = []
    for path in documents(root):
        text = path.read_text(encoding="utf-8")
        new, changed = render(text, root, where=str(path.relative_to(root)))
        stale += [f"{path.relative_to(root)}: {name}" for name in changed]
        if changed and not check:
            tmp = path.with_name(f".{path.name}.doctables.tmp")
            tmp.write_text(new, encoding="utf-8")
            tmp.replace(path)
    return stale


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m ddbench.doctables", description=__doc__.split("\n\n")[0],
                                 epilog="example: python -m ddbench.doctables --check")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is stale")
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository (default: the one holding this package)")
    args = ap.parse_args(argv)
    try:
        stale = run(args.root, check=args.check)
    except (DocTablesError, KeyError, ValueError, OSError) as exc:
        print(f"doctables: error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if stale:
            print("doctables: stale generated blocks (run `python -m ddbench.doctables`): " + ", ".join(stale),
                  file=sys.stderr)
            return 1
        return 0
    for s in stale:
        print(f"rewrote {s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The CLI's subcommands, one module each; shared bits of their text output below."""

from __future__ import annotations

import re
import textwrap

WIDTH = 120     # no line of a command's default text is wider (issue 46; tests/test_line_widths.py)


def wrap(lines) -> list[str]:
    """Every line at most WIDTH characters: longer ones wrapped between words (every word kept), their
    continuations indented four spaces past the line's own indent. Lines holding a line break are split first."""
    out = []
    for line in (x for block in lines for x in str(block).split("\n")):
        if len(line) <= WIDTH:
            out.append(line)
            continue
        lead = len(line) - len(line.lstrip())
        out += textwrap.wrap(line, WIDTH, subsequent_indent=" " * (lead + 4),
                             break_on_hyphens=False, break_long_words=True)
    return out


def cost_model_line(notes, verbose: bool = False) -> str:
    """'cost model: ...' in one line: the first note (which bundle, or the roofline) whole, each other
    one cut before its first ':' or '('; with --verbose every note whole (provenance.json and --json
    always keep them whole)."""
    notes = list(notes)
    if verbose or len(notes) < 2:
        return "cost model: " + "; ".join(notes)
    rest = [re.split(r"[:(]", n, maxsplit=1)[0].strip() for n in notes[1:]]
    return "cost model: " + "; ".join([notes[0]] + rest) + " (--verbose: the whole notes)"


def table(rows: list[list[str]]) -> list[str]:
    """Rows of cells as aligned lines: the first column left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


def cache_note(designs, w) -> str:
    """A header's words for the chunk cache where a design in `designs` (names) keeps one: its capacity
    per (layer, KV head), in tokens and in budgets, and 'in fp8 (e4m3)' for cache_bits 8; '' otherwise."""
    from ddbench.core.designs import get_design
    if not any(get_design(d).chunk_cache for d in designs):
        return ""

    def get(key, default=None):
        return w.get(key, default) if isinstance(w, dict) else getattr(w, key, default)
    cache, budget, bits = int(get("cache_tokens")), int(get("budget")), int(get("cache_bits", 16))
    fp8 = " in fp8 (e4m3)" if bits == 8 else ""
    return f", chunk cache {cache} tokens per layer and KV head ({cache / budget:g}x the budget){fp8}"


def kv_note(kv_bits: int) -> str:
    """A header's word for the host KV's precision: ', KV fp8 (e4m3) on the host and the link' for 8 bits."""
    return ", KV fp8 (e4m3) on the host and the link" if kv_bits == 8 else ""


def index_note(index) -> str:
    """A header's word for the landmark designs' selection index: '' for the flat one, else
    ', selection index fp8 (landmark designs)'."""
    return "" if index in (None, "flat") else f", selection index {index} (landmark designs)"

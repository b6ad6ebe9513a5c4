"""The CLI's subcommands, one module each; shared bits of their text output below."""

from __future__ import annotations

import re


def cost_model_line(notes, verbose: bool = False) -> str:
    """'cost model: ...' in one line: the first note (which bundle, or the roofline) whole, each other
    one cut before its first ':' or '('; with --verbose every note whole (provenance.json and --json
    always keep them whole)."""
    notes = list(notes)
    if verbose or len(notes) < 2:
        return "cost model: " + "; ".join(notes)
    rest = [re.split(r"[:(]", n, maxsplit=1)[0].strip() for n in notes[1:]]
    return "cost model: " + "; ".join([notes[0]] + rest) + " (--verbose: the whole notes)"

"""argparse `type=` checkers: every flag value is checked once, where it is parsed.

Each returns a function that converts the text or raises argparse.ArgumentTypeError, which the
CLI's parser reports in one line with exit status 2. Empty text is always an error; numbers are
finite and in range; nothing is silently defaulted.

    p.add_argument("--steps", type=flags.integer(lo=1))
    p.add_argument("--top-p", type=flags.number(lo=0, lo_open=True, hi=1))
    p.add_argument("--context", type=flags.items(parse_tokens))      # a non-empty comma list
    p.add_argument("--slo", type=flags.checked(parse_slo))            # any parser raising DDBenchError
    p.add_argument("--hit-rate", type=flags.fraction_or_path())       # a number in [0, 1], or a file
    p.add_argument("--out", type=flags.plain_name())                  # letters, digits, ._- (no path)
"""

from __future__ import annotations

import argparse
import math
import re
import shutil

from ddbench.core.errors import DDBenchError


HELP_WIDTH = 120     # no help line wider than this, however wide the terminal (issue 46)


def _capped(formatter_class):
    """`formatter_class` wrapping at the terminal's width, but never past HELP_WIDTH characters."""
    class Capped(formatter_class):
        def __init__(self, prog, *args, width=None, **kwargs):
            width = min(width or shutil.get_terminal_size().columns - 2, HELP_WIDTH - 2)
            super().__init__(prog, *args, width=width, **kwargs)
    return Capped


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line and exits 2 (the CLI and every `python -m` tool); its
    help wraps at most HELP_WIDTH characters wide."""

    def __init__(self, *args, formatter_class=argparse.HelpFormatter, **kwargs):
        super().__init__(*args, formatter_class=_capped(formatter_class), **kwargs)

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")


def one_line(message: str) -> str:
    """`message` on one line: a line break inside it (a path or name holding one) is written as \\n."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


def _bad(text, why: str):
    return argparse.ArgumentTypeError(f"{text!r}: {why}")


def _range(lo, hi, lo_open=False, hi_open=False) -> str:
    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{'above' if lo_open else 'at least'} {lo}"
    return f"{'below' if hi_open else 'at most'} {hi}"


def _check_range(x, text, lo, hi, lo_open, hi_open=False):
    low = lo is not None and (x <= lo if lo_open else x < lo)
    high = hi is not None and (x >= hi if hi_open else x > hi)
    if low or high:
        if lo is not None and hi is not None and hi - lo <= 1e6:   # a short range: say it whole
            raise _bad(text, f"must be {_range(lo, hi, lo_open, hi_open)}")
        raise _bad(text, f"must be {_range(lo, None, lo_open) if low else _range(None, hi, hi_open=hi_open)}")
    return x


def text():
    """A non-empty string (stripped)."""
    def conv(t: str) -> str:
        if not t.strip():
            raise _bad(t, "is empty")
        return t.strip()
    return conv


def integer(lo: int | None = None, hi: int | None = None):
    def conv(t: str) -> int:
        try:
            x = int(t.strip())
        except ValueError:
            raise _bad(t, "is not a whole number") from None
        return _check_range(x, t, lo, hi, False)
    return conv


def number(lo: float | None = None, hi: float | None = None, lo_open: bool = False, hi_open: bool = False):
    """A finite float in range."""
    def conv(t: str) -> float:
        try:
            x = float(t.strip())
        except ValueError:
            raise _bad(t, "is not a number") from None
        if not math.isfinite(x):
            raise _bad(t, "must be finite")
        return _check_range(x, t, lo, hi, lo_open, hi_open)
    return conv


def checked(parse):
    """`parse(text)`, a parser that raises DDBenchError on bad input, as a type function; empty text is an
    error before it is called."""
    def conv(t: str):
        if not t.strip():
            raise _bad(t, "is empty")
        try:
            return parse(t.strip())
        except DDBenchError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return conv


def fraction_or_path():
    """A number in [0, 1] (a float), or else the name of a file (a string); empty text is an error."""
    frac = number(lo=0, hi=1)

    def conv(t: str) -> float | str:
        if not t.strip():
            raise _bad(t, "is empty: give a number in [0, 1] or a file")
        try:
            float(t)
        except ValueError:
            return t.strip()
        return frac(t)
    return conv


# The engine sweep's --kv-bits, given by `python -m ddbench.kernels.engine.sweep` and by `ddbench bench engine`
ENGINE_KV_BITS_HELP = ("paper phase: comma-separated 16 (bf16) and/or 8 (fp8 e4m3 host KV, dequantised by the"
                       " gathers): with 8, each design that keeps its KV on the host is searched in fp8 too"
                       " (label design+fp8)")

PLAIN_NAME = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9._\-]*")


def plain_name():
    """A name that is no path: letters, digits and ._-, not starting with '.'."""
    def conv(t: str) -> str:
        if not PLAIN_NAME.fullmatch(t):
            raise _bad(t, "must be a plain name: letters, digits and ._-, not starting with '.'")
        return t
    return conv


def items(conv=None, unique: bool = False):
    """A non-empty comma list, each item converted by `conv` (a type function or a DDBenchError raiser);
    `unique`: an item given twice is an error (e.g. a seed: the same run twice)."""
    conv = conv or text()

    def parse(t: str) -> tuple:
        parts = [p.strip() for p in t.split(",")]
        if not t.strip() or any(not p for p in parts):
            raise _bad(t, "is an empty list or has an empty item")
        out = []
        for p in parts:
            try:
                out.append(conv(p))
            except DDBenchError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None
        if unique and len(set(out)) < len(out):
            twice = next(x for i, x in enumerate(out) if x in out[:i])
            raise _bad(t, f"gives {twice} twice (each item once)")
        return tuple(out)
    return parse

"""Progress bars: on a terminal only, never in a pipe or a file, and none with --quiet.

`bar(...)` takes tqdm's arguments and returns a tqdm bar on stderr that is disabled unless stderr is
a terminal and `quiet` is false; `say(bar, line)` prints a line above a live bar, or plainly where
there is none, so an error after a bar has started still takes one line. `quiet_third_party()`
silences the bars of transformers and huggingface_hub (GGUF loading) for --quiet or a non-terminal.
"""

from __future__ import annotations

import os
import sys


def on_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def bar(iterable=None, *, quiet: bool = False, **kw):
    """A tqdm bar on stderr, shown only on a terminal and without `quiet`."""
    from tqdm import tqdm

    kw.setdefault("file", sys.stderr)
    kw.setdefault("dynamic_ncols", True)
    return tqdm(iterable, disable=quiet or not on_terminal(), **kw)


def say(b, line: str) -> None:
    """One line on stderr, above `b` where it is live."""
    if b is not None and not getattr(b, "disable", True):
        b.write(line, file=sys.stderr)
    else:
        print(line, file=sys.stderr, flush=True)


def quiet_third_party(quiet: bool) -> None:
    """Silence third-party bars (transformers, huggingface_hub, the GGUF loader's plain tqdm) unless they
    would go to a terminal. Call it before anything imports tqdm: tqdm reads TQDM_DISABLE at import."""
    if not (quiet or not on_terminal()):
        return
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["TQDM_DISABLE"] = "1"
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()

"""Atomic file writes: write to a temporary file beside the target, then rename,
so that an error never leaves a half-written file."""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager


@contextmanager
def atomic_path(path: str):
    """Yield a temporary path in the target's folder; rename it over `path` on success."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.splitext(path)[1], dir=folder)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text(path: str, text: str) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)


def write_json(path: str, obj) -> None:
    write_text(path, json.dumps(obj, indent=1, sort_keys=False) + "\n")

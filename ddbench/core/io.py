"""Writing outputs without leaving a mess or a lie.

- `atomic_path` / `write_text` / `write_json`: write a temporary file beside the target, then rename,
  so an error never leaves a half-written file; the file gets the mode an ordinary `open` would
  (0o666 less the umask), not mkstemp's 0600.
- `write_json` / `dumps_json`: strict JSON. NaN and Infinity are refused (`allow_nan=False`): a value
  that does not exist is written as null with a reason beside it by the caller.
- `run_folder(out, force)`: a command's output folder built in a temporary folder beside it and
  renamed into place when complete; a non-empty folder is refused unless `force`, and even then
  only a folder an earlier run wrote (it holds the marker file `.ddbench-run`) is replaced, so
  `--out . --force` cannot delete a working folder; an error or Ctrl-C leaves nothing behind.
  Any command may use it (simulate, figures, calibrate, bench).

Errors a user can cause (an empty, unwritable or occupied --out) are one-line DDBenchErrors.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager

from ddbench.core.errors import DDBenchError


def umask() -> int:
    """The process umask (read by setting it and setting it back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _chmod_default(path: str, directory: bool = False) -> None:
    os.chmod(path, (0o777 if directory else 0o666) & ~umask())


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


@contextmanager
def atomic_path(path: str):
    """Yield a temporary path in the target's folder; rename it over `path` on success."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.splitext(path)[1], dir=folder)
    except OSError as exc:
        raise DDBenchError(f"cannot write {path}: {_why(exc)}") from None
    os.close(fd)
    try:
        _chmod_default(tmp)
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text(path: str, text: str) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)


def dumps_json(obj, indent: int | None = 1) -> str:
    """Strict JSON text: ValueError on NaN or Infinity anywhere in `obj`."""
    return json.dumps(obj, indent=indent, allow_nan=False)


def write_json(path: str, obj) -> None:
    write_text(path, dumps_json(obj) + "\n")


def check_out(out: str, what: str = "--out") -> str:
    """The absolute output path, or a one-line DDBenchError for an empty one."""
    if out is None or not str(out).strip():
        raise DDBenchError(f"{what} is empty: name an output folder")
    return os.path.abspath(os.path.expanduser(str(out)))


RUN_MARKER = ".ddbench-run"


def _occupied(path: str) -> bool:
    return os.path.isdir(path) and bool(os.listdir(path))


@contextmanager
def run_folder(out: str, force: bool = False, what: str = "--out"):
    """Yield a fresh temporary folder beside `out`; when the block ends without an error, it
    replaces `out` whole. A non-empty `out` is refused unless `force` (then the old contents go
    only once the new set is complete). On any error or KeyboardInterrupt the temporary folder
    is removed and `out` is left as it was."""
    path = check_out(out, what)
    if os.path.exists(path) and not os.path.isdir(path):
        raise DDBenchError(f"{what} {out} exists and is not a folder")
    if _occupied(path):
        if not force:
            raise DDBenchError(f"{what} {out} is not empty; pass --force to replace it, or choose another folder")
        if not os.path.exists(os.path.join(path, RUN_MARKER)):
            raise DDBenchError(f"{what} {out} is not empty and was not written by ddbench (no {RUN_MARKER});"
                               f" refusing to replace it even with --force")
    parent, name = os.path.split(path)
    if not name:
        raise DDBenchError(f"{what} {out} is a filesystem root")
    above = parent
    while not os.path.exists(above) and os.path.dirname(above) != above:
        above = os.path.dirname(above)
    if not os.path.isdir(above):
        raise DDBenchError(f"cannot write {what} {out}: {above} is not a folder")
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
    except OSError as exc:
        raise DDBenchError(f"cannot write {what} {out}: {_why(exc)}") from None
    old = None
    try:
        _chmod_default(tmp, directory=True)
        write_text(os.path.join(tmp, RUN_MARKER), "written by ddbench; `--force` may replace this folder\n")
        yield tmp
        try:
            if os.path.exists(path):
                old = tempfile.mkdtemp(prefix=f".{name}.old-", dir=parent)
                os.replace(path, os.path.join(old, name))
            os.replace(tmp, path)
        except OSError as exc:
            if old is not None and not os.path.exists(path):  # put the old set back
                os.replace(os.path.join(old, name), path)
            raise DDBenchError(f"cannot write {what} {out}: {_why(exc)}") from None
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

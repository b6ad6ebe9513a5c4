"""Writing outputs without leaving a mess or a lie.

- `atomic_path` / `write_text` / `write_json`: write a temporary file beside the target, then rename,
  so an error never leaves a half-written file; the file gets the mode an ordinary `open` would
  (0o666 less the umask), not mkstemp's 0600.
- `rows_csv` / `write_rows_csv`: the one CSV writer of rows (dicts): named columns, then the same
  fields on every row (provenance).
- `write_json` / `dumps_json`: strict JSON. NaN and Infinity are refused (`allow_nan=False`): a value
  that does not exist is written as null with a reason beside it by the caller.

A command's outputs go through the output guard, ddbench/core/outputs.py, which decides what may be
written where; these helpers only write one file safely.
"""

from __future__ import annotations

import csv
import io
import json
import os
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


def rows_csv(rows, columns, extra: dict | None = None, fmt=None, lineterminator: str = "\n",
             strict: bool = False) -> str:
    """`rows` (dicts) as CSV text of `columns` (a row's missing field: empty, or a KeyError with `strict`;
    `fmt(value)`, where given, writes each of them), then `extra`'s fields (the same on every row:
    provenance)."""
    extra = extra or {}
    buf = io.StringIO()
    wr = csv.DictWriter(buf, fieldnames=list(columns) + list(extra), lineterminator=lineterminator)
    wr.writeheader()
    for r in rows:
        vals = {c: r[c] if strict else r.get(c) for c in columns}
        wr.writerow({**(vals if fmt is None else {c: fmt(v) for c, v in vals.items()}), **extra})
    return buf.getvalue()


def write_rows_csv(path: str, rows, columns, extra: dict) -> None:
    """rows_csv into `path` (a staged file of the output guard), lines ending CRLF as csv writes them by
    default (the GPU benchmarks' tables)."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        fh.write(rows_csv(rows, columns, extra, lineterminator="\r\n"))


def read_json_object(path, what: str, missing: str = "") -> dict:
    """A JSON file whose top level is an object, or a one-line DDBenchError naming `what` and the file: not
    there (`missing` says how to make it), not UTF-8, not JSON (with the line), nested too deeply, not an object."""
    path = str(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise DDBenchError(f"{path}: no such file{f' ({missing})' if missing else ''}") from None
    except OSError as exc:
        raise DDBenchError(f"cannot read {what} {path}: {_why(exc)}") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise DDBenchError(f"malformed {what} {path}: not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise DDBenchError(f"malformed {what} {path}: line {exc.lineno}: {exc.msg}") from None
    except RecursionError:
        raise DDBenchError(f"malformed {what} {path}: nested too deeply") from None
    if not isinstance(doc, dict):
        raise DDBenchError(f"malformed {what} {path}: the top level is not a JSON object")
    check_depth(doc, f"malformed {what} {path}")
    return doc


def read_mapping(path, name: str, fields: str) -> dict:
    """A YAML or JSON file (JSON where it ends in .json) whose top level is a mapping, or a one-line
    DDBenchError that starts with `name` (e.g. "config plan.yaml"): unreadable, not UTF-8, not valid JSON
    or YAML (with the line), or not a mapping (of `fields`: e.g. "flags to values")."""
    path = str(path)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise DDBenchError(f"{name}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise DDBenchError(f"{name}: not a text file (UTF-8 YAML or JSON)") from None
    try:
        if path.lower().endswith(".json"):
            raw = json.loads(text)
        else:
            raw = load_yaml(text)
    except ValueError as exc:     # json.JSONDecodeError is a ValueError
        raise DDBenchError(f"{name}: not valid JSON ({exc})") from None
    except RecursionError:
        raise DDBenchError(f"{name}: nested too deeply (at most {MAX_DEPTH} levels)") from None
    except DDBenchError as exc:
        raise DDBenchError(f"{name}: {exc}") from None
    except Exception as exc:      # noqa: BLE001 - yaml.YAMLError and its constructor errors
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise DDBenchError(f"{name}: not valid YAML{where}") from None
    if not isinstance(raw, dict):
        raise DDBenchError(f"{name}: expected a mapping of {fields}, got {type(raw).__name__}")
    check_depth(raw, name)
    return raw


def load_yaml(text):
    """yaml.safe_load, but a number in exponent form without a dot (1e9, 5e-3) is a number, as in YAML 1.2
    and JSON (PyYAML's YAML 1.1 reads it as text); a quoted "1e9" stays text."""
    import re
    try:
        import yaml
    except ImportError:
        raise DDBenchError("reading YAML needs pyyaml, not installed here: pip install -e '.[plan]'"
                           " (or give the file as JSON)") from None

    class Loader(yaml.SafeLoader):
        yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
                                 list("-+0123456789"))
    return yaml.load(text, Loader=Loader)      # noqa: S506 - a SafeLoader


MAX_DEPTH = 32      # levels of nesting a file a user writes may have (none of ddbench's needs more than 4)


def check_depth(obj, name: str, limit: int = MAX_DEPTH) -> None:
    """A one-line DDBenchError where `obj` (parsed JSON or YAML) nests lists and mappings deeper than `limit`;
    walked without recursion, so no depth makes it fail otherwise."""
    todo = [(obj, 1)]
    while todo:
        x, d = todo.pop()
        if isinstance(x, (dict, list)):
            if d > limit:
                raise DDBenchError(f"{name}: nested too deeply (at most {limit} levels)")
            todo.extend((v, d + 1) for v in (x.values() if isinstance(x, dict) else x))


def records(doc: dict, key: str, fields, path, what: str) -> list:
    """doc[key] (absent: []) as a list of objects that each hold `fields`, or a one-line DDBenchError."""
    items = doc.get(key, [])
    if not isinstance(items, list):
        raise DDBenchError(f"malformed {what} {path}: '{key}' is not a list")
    for i, item in enumerate(items):
        if not isinstance(item, dict) or any(f not in item for f in fields):
            raise DDBenchError(f"malformed {what} {path}: {key}[{i}] is not a record with {', '.join(fields)}")
    return items

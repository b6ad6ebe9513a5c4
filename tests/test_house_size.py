"""The house's size limits (issue 30, part 6): no source file outside tests/ over 600 lines, and at most 8
functions over 80 lines, in ddbench/, kernels/, sim/ and devtools/."""

from __future__ import annotations

import ast
import os

from tests.cli import ROOT

PACKAGES = ("ddbench", "kernels", "sim", "devtools")
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
MAX_LONG_FUNCTIONS = 8


def _sources():
    for top in PACKAGES:
        for d, dirs, names in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [x for x in dirs if x != "__pycache__"]
            for n in names:
                if n.endswith(".py"):
                    yield os.path.join(d, n)


def long_functions(path: str) -> list[tuple[int, str]]:
    """(lines, name) of each function of a file longer than MAX_FUNCTION_LINES."""
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    return [(n.end_lineno - n.lineno + 1, n.name) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]


def test_no_source_file_over_600_lines():
    big = {}
    for p in _sources():
        with open(p, encoding="utf-8") as fh:
            n = sum(1 for _ in fh)
        if n > MAX_FILE_LINES:
            big[os.path.relpath(p, ROOT)] = n
    assert not big, f"files over {MAX_FILE_LINES} lines: {big}"


def test_at_most_8_functions_over_80_lines():
    found = [(os.path.relpath(p, ROOT), name, n) for p in _sources() for n, name in long_functions(p)]
    assert len(found) <= MAX_LONG_FUNCTIONS, f"{len(found)} functions over {MAX_FUNCTION_LINES} lines: {found}"


def test_the_measure_sees_a_long_function(tmp_path):
    """Negative control: a function of 81 lines is counted, one of 80 is not."""
    body = "\n".join(f"    x{i} = {i}" for i in range(79))
    p = tmp_path / "long.py"
    p.write_text(f"def long():\n{body}\n    return 0\n\ndef short():\n" + "\n".join(f"    y{i} = {i}" for i in range(78))
                 + "\n    return 0\n")
    assert long_functions(str(p)) == [(81, "long")]

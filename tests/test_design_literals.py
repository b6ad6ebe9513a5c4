"""No design name is written as a string in the product code outside the registry (issue 45): code that must name
one design imports its constant from ddbench/core/designs.py (SHADOWKV, DUALDECODER_CACHE, ...) or a group
(paper_designs(), ablations(), cache_designs(), ...), and behaviour follows a design's switches, never its name.

The product code is ddbench/, kernels/ and sim/; every string constant (f-string pieces included) equal to a
registered design's name is a finding. Strings that merely contain one (paper keys such as
"fig2.shadowkv.8b.max_batch", help text, docstrings) are fine."""

import ast
from pathlib import Path

from ddbench.core.designs import BUILTIN

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("ddbench", "kernels", "sim")
ALLOWED = (
    "ddbench/core/designs.py",           # the registry: the names, once
    # removed by the figures branch
    "ddbench/experiments/", "ddbench/doctables/",
)


def literals(source: str, names) -> list[tuple[int, str]]:
    """(line, name) of every string constant of `source` that equals one of `names`."""
    return [(n.lineno, n.value) for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names]


def product_files():
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not rel.startswith(ALLOWED):
                yield rel, path


def test_the_scan_finds_a_name_and_only_a_whole_one():
    src = 'A = "shadowkv"\nB = f"dualdecoder{1}"\nC = "fig2.shadowkv.8b.max_batch"\n"""a docstring on full-kv"""\n'
    assert literals(src, BUILTIN) == [(1, "shadowkv"), (2, "dualdecoder")]


def test_no_design_name_literal_in_the_product_code():
    files = list(product_files())
    assert len(files) > 100 and any(rel.startswith("kernels/engine/") for rel, _ in files)
    found = [f"{rel}:{line}: {name!r}" for rel, path in files
             for line, name in literals(path.read_text(encoding="utf-8"), BUILTIN)]
    assert not found, ("design names written as strings (import the registry's constant or group instead):\n"
                       + "\n".join(found))

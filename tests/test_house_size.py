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


# ------------------------------------------------------------------ smaller calls (issue 45, part 7)

CALL_PACKAGES = ("ddbench", "kernels", "sim")
MAX_PARAMETERS = 10
PRIVATE_IMPORT_ALLOWED = ("ddbench/experiments/", "ddbench/doctables/")   # cleaned by the figures branch


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".").removesuffix(".__init__")
    return rel if rel.startswith("ddbench") else "ddbench." + rel     # kernels/, sim/: ddbench.kernels, ddbench.sim


def _is_triton_kernel(fn) -> bool:
    """@triton.jit: a kernel (or a helper a kernel calls) takes its pointers, strides and constexprs."""
    return any(ast.unparse(d).split("(")[0] == "triton.jit" for d in fn.decorator_list)


def _parameters(fn) -> int:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def wide_functions(path: str) -> list[tuple[str, int]]:
    """(name, parameters) of each function of a file, other than a Triton kernel, with more than
    MAX_PARAMETERS parameters (self / cls not counted; *args and **kwargs count one each)."""
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    return [(n.name, _parameters(n)) for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and not _is_triton_kernel(n) and _parameters(n) > MAX_PARAMETERS]


def private_imports(path: str, me: str | None = None) -> list[str]:
    """Each use of another module's _private name in the file of module `me` (default: the module of
    `path`): `from mod import _name` (mod not `me`) and `alias._name` where alias is an imported project module."""
    me = me or _module_name(path)
    pkg = me if path.endswith("__init__.py") else me.rpartition(".")[0]
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    private = lambda name: name.startswith("_") and not name.startswith("__")   # noqa: E731
    modules, found = {}, []
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom):
            src = n.module or ""
            if n.level:
                base = pkg.split(".")[:len(pkg.split(".")) - (n.level - 1)]
                src = ".".join(base + ([n.module] if n.module else []))
            for a in n.names:
                if private(a.name) and src != me:
                    found.append(f"{n.lineno}: from {src} import {a.name}")
                modules[a.asname or a.name] = f"{src}.{a.name}"
        elif isinstance(n, ast.Import):
            for a in n.names:
                modules[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and private(n.attr) and isinstance(n.value, ast.Name) \
                and n.value.id in modules and _is_project_module(modules[n.value.id]):
            found.append(f"{n.lineno}: {n.value.id}.{n.attr} ({modules[n.value.id]})")
    return found


def _is_project_module(name: str) -> bool:
    parts = name.split(".")
    if parts[:1] in (["kernels"], ["sim"]):
        parts = ["ddbench"] + parts
    base = os.path.join(ROOT, *(["kernels", *parts[2:]] if parts[1:2] == ["kernels"] else
                                ["sim", *parts[2:]] if parts[1:2] == ["sim"] else parts)) if parts[:1] == ["ddbench"] \
        else None
    return base is not None and (os.path.isfile(base + ".py") or os.path.isfile(os.path.join(base, "__init__.py")))


def _call_sources():
    for top in CALL_PACKAGES:
        for d, dirs, names in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [x for x in dirs if x != "__pycache__"]
            for n in names:
                if n.endswith(".py"):
                    yield os.path.join(d, n)


def test_no_function_takes_more_than_10_parameters():
    """Config objects instead of long parameter lists; a @triton.jit kernel is exempt (and only it)."""
    found = [(os.path.relpath(p, ROOT), name, n) for p in _call_sources() for name, n in wide_functions(p)]
    assert not found, f"functions with more than {MAX_PARAMETERS} parameters: {found}"


def test_no_module_imports_another_modules_private_names():
    """Public names across modules: no `from mod import _name`, no `mod._name`, outside the allowlist."""
    found = {}
    for p in _call_sources():
        rel = os.path.relpath(p, ROOT).replace(os.sep, "/")
        if not rel.startswith(PRIVATE_IMPORT_ALLOWED):
            found.update({f"{rel}:{x}": 1 for x in private_imports(p)})
    assert not found, f"imports of other modules' private names: {sorted(found)}"


def test_the_call_measures_see_what_they_look_for(tmp_path):
    """Negative controls: 11 parameters are counted (self is not; a @triton.jit kernel is exempt); a private
    name imported from another project module, or read through its module, is found; a module's own is not."""
    p = tmp_path / "wide.py"
    args = ", ".join(f"a{i}" for i in range(11))
    p.write_text(f"import triton\n\ndef wide({args}):\n    pass\n\n\ndef narrow(a0, *rest, **kw):\n    pass\n\n\n"
                 f"class C:\n    def method(self, {', '.join(f'a{i}' for i in range(10))}):\n        pass\n\n\n"
                 f"@triton.jit\ndef kernel({args}):\n    pass\n")
    assert wide_functions(str(p)) == [("wide", 11)]
    mod = tmp_path / "probe.py"
    mod.write_text("from ddbench.kernels.select import _hidden, shown\nfrom . import ops\n"
                   "from .probe import _mine\nx = ops._table\ny = ops.shown\nimport os\nz = os._exit\n")
    assert private_imports(str(mod), "ddbench.kernels.engine.probe") == [
        "1: from ddbench.kernels.select import _hidden", "4: ops._table (ddbench.kernels.engine.ops)"]

"""The layering of README's Layout section, read from the source with ast (lazy imports included):

    ddbench.core  <-  sim, kernels  <-  the rest of ddbench (CLI, experiments, planner, profiler)

core imports nothing of the project outside itself; sim and kernels import only the core (and
themselves); the component graph has no cycle, nor do the core's modules: every import counts,
at the top of a file or inside a function, and `from pkg import mod` is an import of pkg.mod."""

import ast
import graphlib
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROJECT = ("ddbench", "sim", "kernels")


def _modules():
    for top in PROJECT:
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(folder, f)
                    mod = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".").removesuffix(".__init__")
                    yield mod, path


def _imports(mod: str, path: str, known=frozenset()):
    """(imported module, line) for every project import anywhere in the file (lazy ones included);
    `from pkg import name` counts as an import of pkg.name where that is a module in `known`."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    pkg = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            names = [f"{source}.{a.name}" if f"{source}.{a.name}" in known else source for a in node.names]
        else:
            continue
        for n in names:
            if n and n.split(".")[0] in PROJECT:
                yield n, node.lineno


def component(mod: str) -> str:
    if mod == "ddbench.core" or mod.startswith("ddbench.core."):
        return "core"
    if mod.split(".")[0] in ("sim", "kernels"):
        return mod.split(".")[0]
    return "cli"  # ddbench itself: commands, experiments, planner, profiler, reports


ALLOWED = {"core": {"core"}, "sim": {"core", "sim"}, "kernels": {"core", "kernels"},
           "cli": {"core", "sim", "kernels", "cli"}}


def component_graph():
    edges, bad = {}, []
    for mod, path in _modules():
        src = component(mod)
        for target, line in _imports(mod, path):
            dst = component(target)
            edges.setdefault(src, set()).add(dst)
            if dst not in ALLOWED[src]:
                bad.append(f"{os.path.relpath(path, ROOT)}:{line} ({src}) imports {target} ({dst})")
    return edges, bad


def test_layers_import_only_downwards():
    edges, bad = component_graph()
    assert bad == []
    assert edges["sim"] - {"sim"} == {"core"} and edges["kernels"] - {"kernels"} == {"core"}
    graph = {k: v - {k} for k, v in edges.items()}
    order = list(graphlib.TopologicalSorter(graph).static_order())  # CycleError on a cycle
    assert order.index("core") < order.index("sim") < order.index("cli")


def core_graph() -> dict:
    """module -> the core modules it imports (anywhere in the file)."""
    core = {mod: path for mod, path in _modules() if component(mod) == "core"}
    return {mod: {t for t, _ in _imports(mod, path, frozenset(core)) if t in core and t != mod}
            for mod, path in core.items()}


def test_core_modules_have_no_import_cycle():
    try:
        list(graphlib.TopologicalSorter(core_graph()).static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle among core modules: {' -> '.join(exc.args[1])}")


def test_cycle_checker_sees_a_lazy_cycle(tmp_path, monkeypatch):
    """A cycle through a function-level import, or through `from pkg import mod`, is found."""
    core = tmp_path / "ddbench" / "core"
    core.mkdir(parents=True)
    (core / "a.py").write_text("from ddbench.core.b import x\n")
    (core / "b.py").write_text("x = 1\n\n\ndef f():\n    from ddbench.core import a\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    graph = core_graph()
    assert graph["ddbench.core.a"] == {"ddbench.core.b"} and graph["ddbench.core.b"] == {"ddbench.core.a"}
    with pytest.raises(graphlib.CycleError):
        list(graphlib.TopologicalSorter(graph).static_order())


def test_checker_sees_a_violation(tmp_path, monkeypatch):
    """The checker is not vacuous: a core module importing sim is reported."""
    bad = tmp_path / "ddbench" / "core"
    bad.mkdir(parents=True)
    (bad / "oops.py").write_text("def f():\n    from sim.steplayers import step_layers\n")
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "x.py").write_text("from ddbench.commands import simulate\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    _, found = component_graph()
    assert len(found) == 2 and "imports sim.steplayers (sim)" in found[0] + found[1]


@pytest.mark.parametrize("module", ["ddbench.core.memory", "ddbench.core.calibration", "ddbench.core.schemas",
                                    "ddbench.core.workload", "ddbench.core.traces", "ddbench.core.catalog",
                                    "ddbench.core.designs", "ddbench.core.defaults", "ddbench.core.flags"])
def test_importing_core_loads_nothing_else(module):
    code = (f"import sys, {module}; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('sim', 'kernels', 'torch', 'triton', 'simpy') or (m.startswith('ddbench.') and "
            "not m.startswith('ddbench.core'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_one_length_grammar():
    """`128k | uniform:LO:HI | exp:MEAN` is parsed in one place (ddbench.core.distribution)."""
    import random

    from ddbench.core.distribution import Distribution
    from ddbench.core.errors import DDBenchError
    from ddbench.planner.scenario import context_bounds
    from sim.serving import parse_dist
    assert context_bounds("uniform:64k:128k") == (65536, 131072) and context_bounds("exp:4k") == (None, None)
    assert Distribution.parse("128k").high == 131072
    assert parse_dist("uniform:1:3", "output")(random.Random(0)) in (1, 2, 3)
    for bad in ("uniform:2k", "uniform:4k:2k", "exp:", "zero"):
        with pytest.raises(DDBenchError):
            Distribution.parse(bad)

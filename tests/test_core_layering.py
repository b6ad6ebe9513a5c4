"""The layering of README's Layout section, read from the source with ast (lazy imports included):

    ddbench.core  <-  sim, kernels  <-  the rest of ddbench (CLI, experiments, planner, profiler)

core imports nothing of the project outside itself; sim and kernels import only the core (and
themselves); the component graph has no cycle, nor do the modules of the core, of sim/ or of
kernels/. Every import counts, at the top of a file or inside a function, and `from pkg import mod`
is an import of pkg.mod: a function-level (lazy) import is a dependency all the same, it only moves
the failure to run time, and `farm-studio look` draws it as an arrow too, so a circle through one is a
circle here. Inside sim/, the pricing (the cost model and everything it stands on) imports nothing
that fits or validates (sim/fit/, sim/validate.py): fit once, price many."""

import ast
import graphlib
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROJECT = ("ddbench", "sim", "kernels")          # the folders; sim/ and kernels/ import as ddbench.sim, ddbench.kernels
SUBPACKAGES = ("sim", "kernels")


def _modules():
    for top in PROJECT:
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(folder, f)
                    mod = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".").removesuffix(".__init__")
                    yield (f"ddbench.{mod}" if top in SUBPACKAGES else mod), path


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
    parts = mod.split(".")
    if parts[0] in SUBPACKAGES:
        return "old name"   # the top-level name of before ddbench.sim / ddbench.kernels: never imported
    if len(parts) > 1 and parts[1] in SUBPACKAGES:
        return parts[1]
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


def module_graph(components=("core",)) -> dict:
    """module -> the modules of the same components it imports (anywhere in the file)."""
    mods = {mod: path for mod, path in _modules() if component(mod) in components}
    return {mod: {t for t, _ in _imports(mod, path, frozenset(mods)) if t in mods and t != mod}
            for mod, path in mods.items()}


def core_graph() -> dict:
    """module -> the core modules it imports (anywhere in the file)."""
    return module_graph(("core",))


def _cycle(graph) -> str | None:
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        return " -> ".join(exc.args[1])
    return None


@pytest.mark.parametrize("components", [("core",), ("sim",), ("kernels",)])
def test_modules_have_no_import_cycle(components):
    cycle = _cycle(module_graph(components))
    assert cycle is None, f"import cycle among {components[0]} modules: {cycle}"


def _closure(graph, roots) -> set:
    seen, todo = set(), list(roots)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += sorted(graph.get(m, ()))
    return seen


PRICING = tuple(f"ddbench.sim.{m}" for m in ("costmodel", "steplayers", "factory", "fitted", "aggregate", "timeline",
                                             "serving", "resources", "hitrates"))


def test_pricing_imports_nothing_that_fits_or_validates():
    graph = module_graph(("sim",))
    assert set(PRICING) <= set(graph)
    reached = _closure(graph, PRICING)
    bad = sorted(m for m in reached if m in ("ddbench.sim.validate", "ddbench.sim.fit") or m.startswith("ddbench.sim.fit."))
    assert bad == [], f"the pricing reaches {bad}"
    # the fits and the validation do stand on the pricing (the test is not vacuous)
    assert "ddbench.sim.costmodel" in _closure(graph, ["ddbench.sim.fit.fitfile"])
    assert "ddbench.sim.fit.validation" in graph["ddbench.sim.validate"]


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


def test_cycle_checker_sees_a_sim_cycle_and_pricing_that_fits(tmp_path, monkeypatch):
    """A circle of sim/ or kernels/ through a lazy import is found, and so is a cost model that reaches sim/fit/."""
    (tmp_path / "sim" / "fit").mkdir(parents=True)
    (tmp_path / "sim" / "costmodel.py").write_text("def f():\n    from ddbench.sim.fit import enginefit\n")
    (tmp_path / "sim" / "fit" / "enginefit.py").write_text("from ddbench.sim.costmodel import f\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    graph = module_graph(("sim",))
    assert graph["ddbench.sim.costmodel"] == {"ddbench.sim.fit.enginefit"}
    assert graph["ddbench.sim.fit.enginefit"] == {"ddbench.sim.costmodel"}
    assert _cycle(graph) is not None
    assert "ddbench.sim.fit.enginefit" in _closure(graph, ["ddbench.sim.costmodel"])
    (tmp_path / "kernels" / "engine").mkdir(parents=True)
    (tmp_path / "kernels" / "engine" / "paper.py").write_text("def g():\n    from ddbench.kernels.engine import sweep\n")
    (tmp_path / "kernels" / "engine" / "sweep.py").write_text("from ddbench.kernels.engine import paper\n")
    assert _cycle(module_graph(("kernels",))) is not None


def test_no_module_imports_the_old_top_level_names():
    """sim/ and kernels/ are ddbench.sim and ddbench.kernels: a bare `import sim` or `from kernels...`
    would load a second copy of a module (or another distribution's package of that name)."""
    _, bad = component_graph()
    old = [b for b in bad if b.endswith("(old name)")]
    assert old == []


def test_the_old_names_are_seen(tmp_path, monkeypatch):
    """Negative control: a lazy `from kernels.gather import x` in sim/ is reported."""
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "x.py").write_text("def f():\n    from kernels.gather import gather_uva\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    _, found = component_graph()
    assert len(found) == 1 and found[0].endswith("imports kernels.gather (old name)")


def test_checker_sees_a_violation(tmp_path, monkeypatch):
    """The checker is not vacuous: a core module importing sim is reported."""
    bad = tmp_path / "ddbench" / "core"
    bad.mkdir(parents=True)
    (bad / "oops.py").write_text("def f():\n    from ddbench.sim.steplayers import step_layers\n")
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "x.py").write_text("from ddbench.commands import simulate\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    _, found = component_graph()
    assert len(found) == 2 and "imports ddbench.sim.steplayers (sim)" in found[0] + found[1]


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
    from ddbench.planner.scenario import Scenario
    sc = Scenario(model="llama-3-8b", gpu="h200", context="uniform:64k:128k")
    assert (sc.contexts.low, sc.contexts.high) == (65536, 131072)
    assert (Distribution.parse("exp:4k").low, Distribution.parse("exp:4k").high) == (None, None)
    assert Distribution.parse("128k").high == 131072
    assert Distribution.parse("uniform:1:3", "output").sample(random.Random(0)) in (1, 2, 3)
    for bad in ("uniform:2k", "uniform:4k:2k", "exp:", "zero"):
        with pytest.raises(DDBenchError):
            Distribution.parse(bad)

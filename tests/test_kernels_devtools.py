"""devtools/, the device checks kept beside the product (CPU): not shipped by the package build, every
project import they make (lazy ones inside functions included) resolves, each refuses in one line
without a CUDA GPU, and the fp32 / fp16 scores A/B swaps only the engine's selection ops."""

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import pathlib
import re
import types

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEVTOOLS = ROOT / "devtools"
SCRIPTS = sorted(p.stem for p in DEVTOOLS.glob("*.py") if not p.stem.startswith("_"))
PROJECT = ("kernels", "ddbench", "devtools")


def setup_kwargs(monkeypatch) -> dict:
    """What setup.py passes to setuptools.setup (run with setup() caught)."""
    import runpy

    setuptools = pytest.importorskip("setuptools")
    seen = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: seen.update(kw))
    runpy.run_path(str(ROOT / "setup.py"))
    return seen


def test_devtools_is_not_shipped(monkeypatch):
    """setup.py's packages: ddbench, and kernels/ and sim/ as ddbench.kernels and ddbench.sim (their
    namespace subpackages too), nothing of devtools and no other top-level name; MANIFEST.in does not
    add devtools to the sdist."""
    kw = setup_kwargs(monkeypatch)
    found = kw["packages"]
    assert {"ddbench", "ddbench.core", "ddbench.kernels", "ddbench.kernels.engine", "ddbench.sim",
            "ddbench.sim.fit"} <= set(found)
    assert {p.split(".")[0] for p in found} == {"ddbench"}
    assert kw["package_dir"] == {"ddbench.kernels": "kernels", "ddbench.sim": "sim"}
    assert "devtools" not in (ROOT / "MANIFEST.in").read_text()
    assert SCRIPTS, "devtools/ holds no scripts"


def _project_imports(path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PROJECT:
            yield node.module, [a.name for a in node.names], node.lineno
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in PROJECT:
                    yield a.name, [], node.lineno


@pytest.mark.parametrize("script", SCRIPTS)
def test_imports_resolve(script):
    bad = []
    for mod, names, line in _project_imports(DEVTOOLS / f"{script}.py"):
        try:
            m = importlib.import_module(mod)
        except ImportError as exc:
            bad.append(f"{script}.py:{line}: {mod} ({exc})")
            continue
        for n in names:
            if not hasattr(m, n) and importlib.util.find_spec(f"{mod}.{n}") is None:
                bad.append(f"{script}.py:{line}: {mod}.{n}")
    assert bad == []


@pytest.mark.parametrize("script", SCRIPTS)
def test_refuses_without_gpu(script, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    main = importlib.import_module(f"devtools.{script}").main
    args = {"devcheck": ["spec"], "devcheck_engine_ab": ["--switch", "yield_prefetch"]}.get(script, [])
    assert (main(args) if inspect.signature(main).parameters else main()) == 2
    assert capsys.readouterr().err.strip() == f"{script}: needs a CUDA GPU"


def test_refusal(monkeypatch):
    """The one-line refusals: no CUDA GPU, or fewer than one repetition."""
    from devtools._common import refusal
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert refusal("devcheck_x", 3) == "devcheck_x: needs a CUDA GPU"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert refusal("devcheck_x", 0) == "devcheck_x: --reps must be at least 1"
    assert refusal("devcheck_x", 1) is None and refusal("devcheck_x") is None


@pytest.mark.parametrize("script", ["devcheck_engine_ab", "devcheck_cachefill", "devcheck_shadowkv"])
@pytest.mark.parametrize("points", ["131072:abc", "131072", "131072:0", "", "131072:8:2"])
def test_bad_points_are_one_line(script, points, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    main = importlib.import_module(f"devtools.{script}").main
    extra = ["--switch", "yield_prefetch"] if script == "devcheck_engine_ab" else []
    assert main([*extra, "--points", points]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"{script}: --points must be CONTEXT:BATCH,... of positive integers, got {points!r}"


def test_point_contexts_and_builds_are_checked(monkeypatch, capsys):
    from devtools._common import context_batches
    assert context_batches("x", "131072:8,32768:94", {131072, 32768}) == ([(131072, 8), (32768, 94)], None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    from devtools.devcheck_engine_ab import main
    assert main(["--switch", "rows_two_waves", "--points", "65536:8"]) == 2
    assert capsys.readouterr().err.strip() == "devcheck_engine_ab: contexts must be among [32768, 131072]"
    assert main(["--switch", "rows_two_waves", "--builds", "0"]) == 2
    assert capsys.readouterr().err.strip() == "devcheck_engine_ab: --builds must be at least 1"


def test_scores_ab_swaps_only_the_selection_ops():
    """devcheck_scores' variant: the engine's landmark and SpeCache selections store pass 1's scores in
    the given dtype (called as the engine calls them), every other op stays the engine's."""
    from devtools.devcheck_scores import with_scores
    from ddbench.kernels.engine import fastselect
    from ddbench.kernels.engine.engine import engine_ops
    e = types.SimpleNamespace(ops=engine_ops(False))
    before = e.ops
    with_scores(torch.float32)(e)
    changed = {f.name for f in dataclasses.fields(before) if getattr(e.ops, f.name) is not getattr(before, f.name)}
    assert changed == {"select", "spec_select"}
    assert e.ops.select.func is fastselect.select_topk and e.ops.select.keywords == {"scores": torch.float32}
    assert e.ops.spec_select.func is fastselect.specache_select_topk
    g = torch.Generator().manual_seed(0)
    q, lm = torch.randn(1, 2, 4, 16, generator=g), torch.randn(1, 2, 96, 16, generator=g)
    outs = tuple(torch.full((1, 2, 8), -7, dtype=torch.int32) for _ in range(2))
    e.ops.select(q, lm, 8, out=outs)                                       # the engine's dual-token call
    want = fastselect.select_topk(q, lm, 8, scores=torch.float32)
    assert all(torch.equal(o, want[:, t]) for t, o in enumerate(outs))

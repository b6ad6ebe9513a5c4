"""The one scenario: simulate's and plan's flags, a sweep point and the figures' scene all become the same
`Scenario`, and `resolve()` builds the same cost model, hit rates and workload from it; defaults live
in ddbench/core/defaults.py only."""

import argparse
import ast
import os
from dataclasses import fields

import pytest

from ddbench.cli import build_parser
from ddbench.core import defaults as D
from ddbench.core.errors import DDBenchError
from ddbench.core.workload import Workload
from ddbench.planner.scenario import Scenario, resolve
from ddbench.planner.scenario_args import scenarios_from_args
from ddbench.planner.spec import scenario_of
from tests.cli import ROOT


def _args(*argv):
    return build_parser().parse_args(list(argv))


def test_flags_spec_and_figures_make_one_scenario():
    plan = scenarios_from_args(_args("plan", "--model", "qwen2.5-32b", "--gpu", "h100-80gb", "--context", "128k",
                                     "--design", "shadowkv,dualdecoder", "--link", "pcie5", "--budget", "4k"),
                               D.PLAN_REQUESTS, prefill="here")
    sim = scenarios_from_args(_args("simulate", "--model", "qwen2.5-32b", "--gpu", "h100-80gb", "--link", "pcie5",
                                    "--system", "shadowkv,dualdecoder", "--budget", "4096", "--requests", "1000"),
                              D.SIM_REQUESTS, prefill="here")
    point = dict(model="qwen2.5-32b", gpu="h100-80gb", link="pcie5", host=None, fetching=None, system="dualdecoder",
                 context="128k", output="256", budget="4k", chunk=8, lowrank_layers=0, buffers="design", hit_rate=None,
                 prefill="here", requests=1000, max_batch=None)
    assert plan == sim and [s.design for s in plan] == ["shadowkv", "dualdecoder"]
    assert scenario_of(point) == plan[1] and hash(scenario_of(point)) == hash(plan[1])
    from ddbench.experiments.scene import scene
    fig = scene("qwen2.5-32b", "dualdecoder", budget=4096)
    r = resolve(plan[1])
    assert fig.workload == r.workload == Workload(context=131072, budget=4096)
    assert fig.cm is r.cm and fig.hit == r.hit and fig.hit_note == r.hit_note


def test_knobs_are_canonical():
    a = Scenario.make(model="llama-3-8b", gpu="h200", budget=2048, chunk=16)
    assert a.knobs == (("chunk", 16),) and a == Scenario.make(model="llama-3-8b", gpu="h200", chunk=16)
    assert a.knob("budget") == D.BUDGET and a.with_knobs(budget=4096).knob("budget") == 4096
    with pytest.raises(TypeError, match="not Workload knobs"):
        Scenario.make(model="llama-3-8b", gpu="h200", knobs={"temperature": 1})


def test_defaults_live_in_one_place():
    w = Workload(context=1)
    for f in fields(Workload):
        if f.name != "context":
            assert getattr(w, f.name) == getattr(D, f.name.upper()), f.name
    sc = Scenario("m", "g")
    assert (sc.design, str(sc.context), str(sc.output), sc.buffers, sc.prefill, sc.requests) == \
        (D.DESIGN, D.CONTEXT, D.OUTPUT, D.BUFFERS, D.PREFILL, D.PLAN_REQUESTS)
    sim = _args("simulate", "--model", "m", "--gpu", "g")
    assert (sim.design, str(sim.context), sim.rate, sim.seed, sim.steps) == \
        ((D.DESIGN,), D.CONTEXT, D.RATE, D.SEED, D.STEPS)
    assert _args("plan", "--model", "m", "--gpu", "g", "--context", "1k").design == ("full-kv", "shadowkv",
                                                                                       "specache", "dualdecoder",
                                                                                       "dualdecoder-cache")


@pytest.mark.parametrize("path", ["ddbench/commands/plan.py", "ddbench/commands/simulate.py",
                                  "ddbench/commands/sweep_cmd.py", "ddbench/planner/spec.py",
                                  "ddbench/planner/scenario.py", "ddbench/planner/scenario_args.py"])
def test_no_command_restates_a_workload_default(path):
    """The numbers of the Workload defaults appear as argparse/pydantic defaults nowhere but defaults.py."""
    tree = ast.parse(open(os.path.join(ROOT, path), encoding="utf-8").read())
    literal = {D.BUDGET, D.CHUNK, D.RANK, D.GEN_TOKENS, D.PREFILL_CHUNK, D.SWEEP_REQUESTS, D.PLAN_REQUESTS,
               D.SIM_REQUESTS, D.MAX_POINTS, D.RATE, D.TOL}
    bad = [(node.lineno, kw.arg) for node in ast.walk(tree) if isinstance(node, ast.Call) for kw in node.keywords
           if kw.arg == "default" and isinstance(kw.value, ast.Constant) and kw.value.value in literal]
    bad += [(node.lineno, "Field") for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "id", "") == "Field" and node.args and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in literal]
    assert bad == []


def test_the_checker_sees_a_restated_default(tmp_path):
    (tmp_path / "x.py").write_text("p.add_argument('--budget', default=2048)\n")
    tree = ast.parse((tmp_path / "x.py").read_text())
    assert any(kw.arg == "default" and kw.value.value == D.BUDGET for n in ast.walk(tree)
               if isinstance(n, ast.Call) for kw in n.keywords)


def test_resolve_rules():
    full = resolve(Scenario("llama-3-8b", "h200", design="full-kv", context="1k"))
    assert full.workload.context == 1024           # all KV on the GPU: no budget to fit in the context
    with pytest.raises(DDBenchError, match="larger than the context"):
        resolve(Scenario("llama-3-8b", "h200", design="shadowkv", context="1k"))
    with pytest.raises(DDBenchError, match="exponential context can fall below"):
        resolve(Scenario("llama-3-8b", "h200", context="exp:64k"))
    assert resolve(Scenario("llama-3-8b", "h200", design="full-kv", context="exp:64k")).workload.context == D.BUDGET
    with pytest.raises(DDBenchError, match="unknown link ''"):
        resolve(Scenario("llama-3-8b", "h200", link=""))
    with pytest.raises(DDBenchError, match="calibration root is empty"):
        resolve(Scenario("llama-3-8b", "h200", calibration=" "))
    assert resolve(Scenario("llama-3-8b", "h200", design="dualdecoder", buffers="per-layer")).design.name == \
        "dualdecoder[per-layer]"


def test_the_memory_answer_builds_no_cost_model():
    """resolve() checks names and the workload; the cost model and hit rates come on first use."""
    r = resolve(Scenario("llama-3-8b", "h200", calibration="/nonexistent"))
    assert "cm" not in vars(r)
    with pytest.raises(DDBenchError, match="no calibration bundle under /nonexistent"):
        r.check()


def test_design_aliases_parse_to_one_dest():
    for flag in ("--design", "--system"):
        args = _args("simulate", "--model", "m", "--gpu", "g", flag, "every")
        assert isinstance(args, argparse.Namespace) and len(args.design) == len(__import__("ddbench.core.designs", fromlist=["DESIGNS"]).DESIGNS) and not hasattr(args, "system")

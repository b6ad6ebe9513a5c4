"""One way into the simulator: sim.run(point, mode) is what every caller outside sim/ uses; step_layers and
run_timeline are sim's own."""

import re
from pathlib import Path

import pytest

from ddbench.core.catalog import get_model
from ddbench.core.designs import DESIGNS
from ddbench.core.errors import DDBenchError
from ddbench.core.memory import Workload
from ddbench.sim.aggregate import aggregate_step
from ddbench.sim.factory import cost_model
from ddbench.sim.run import Point, run
from ddbench.sim.steplayers import step_layers
from ddbench.sim.timeline import run_timeline

ROOT = Path(__file__).resolve().parents[1]


def test_only_sim_calls_step_layers_and_run_timeline():
    pat = re.compile(r"\b(step_layers|run_timeline|aggregate_step)\(")
    hits = [str(p.relative_to(ROOT)) for p in (ROOT / "ddbench").rglob("*.py") if pat.search(p.read_text())]
    assert hits == []


def test_modes_are_the_simulators_own_calls():
    m = get_model("llama-3-8b")
    cm = cost_model("llama-3-8b", "h200")
    d, w = DESIGNS["dualdecoder"], Workload(context=65536)
    h = [0.88] * m.num_layers
    p = Point(d, m, cm, w, 8, 65536, h, h)
    plan = step_layers(d, m, cm, w, 8, 65536, h, h)
    assert run(p, "plan") == plan
    assert run(p, "aggregate").step_s == aggregate_step(plan).step_s
    assert run(p, "timeline", steps=4).steady_step_s == run_timeline(plan, steps=4, warmup=2).steady_step_s
    assert run(plan, "timeline", steps=4).steady_step_s == run(p, "timeline", steps=4).steady_step_s
    with pytest.raises(DDBenchError, match="unknown simulation mode"):
        run(p, "serving")

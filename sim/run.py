"""The one way into the simulator for everything outside sim/: a typed point and a mode.

    from ddbench.sim.run import Point, run
    p = Point(design, model, cm, workload, batch, context, hit, reuse, lowrank=None, cache=None)
    run(p, "plan")          # the step's per-layer work (ddbench.sim.steplayers.StepLayers)
    run(p, "aggregate")     # the same step in closed form (ddbench.sim.aggregate)
    run(p, "timeline", steps=6, warmup=2, record=False)   # the per-layer timeline (ddbench.sim.timeline)

`run` also takes a plan already built (a replay's: sim/fit/replay.py replay_plan) in place of a Point.
Serving runs (Poisson arrivals, admission by memory) are ddbench.sim.serving.run_serving.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddbench.core.errors import DDBenchError

MODES = ("plan", "aggregate", "timeline")


@dataclass(frozen=True)
class Point:
    """One decode step to simulate: `batch` requests of `context` tokens of `design` on `model`, priced by
    the cost model `cm`, at per-layer `hit` and `reuse` rates (a chunk cache's: `cache`, CacheRates)."""
    design: object                 # DesignSpec
    model: object                  # ModelSpec
    cm: object                     # CostModel
    workload: object               # Workload (its knobs; batch and context are the point's own)
    batch: int
    context: float
    hit: tuple | list
    reuse: tuple | list
    lowrank: frozenset | None = None
    cache: object = None

    def plan(self):
        from ddbench.sim.steplayers import step_layers
        return step_layers(self.design, self.model, self.cm, self.workload, self.batch, self.context,
                           list(self.hit), list(self.reuse), self.lowrank, cache=self.cache)


def run(point, mode: str = "timeline", *, steps: int = 6, warmup: int = 2, record: bool = False):
    """`point` (a Point, or a StepLayers plan) simulated in `mode` (MODES)."""
    if mode not in MODES:
        raise DDBenchError(f"unknown simulation mode '{mode}'; known: {', '.join(MODES)}")
    plan = point.plan() if isinstance(point, Point) else point
    if mode == "plan":
        return plan
    if mode == "aggregate":
        from ddbench.sim.aggregate import aggregate_step
        return aggregate_step(plan)
    from ddbench.sim.timeline import run_timeline
    return run_timeline(plan, steps=steps, warmup=warmup, record=record)

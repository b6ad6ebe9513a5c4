"""The figures' scenario: each replayed figure runs a model and a design through the one
`ddbench.planner.scenario.resolve()` that simulate, plan and sweep use (its cost model, hit rates
and workload, at the defaults of ddbench/core/defaults.py), on the paper's testbed: one 80 GB
Hopper GPU on PCIe 5 (the catalog's h100-80gb; no bundle was measured on an H100, so the cost model
scales the H200 bundle op by op, and every setup line says so).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from ddbench.core.designs import DUALDECODER

GPU = "h100-80gb"
LINK = "pcie5"


@lru_cache(maxsize=None)
def scene(model: str, design: str = DUALDECODER, gpu: str = GPU, link: str = LINK, hit_rate=None, **knobs):
    """The resolved scenario (ddbench.planner.scenario.Resolved); `knobs`: Workload fields (budget=...)."""
    from ddbench.planner.scenario import Scenario, resolve
    return resolve(Scenario.make(model=model, gpu=gpu, link=link, design=design, hit_rate=hit_rate, **knobs))


def workload(r, context: int, batch: int = 1):
    """The scenario's Workload at one context and batch."""
    return replace(r.workload, context=context, batch=batch)

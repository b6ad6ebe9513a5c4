"""The experiment registry: one entry per paper figure.

An experiment computes a table (pandas DataFrame) and a list of comparisons
against the paper's reported numbers, and draws itself on a matplotlib figure.
`ddbench figures` runs them all; see ddbench/commands/figures.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ddbench.core.errors import DDBenchError, unknown


@dataclass(frozen=True)
class Comparison:
    paper_id: str      # key into traces/paper/reported.json
    ours: float        # our replayed value, in the paper number's unit
    note: str          # one line: what we computed, and why it differs if it does


@dataclass
class FigureResult:
    data: "object"                       # pandas.DataFrame, the figure's CSV
    setup: str                           # one line: the setup we replayed
    comparisons: list[Comparison] = field(default_factory=list)


@dataclass(frozen=True)
class Experiment:
    id: str
    title: str
    compute: Callable[[], FigureResult]
    draw: Callable[[FigureResult, "object"], None]   # (result, matplotlib Figure)


EXPERIMENTS: dict[str, Experiment] = {}


def register(id: str, title: str, draw: Callable):
    """Decorator for a compute function: registers Experiment(id, title, fn, draw)."""
    def wrap(fn):
        if id in EXPERIMENTS:
            raise ValueError(f"experiment {id} registered twice")
        EXPERIMENTS[id] = Experiment(id, title, fn, draw)
        return fn
    return wrap


def load_all() -> dict[str, Experiment]:
    """Import every experiment module (each registers itself) and return the registry, in MODULES' order
    (the order of figures/README.md)."""
    import importlib
    for name in MODULES:
        importlib.import_module(f"ddbench.experiments.{name}")
    return EXPERIMENTS


# the experiment modules, in the order their figures are listed
MODULES = ("accuracy_figures", "sensitivity_figure", "sim_figures", "latency_figures", "budget_figure",
           "cache_figure", "ablation_figure", "fp8_figure", "index_figure", "measured_figures", "memory_figures", "rates_figure", "validation_figure")


def select(ids: str | None) -> list[Experiment]:
    """None: every experiment; else the comma list of ids (`--only`): an empty list, an empty item or an
    unknown id is a DDBenchError."""
    exps = load_all()
    if ids is None:
        return list(exps.values())
    keys = [k.strip() for k in ids.split(",")]
    if not any(keys):
        raise DDBenchError(f"--only {ids!r} names no figure; give figure ids, e.g. --only fig02,fig14")
    if not all(keys):
        raise DDBenchError(f"--only {ids!r} has an empty item; give figure ids, e.g. --only fig02,fig14")
    chosen = []
    for key in keys:
        if key not in exps:
            raise unknown("figure", key, exps)
        if exps[key] not in chosen:
            chosen.append(exps[key])
    return chosen

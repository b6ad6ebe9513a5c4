"""The engine's design by name: a registry design (ddbench.core.designs), or '<design>-single' (the same
switches with one query token per step). A paper-phase label (design[@cache_tokens][+fp8]) names its
design. Below both the engine sweep (kernels/engine/sweep.py) and its paper phase (paper.py)."""

from __future__ import annotations

import dataclasses

from ddbench.core.designs import DESIGNS as SYSTEMS
from ddbench.core.errors import DDBenchError


def design_spec(name):
    """A registry design, or '<design>-single': the same switches with one query token per step."""
    name = name.partition("@")[0].partition("+")[0]   # a label: design[@cache_tokens][+fp8]
    if name.endswith("-single"):
        return dataclasses.replace(SYSTEMS[name[:-7]], name=name, tokens_per_step=1)
    if name not in SYSTEMS:
        raise DDBenchError(f"unknown design {name!r}; known: {', '.join(SYSTEMS)} (or <design>-single)")
    return SYSTEMS[name]

"""A computed result that is not a finite number is an error, never a NaN in an output."""

from __future__ import annotations

import math

from ddbench.core.errors import DDBenchError


def check_finite(obj, what: str, path: str = ""):
    """`obj` unchanged, or a DDBenchError naming the first value (in dicts and lists) that is NaN or infinite."""
    if isinstance(obj, float) and not math.isfinite(obj):
        raise DDBenchError(f"{what}: {path or 'the result'} is {obj}, not a finite number; the input is out of"
                           " the range the simulator computes in")
    if isinstance(obj, dict):
        for k, v in obj.items():
            check_finite(v, what, f"{path}.{k}" if path else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            check_finite(v, what, f"{path}[{i}]")
    return obj

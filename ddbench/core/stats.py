"""Small statistics shared by the simulator and the planner (no numpy needed).

    percentile(values, p) -> float | None    nearest rank: the smallest value with at least p % of the values
                                             at or below it (numpy's 'inverted_cdf'); None for no values
"""

from __future__ import annotations

import math


def percentile(values, p: float) -> float | None:
    xs = sorted(float(x) for x in values)
    if not xs:
        return None
    k = min(len(xs) - 1, max(0, math.ceil(p * len(xs) / 100) - 1))
    return xs[k]

"""dualdecoder-cache's link rates: per layer, the chunks prefetched and the chunks fetched urgently per
step, each over the budget's k chunks (sim/steplayers.py prices the bytes from them).

    rates = from_profile(model, layers, budget, context, cache_tokens, policy)   # measured replay (sim, planner,
                                                                                 # the engine's forced rates)
    rates = forced(prefetched, urgent, layers, note)                             # e.g. the engine's forced rates

The profile: `ddbench profile --layer-accuracy --cache-capacity ...` replays the cache over a real
model's selections (ddbench/profile/cache.py; the engine's cache, kernels/engine/chunkcache.py, fills
by the same rule) into traces/accuracy/<model>.cache.csv. The model's own file where one exists, else
the committed profile of another model (SmolLM2), mapped by relative depth. Its budgets are a share of
a short context: the budget whose share of its context is nearest to budget / context here is used,
and the capacity (cache_tokens / budget) is interpolated linearly between the profiled capacities.
The note says all of it; no rate is ever assumed.
"""

from __future__ import annotations

import glob
import math
import os
from dataclasses import dataclass

from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir

COLUMNS = ("layer", "context_tokens", "budget_tokens", "policy", "capacity", "prefetched_per_budget",
           "urgent_per_budget", "model")


@dataclass(frozen=True)
class CacheRates:
    prefetched: tuple       # per layer: chunks prefetched per step / k
    urgent: tuple           # per layer: true chunks in neither the cache nor the prediction / k
    note: str

    @property
    def moved_mean(self) -> float:
        return (sum(self.prefetched) + sum(self.urgent)) / len(self.prefetched)


def forced(prefetched: float, urgent: float, layers: int, note: str) -> CacheRates:
    for name, v in (("prefetched", prefetched), ("urgent", urgent)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and 0.0 <= v <= 1.0):
            raise DDBenchError(f"cache rate {name} must be within 0..1, got {v!r}")
    return CacheRates((float(prefetched),) * layers, (float(urgent),) * layers, note)


def profile_path(model_name: str) -> str:
    """The model's own cache profile, else the only committed one (another model's), else an error."""
    own = traces_dir("accuracy", f"{model_name}.cache.csv")
    if own.exists():
        return str(own)
    found = sorted(glob.glob(str(traces_dir("accuracy", "*.cache.csv"))))
    if not found:
        raise DDBenchError("dualdecoder-cache needs measured cache rates: no traces/accuracy/*.cache.csv (run"
                           " `ddbench profile --layer-accuracy --cache-capacity ...`)")
    return found[0]


def _read(path: str):
    import pandas as pd
    try:
        df = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise DDBenchError(f"{path}: not a cache profile CSV ({exc})") from None
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise DDBenchError(f"{path}: not a cache profile CSV (missing {', '.join(missing)})")
    return df


def map_depth(values, target_layers: int) -> list[float]:
    """Per-layer values of an L-layer model onto an L'-layer one: target layer j takes the source layer
    at the same relative depth, floor((j + 0.5) * L / L')."""
    L = len(values)
    return [float(values[min(L - 1, int((j + 0.5) * L / target_layers))]) for j in range(target_layers)]


def from_profile(model_name: str, layers: int, budget: int, context: int, cache_tokens: int,
                 policy: str = "lru", path: str | None = None) -> CacheRates:
    path = path or profile_path(model_name)
    df = _read(path)
    df = df[df.policy == policy]
    if not len(df):
        raise DDBenchError(f"{path}: no rows of cache policy '{policy}'")
    share = budget / context
    shares = {(int(b), int(c)): b / c for b, c in df[["budget_tokens", "context_tokens"]].drop_duplicates().values}
    (pb, pc), ps = min(shares.items(), key=lambda kv: (abs(math.log(kv[1] / share)), -kv[0][1]))
    df = df[(df.budget_tokens == pb) & (df.context_tokens == pc)]
    caps = sorted(float(c) for c in df.capacity.unique() if c >= 1)
    want = cache_tokens / budget
    if not caps or not caps[0] <= want <= caps[-1]:
        raise DDBenchError(f"{path}: cache capacity {want:g}x the budget is outside the profiled"
                           f" {caps[0] if caps else '-'}-{caps[-1] if caps else '-'}x")
    lo = max(c for c in caps if c <= want)
    hi = min(c for c in caps if c >= want)
    t = 0.0 if hi == lo else (want - lo) / (hi - lo)

    def per_layer(col, cap):
        g = df[df.capacity == cap].groupby("layer")[col].mean().sort_index()
        return list(g.values)

    out = {}
    for col in ("prefetched_per_budget", "urgent_per_budget"):
        a, b = per_layer(col, lo), per_layer(col, hi)
        out[col] = map_depth([x + t * (y - x) for x, y in zip(a, b)], layers)
    src = str(df.model.iloc[0])
    how = f"capacity {want:g}x" + (f" interpolated between {lo:g}x and {hi:g}x" if hi != lo else "")
    note = (f"cache rates from {os.path.basename(path)}: {policy} replay on {src}'s selections"
            f"{'' if src == model_name else f', applied to {model_name} by relative depth'},"
            f" budget {pb} of {pc} tokens (share {ps:.4f}, nearest to {share:.4f} here), {how}:"
            f" prefetched {sum(out['prefetched_per_budget']) / layers:.3f}, urgent"
            f" {sum(out['urgent_per_budget']) / layers:.3f} of the budget per step")
    return CacheRates(tuple(out["prefetched_per_budget"]), tuple(out["urgent_per_budget"]), note)

"""Per-layer hit rates: an accuracy profile from traces/accuracy/<model>.csv, or a constant.

The profile is a CSV with a `layer` column (0-based) and a `hit_rate` column: the fraction of the
true selection that the prediction (speculative token) already holds. An optional
`reuse_hit_rate` column gives the fraction held by the previous step's selection (ShadowKV's
reuse); without it the reuse rate equals the hit rate. Several rows per layer (datasets,
contexts) are averaged. Extra columns are ignored.
"""

from __future__ import annotations

import csv
import os

from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir



def constant(rate: float, layers: int) -> list[float]:
    if not 0.0 <= rate <= 1.0:
        raise DDBenchError(f"hit rate must be within [0, 1], got {rate}")
    return [float(rate)] * layers


def load_profile(path: str, layers: int) -> tuple[list[float], list[float], str]:
    """(hit, reuse, description) per layer from a profile CSV."""
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise DDBenchError(f"cannot read accuracy profile {path}: {exc.strerror}") from None
    if not rows or "layer" not in rows[0] or "hit_rate" not in rows[0]:
        raise DDBenchError(f"malformed accuracy profile {path}: needs columns 'layer' and 'hit_rate'")
    acc: dict[int, list] = {}
    for n, r in enumerate(rows, start=2):
        try:
            layer = int(r["layer"])
            hit = float(r["hit_rate"])
            reuse = float(r["reuse_hit_rate"]) if r.get("reuse_hit_rate") not in (None, "") else hit
        except (TypeError, ValueError):
            raise DDBenchError(f"malformed accuracy profile {path}: line {n} is not numeric") from None
        if not (0 <= layer < layers) or not (0 <= hit <= 1) or not (0 <= reuse <= 1):
            raise DDBenchError(f"malformed accuracy profile {path}: line {n} out of range (layer < {layers},"
                               f" rates in [0, 1])")
        acc.setdefault(layer, []).append((hit, reuse))
    missing = [i for i in range(layers) if i not in acc]
    if missing:
        raise DDBenchError(f"malformed accuracy profile {path}: no rows for layers {missing[:8]}")
    hit = [sum(h for h, _ in acc[i]) / len(acc[i]) for i in range(layers)]
    reuse = [sum(u for _, u in acc[i]) / len(acc[i]) for i in range(layers)]
    return hit, reuse, f"accuracy profile {path}"


def resolve(spec: str | float | None, model_name: str, layers: int, default: float = 0.88):
    """`spec`: None (the model's profile in traces/accuracy/ if present, else `default`), a number, or a CSV path."""
    if spec is None:
        path = str(traces_dir("accuracy", f"{model_name}.csv"))
        if os.path.exists(path):
            return load_profile(path, layers)
        h = constant(default, layers)
        return h, h, (f"constant hit rate {default} (no traces/accuracy/{model_name}.csv; the paper's"
                      f" average KV prediction accuracy, §4.1)")
    if isinstance(spec, (int, float)):
        h = constant(float(spec), layers)
        return h, h, f"constant hit rate {float(spec)}"
    try:
        h = constant(float(spec), layers)
        return h, h, f"constant hit rate {float(spec)}"
    except ValueError:
        return load_profile(spec, layers)

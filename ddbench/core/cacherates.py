"""A chunk-cache design's link rates: per layer, the chunks prefetched and the chunks fetched urgently per
step, each over the budget's k chunks (sim/steplayers.py prices the bytes from them).

    rates = from_profile(model, layers, budget, context, cache_tokens, policy,   # measured replay (sim, planner,
                         prediction=prediction_of(design))                        # the engine's forced rates)
    rates = forced(prefetched, urgent, layers, note)                             # e.g. the engine's forced rates

The profile: `ddbench profile --layer-accuracy --cache-capacity ...` replays the cache over a real
model's selections (ddbench/profile/cache.py; the engine's cache, kernels/engine/chunkcache.py, fills
by the same rule) into traces/accuracy/<model>.cache.csv. The model's own file where one exists, else
the committed profile of another model (SmolLM2), mapped by relative depth. Its budgets are a share of
a short context: the budget whose share of its context is nearest to budget / context here is used,
and the capacity (cache_tokens / budget) is interpolated linearly between the profiled capacities.

Two designs keep the cache, and the replay measures both (its `prediction` column):
  dualdecoder-cache  prediction "speculative": the speculative token's predicted chunks the cache lacks
                     are prefetched; the true chunks in neither are urgent
  lru-cache          prediction "none" (the HiSparse mechanism): nothing is prefetched (prefetched 0);
                     every true chunk the cache lacks is urgent
A profile written before the column is all speculative: lru-cache then has no rates (a one-line error).

Where the profile has a context trend beside it (`<model>.cache-trend.json`, written by
`python -m ddbench.profile.contexts` from one-prompt runs at 1K-8K and two budget shares), the rates
are taken from that trend instead, at the context at hand: per depth band, the fitted power law
exp(log_a + b * log2(context / 1024)) of the nearest profiled share (interpolated in log share between the two
shares, held at the nearer one outside them), with its 95 % interval, and how far beyond the longest
measured context it reaches (a trend without the design's prediction falls back to the replay's rows).
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


PREDICTIONS = ("speculative", "none")      # as the replay writes them (ddbench/profile/cache.py)


def prediction_of(design) -> str:
    """The replay's prediction that prices a chunk-cache design: "none" where nothing is prefetched
    (lru-cache), "speculative" where the speculative token's selection is (dualdecoder-cache)."""
    return "none" if design.prefetch == "none" else "speculative"


def _check_prediction(prediction: str) -> None:
    if prediction not in PREDICTIONS:
        raise DDBenchError(f"unknown cache prediction {prediction!r} (choose from {', '.join(PREDICTIONS)})")


def _what(prediction: str) -> str:
    return "without prediction (lru-cache)" if prediction == "none" else "with the speculative prefetch"


@dataclass(frozen=True)
class CacheRates:
    prefetched: tuple       # per layer: chunks prefetched per step / k
    urgent: tuple           # per layer: true chunks in neither the cache nor the prediction / k
    note: str


def forced(prefetched: float, urgent: float, layers: int, note: str) -> CacheRates:
    for name, v in (("prefetched", prefetched), ("urgent", urgent)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and 0.0 <= v <= 1.0):
            raise DDBenchError(f"cache rate {name} must be within 0..1, got {v!r}")
    return CacheRates((float(prefetched),) * layers, (float(urgent),) * layers, note)


def scaled(rates: CacheRates, factor: float) -> CacheRates:
    """The same rates with `factor` times the prefetched and urgent chunks (each capped at the budget)."""
    return CacheRates(tuple(min(1.0, x * factor) for x in rates.prefetched),
                      tuple(min(1.0, x * factor) for x in rates.urgent),
                      rates.note + f"; scaled {factor:g}x (break-even what-if)")


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
    """The replay, every row checked (ddbench.core.schemas.CacheRow): one-line errors name the line and field."""
    from ddbench.core.traces import cache_profile
    return cache_profile(path)


def _bracket(path: str, capacities, want: float) -> tuple[float, float, float]:
    """(lower, upper profiled capacity around `want`, the linear weight of the upper one); capacities below
    1x (no cache) are not a cache; `want` outside the profiled ones is a one-line DDBenchError."""
    caps = sorted({c for c in capacities if c >= 1})
    if not caps or not caps[0] <= want <= caps[-1]:
        raise DDBenchError(f"{path}: cache capacity {want:g}x the budget is outside the profiled"
                           f" {caps[0] if caps else '-'}-{caps[-1] if caps else '-'}x")
    lo = max(c for c in caps if c <= want)
    hi = min(c for c in caps if c >= want)
    return lo, hi, 0.0 if hi == lo else (want - lo) / (hi - lo)


def map_depth(values, target_layers: int) -> list[float]:
    """Per-layer values of an L-layer model onto an L'-layer one: target layer j takes the source layer
    at the same relative depth, floor((j + 0.5) * L / L')."""
    L = len(values)
    return [float(values[min(L - 1, int((j + 0.5) * L / target_layers))]) for j in range(target_layers)]


def from_profile(model_name: str, layers: int, budget: int, context: int, cache_tokens: int,
                 policy: str = "lru", path: str | None = None, prediction: str = "speculative") -> CacheRates:
    """The rates at `context`: from the context trend beside the profile where it has fits of `prediction`
    (see the module's docstring), else from the replay's rows of the nearest budget share."""
    _check_prediction(prediction)
    path = path or profile_path(model_name)
    trend = trend_path(path)
    if os.path.exists(trend) and _trend_has(trend, prediction):
        return from_trend(trend, model_name, layers, budget, context, cache_tokens, policy, prediction)
    df = _read(path)
    if not (df.prediction == prediction).any():
        raise DDBenchError(f"{path}: no cache replay {_what(prediction)} (prediction '{prediction}'); re-run"
                           " `ddbench profile --layer-accuracy --cache-capacity ...` (it replays both)")
    df = df[(df.policy == policy) & (df.prediction == prediction)]
    if not len(df):
        raise DDBenchError(f"{path}: no rows of cache policy '{policy}' {_what(prediction)}")
    share = budget / context
    shares = {(int(b), int(c)): b / c for b, c in df[["budget_tokens", "context_tokens"]].drop_duplicates().values}
    (pb, pc), ps = min(shares.items(), key=lambda kv: (abs(math.log(kv[1] / share)), -kv[0][1]))
    df = df[(df.budget_tokens == pb) & (df.context_tokens == pc)]
    want = cache_tokens / budget
    lo, hi, t = _bracket(path, (float(c) for c in df.capacity.unique()), want)

    def per_layer(col, cap):
        g = df[df.capacity == cap].groupby("layer")[col].mean().sort_index()
        return list(g.values)

    out = {}
    for col in ("prefetched_per_budget", "urgent_per_budget"):
        a, b = per_layer(col, lo), per_layer(col, hi)
        out[col] = map_depth([x + t * (y - x) for x, y in zip(a, b)], layers)
    src = str(df.model.iloc[0])
    how = f"capacity {want:g}x" + (f" interpolated between {lo:g}x and {hi:g}x" if hi != lo else "")
    note = (f"cache rates from {os.path.basename(path)}: {policy} replay {_what(prediction)} on {src}'s selections"
            f"{'' if src == model_name else f', applied to {model_name} by relative depth'},"
            f" budget {pb} of {pc} tokens (share {ps:.4f}, nearest to {share:.4f} here; no context trend profiled,"
            f" so the context is not matched), {how}:"
            f" prefetched {sum(out['prefetched_per_budget']) / layers:.3f}, urgent"
            f" {sum(out['urgent_per_budget']) / layers:.3f} of the budget per step")
    return CacheRates(tuple(out["prefetched_per_budget"]), tuple(out["urgent_per_budget"]), note)


def trend_path(profile: str) -> str:
    """The context trend beside a cache profile: <model>.cache-trend.json for <model>.cache.csv."""
    return profile[: -len(".cache.csv")] + ".cache-trend.json" if profile.endswith(".cache.csv") else profile + ".trend"


def _trend_has(path: str, prediction: str) -> bool:
    """Whether the trend has fits of `prediction` (a fit without the key, from before it, is speculative)."""
    return any(f.get("prediction", "speculative") == prediction for f in _load_trend(path)["fits"])


def _load_trend(path: str) -> dict:
    import json
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
        fits, bands, ref = doc["fits"], int(doc["bands"]), float(doc["ref_context"])
        for f in fits:
            for k in ("log_a", "b"):
                if not math.isfinite(float(f[k])):
                    raise ValueError(f"{k} is not finite")
            [[float(v) for v in row] for row in f["cov"]]
            str(f["share"]), str(f["policy"]), float(f["capacity"]), str(f["band"]), str(f["metric"])
            if f.get("prediction", "speculative") not in PREDICTIONS:
                raise ValueError(f"prediction {f['prediction']!r} is not one of {', '.join(PREDICTIONS)}")
            int(f["dof"]), float(f["t975"]), max(int(c) for c in f["contexts"])
    except OSError as exc:
        raise DDBenchError(f"cannot read cache trend {path}: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise DDBenchError(f"malformed cache trend {path}: {type(exc).__name__}: {exc}") from None
    if bands < 1 or ref <= 0 or not fits:
        raise DDBenchError(f"malformed cache trend {path}: no fits, or bands/ref_context not positive")
    return doc


def _share_value(label: str) -> float:
    num, _, den = label.partition("/")
    return float(num) / float(den)


def from_trend(path: str, model_name: str, layers: int, budget: int, context: int, cache_tokens: int,
               policy: str = "lru", prediction: str = "speculative") -> CacheRates:
    """The rates of the context trend at `context` (see the module's docstring)."""
    _check_prediction(prediction)
    doc = _load_trend(path)
    fits = [f for f in doc["fits"] if f["policy"] == policy and f["band"] != "all"
            and f.get("prediction", "speculative") == prediction]
    if not fits:
        raise DDBenchError(f"{path}: no fits of cache policy '{policy}' {_what(prediction)}")
    shares = sorted({f["share"] for f in fits}, key=_share_value)
    here = budget / context
    logs = [math.log(_share_value(s)) for s in shares]
    x = min(max(math.log(here), logs[0]), logs[-1])
    hi_i = next((i for i, v in enumerate(logs) if v >= x), len(logs) - 1)
    lo_i = max(hi_i - 1, 0) if logs[hi_i] > x else hi_i
    ws = 0.0 if lo_i == hi_i else (x - logs[lo_i]) / (logs[hi_i] - logs[lo_i])
    want = cache_tokens / budget
    c_lo, c_hi, wc = _bracket(path, (float(f["capacity"]) for f in fits), want)
    index = {(f["share"], float(f["capacity"]), f["band"], f["metric"]): f for f in fits}
    bands = int(doc["bands"])
    ref = float(doc["ref_context"])
    xc = math.log2(context / ref)

    def at(metric, band):
        """(value, half-width of its 95 % interval) blended over the two shares and two capacities."""
        val = half = 0.0
        x2 = [1.0, xc]
        for s_i, w1 in ((lo_i, 1 - ws), (hi_i, ws)):
            for cap, w2 in ((c_lo, 1 - wc), (c_hi, wc)):
                w = w1 * w2
                if w == 0:
                    continue
                key = (shares[s_i], cap, str(band), metric)
                if key not in index:
                    raise DDBenchError(f"{path}: no fit for share {key[0]}, capacity {cap:g}x, band {band}, {metric}")
                f = index[key]
                var = sum(x2[i] * x2[j] * float(f["cov"][i][j]) for i in range(2) for j in range(2))
                y = math.exp(float(f["log_a"]) + float(f["b"]) * xc)
                val += w * y
                half += w * y * (math.exp(float(f["t975"]) * math.sqrt(max(var, 0.0))) - 1)
        return val, half

    per_band, clamped = {}, []
    for m in ("prefetched_per_budget", "urgent_per_budget"):
        vals = []
        for b in range(bands):
            v, h = at(m, b)
            cv = min(max(v, 0.0), 1.0)
            if cv != v:
                clamped.append(f"{m.split('_')[0]} band {b} ({v:+.3f})")
            vals.append((cv, h))
        per_band[m] = vals
    pick = [min(bands - 1, int((j + 0.5) * bands / layers)) for j in range(layers)]
    pre = tuple(0.0 if prediction == "none" else per_band["prefetched_per_budget"][b][0] for b in pick)
    urg = tuple(per_band["urgent_per_budget"][b][0] for b in pick)
    u_mean = sum(urg) / layers
    u_half = sum(per_band["urgent_per_budget"][b][1] for b in pick) / layers
    p_mean = sum(pre) / layers
    measured = max(max(int(c) for c in f["contexts"]) for f in fits)
    support = [f for f in fits if f["metric"] in ("urgent_per_budget", "prefetched_per_budget")
               and float(f["capacity"]) in (c_lo, c_hi) and f["share"] in (shares[lo_i], shares[hi_i])]
    ok = sum(1 for f in support if f.get("supported"))
    reach = (f"extrapolated {context / measured:.1f}x beyond the longest measured context ({measured})"
             if context > measured else f"inside the measured contexts (up to {measured})")
    src = str(doc.get("model", os.path.basename(path)))
    share_txt = shares[lo_i] if lo_i == hi_i else f"{shares[lo_i]}-{shares[hi_i]} (interpolated in log share)"
    cap_txt = f"{want:g}x" + (f" (between {c_lo:g}x and {c_hi:g}x)" if c_hi != c_lo else "")
    note = (f"cache rates from the context trend {os.path.basename(path)} ({policy} replay {_what(prediction)}"
            f" on {src},"
            f" {min(min(int(c) for c in f['contexts']) for f in fits)}-{measured} tokens"
            f"{'' if src == model_name else f'; applied to {model_name} by relative depth'}): at {context} tokens,"
            f" share {share_txt} for {here:.4f} here, capacity {cap_txt}: prefetched {p_mean:.3f}, urgent"
            f" {u_mean:.3f} (95 % interval up to +{u_half:.3f}) of the budget per step; {reach}; the power law"
            f" passed its checks (no curvature, the longest context held out) in {ok} of {len(support)} fits"
            " (depth bands x urgent and prefetched)"
            + (f"; clamped into 0..1: {', '.join(clamped)}" if clamped else ""))
    return CacheRates(pre, urg, note)

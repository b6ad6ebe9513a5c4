"""The one rate set: every design's fetch rates for one question, from one matched source, with intervals.

    rs = rate_set(model, layers, context, budget, cache_tokens)            # the matched, measured rates
    rs = rate_set(..., source=load_source("my-rates.yaml"), overrides=(("shadowkv", "miss", 0.3),))
    rs.of("dualdecoder-cache").get("churn").mean                           # 0.078 [0.06, 0.10]
    rs.of("shadowkv").line()   # "shadowkv: miss 0.36 [0.35, 0.38]; SmolLM2-135M, measured 1K-8K, extrapolated 16x"

What a design's rates are (its `family`, read from the registry's switches, never its name):
  reuse        ShadowKV: `miss` = 1 - reuse, the true chunks the previous step's selection lacks, fetched urgent
  speculative  DualDecoder, SpeCache and the ablations: `miss` = 1 - hit, the true chunks the speculative token
               did not predict, fetched urgent
  cache        dualdecoder-cache: `urgent`, the true chunks in neither the GPU cache nor the prediction, and
               `churn`, the predicted chunks the cache lacks, prefetched
  cache-none   lru-cache: `urgent`, the true chunks the cache lacks (nothing is prefetched: churn 0)
Every metric is a share of the budget's k chunks per step and layer.

The types the simulator and the engine take from it live here too: `CacheRates` (a chunk cache's per-layer
churn and urgent chunks, `forced` for an engine run's), `map_depth` (a profile's layers onto another model's by
relative depth), `prediction_of` (which replay prices a chunk-cache design).

One vocabulary: **churn** is the chunks prefetched per step over k (the engine's forced `churn_rate`); the
chunks moved over the link per step are churn + urgent ("moved", the profiler's `moved_per_budget`).

Where they come from, in this order, each design on its own:
  1. `--rate design.metric=VALUE` (a what-if: no interval);
  2. `--rates FILE`: a `ddbench profile` output folder or a small YAML/JSON of per-design rates
     (ddbench/core/ratefile.py);
  3. the matched profile: ONE context trend of traces/accuracy/ (`<model>.cache-trend.json`, written by
     `python -m ddbench.profile.contexts`) for every design: the model's own where it prices every family,
     else the one that does and reaches closest to the context (least extrapolation; then more prompts). Its
     cells are the same replay at the same budget share: ShadowKV's miss is the replay's cache-less urgent
     share at capacity 1x without prediction (the previous step's selection, exactly 1 - reuse), DualDecoder's
     at capacity 0 with the speculative prediction (exactly 1 - hit), the cache's at cache_tokens / budget;
     where no trend prices a design's family: a profile run's replay (`<model>.cache.csv`, the model's own, else
     the first committed one), one run at one context, so no interval;
  4. none: the design's rates are unknown here (`DesignRates.matched` False); the scenario then falls back to
     the accuracy CSV or the constant hit rate and says so in the answer's first lines.
Intervals are the trend fit's 95 % interval of the mean at this context, per depth band, carried to the
layers by relative depth; `at("low" | "centre" | "high")` gives the per-layer values at one end.
"""

from __future__ import annotations

import glob
import math
import os
from dataclasses import dataclass, replace
from functools import lru_cache

from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir

ENDS = ("low", "centre", "high")
FAMILY_METRICS = {"reuse": ("miss",), "speculative": ("miss",), "cache": ("urgent", "churn"),
                  "cache-none": ("urgent",)}
METRIC_RANGE = {"miss": (0.0, 1.0), "urgent": (0.0, 1.0), "churn": (0.0, 1.0)}
# the trend cell (prediction, capacity in budgets, trend metric) each family's metric is read from
_CELLS = {("reuse", "miss"): ("none", 1.0, "urgent_per_budget"),
          ("speculative", "miss"): ("speculative", 0.0, "urgent_per_budget"),
          ("cache", "urgent"): ("speculative", None, "urgent_per_budget"),
          ("cache", "churn"): ("speculative", None, "prefetched_per_budget"),
          ("cache-none", "urgent"): ("none", None, "urgent_per_budget")}
POLICY = "lru"


def family(design) -> str | None:
    """The rates a design consumes (see the module's docstring), from its switches; None: it fetches on no
    prediction (full-kv keeps its KV on the GPU; ideal fetches its whole budget)."""
    if design.kv_on_gpu:
        return None
    if design.chunk_cache:
        return "cache" if design.prefetch != "none" else "cache-none"
    if design.reuse:
        return "reuse"
    if design.prefetch != "none":
        return "speculative"
    return None


@dataclass(frozen=True)
class Rate:
    """One metric of one design: per-layer centre and 95 % interval ends (shares of the budget per step)."""
    metric: str
    centre: tuple
    low: tuple
    high: tuple

    def at(self, end: str = "centre") -> tuple:
        if end not in ENDS:
            raise DDBenchError(f"unknown interval end {end!r} (choose from {', '.join(ENDS)})")
        return {"low": self.low, "centre": self.centre, "high": self.high}[end]

    def mean(self, end: str = "centre") -> float:
        v = self.at(end)
        return sum(v) / len(v)

    @property
    def has_interval(self) -> bool:
        return self.low != self.high

    def text(self) -> str:
        c = self.mean()
        if not self.has_interval:
            return f"{self.metric} {c:.3g}"
        return f"{self.metric} {c:.3g} [{self.mean('low'):.3g}, {self.mean('high'):.3g}]"


def constant_rate(metric: str, value: float, layers: int, low: float | None = None,
                  high: float | None = None) -> Rate:
    lo = value if low is None else low
    hi = value if high is None else high
    return Rate(metric, (float(value),) * layers, (float(lo),) * layers, (float(hi),) * layers)


@dataclass(frozen=True)
class DesignRates:
    design: str
    family: str | None
    rates: tuple = ()             # Rate, one per metric of the family
    source: str = ""              # short: "SmolLM2-135M-Instruct.Q4_1" / "my.yaml" / "--rate"
    measured: tuple = ()          # contexts measured (tokens); () where the source has none
    extrapolation: float = 1.0    # context / the longest measured (1.0 inside the measured range)
    matched: bool = True          # from the matched source (False: not priced here, the caller falls back)
    detail: str = ""              # the long note (share, capacity, fits' checks)

    def get(self, metric: str) -> Rate | None:
        return next((r for r in self.rates if r.metric == metric), None)

    def where(self) -> str:
        """'SmolLM2-135M, measured 1K-8K, extrapolated 16x' (one short phrase)."""
        if not self.matched:
            return "no profile matches"
        src = short_model(self.source)
        if not self.measured:
            return src
        lo, hi = min(self.measured), max(self.measured)
        span = fmt_k(lo) if lo == hi else f"{fmt_k(lo)}-{fmt_k(hi)}"
        reach = f", extrapolated {self.extrapolation:.3g}x" if self.extrapolation > 1.0 else ", inside"
        return f"{src}, measured {span}{reach}"

    def line(self) -> str:
        if self.family is None:
            return f"{self.design}: fetches on no prediction (no rates)"
        if not self.matched:
            return f"{self.design}: no measured rates match ({self.detail})"
        return f"{self.design}: {', '.join(r.text() for r in self.rates)}; {self.where()}"

    def scaled(self, factor: float) -> "DesignRates":
        if factor == 1.0:
            return self

        def sc(t):
            return tuple(min(1.0, x * factor) for x in t)
        return replace(self, rates=tuple(Rate(r.metric, sc(r.centre), sc(r.low), sc(r.high)) for r in self.rates),
                       detail=self.detail + f"; scaled {factor:g}x (break-even what-if)")


@dataclass(frozen=True)
class RateSet:
    context: int
    budget: int
    cache_tokens: int
    layers: int
    source: str                   # the matched source every design's rates come from unless its own says otherwise
    designs: tuple = ()           # DesignRates

    def of(self, design: str) -> DesignRates | None:
        return next((d for d in self.designs if d.design == design), None)

    def unmatched(self) -> list[str]:
        return [d.design for d in self.designs if d.family is not None and not d.matched]

    def sources(self) -> list[str]:
        return sorted({d.source for d in self.designs if d.family is not None and d.matched})


def fmt_k(tokens: int) -> str:
    return f"{tokens / 1024:.3g}K" if tokens >= 1000 else str(tokens)


def short_model(name: str) -> str:
    """'SmolLM2-135M-Instruct.Q4_1' -> 'SmolLM2-135M'; 'gemma-3-270m-q4_k_m' -> 'gemma-3-270m'."""
    base = os.path.basename(str(name)).split(".")[0]
    for tail in ("-Instruct", "-instruct", "-q4_k_m", "-Q4_K_M", "-it"):
        base = base.replace(tail, "")
    return base



# ---------------------------------------------------------------- what the simulator and the engine consume
PREDICTIONS = ("speculative", "none")      # a cache replay's prediction (ddbench/profile/cache.py)


def prediction_of(design) -> str:
    """The replay's prediction that prices a chunk-cache design: "none" where nothing is prefetched
    (lru-cache), "speculative" where the speculative token's selection is (dualdecoder-cache)."""
    return "none" if design.prefetch == "none" else "speculative"


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


def map_depth(values, target_layers: int) -> list[float]:
    """Per-layer values of an L-layer model onto an L'-layer one: target layer j takes the source layer
    at the same relative depth, floor((j + 0.5) * L / L')."""
    L = len(values)
    return [float(values[min(L - 1, int((j + 0.5) * L / target_layers))]) for j in range(target_layers)]



def read_replay(path: str):
    """A profile run's cache replay (traces/accuracy/<model>.cache.csv), every row checked
    (ddbench.core.schemas.CacheRow): one-line errors name the line and field."""
    from ddbench.core.traces import cache_profile
    return cache_profile(path)


def _check_trend(path: str) -> dict:
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



# ---------------------------------------------------------------- context trends
def trend_files(root: str | None = None) -> list[str]:
    return sorted(glob.glob(os.path.join(str(root or traces_dir("accuracy")), "*.cache-trend.json")))


@lru_cache(maxsize=32)
def load_trend(path: str) -> dict:
    """The trend, checked (one-line errors naming the file); cached per path."""
    return _check_trend(path)


def _fits(doc: dict, prediction: str, metric: str) -> list:
    return [f for f in doc["fits"] if f["policy"] == POLICY and f["band"] != "all" and f["metric"] == metric
            and f.get("prediction", "speculative") == prediction]


def prices(doc: dict, fam: str) -> bool:
    """Whether the trend has every cell the family's metrics are read from: each share, each depth band."""
    bands = {str(b) for b in range(int(doc["bands"]))}
    for (f, _m), (pred, cap, metric) in _CELLS.items():
        if f != fam:
            continue
        fits = _fits(doc, pred, metric)
        caps = {float(x["capacity"]) for x in fits}
        need = [cap] if cap is not None else [c for c in caps if c >= 1.0]
        if not need or any(c not in caps for c in need):
            return False
        for c in need:
            for s in {x["share"] for x in fits}:
                if {str(x["band"]) for x in fits if float(x["capacity"]) == c and x["share"] == s} != bands:
                    return False
    return True


def measured(doc: dict) -> tuple:
    return tuple(sorted({int(c) for f in doc["fits"] for c in f["contexts"]}))


def _shares(fits, here: float):
    """(two share labels around `here` in log share, the weight of the second), held at the nearer end."""
    def val(label):
        num, _, den = str(label).partition("/")
        return float(num) / float(den)
    shares = sorted({f["share"] for f in fits}, key=val)
    logs = [math.log(val(s)) for s in shares]
    x = min(max(math.log(here), logs[0]), logs[-1])
    hi = next((i for i, v in enumerate(logs) if v >= x), len(logs) - 1)
    lo = max(hi - 1, 0) if logs[hi] > x else hi
    w = 0.0 if lo == hi else (x - logs[lo]) / (logs[hi] - logs[lo])
    return shares[lo], shares[hi], w


def _caps(path: str, fits, want: float):
    caps = sorted({float(f["capacity"]) for f in fits if float(f["capacity"]) >= 1.0 or want < 1.0})
    if want in caps:
        return want, want, 0.0
    inside = [c for c in caps if c >= 1.0]
    if not inside or not inside[0] <= want <= inside[-1]:
        raise DDBenchError(f"{path}: cache capacity {want:g}x the budget is outside the profiled"
                           f" {inside[0] if inside else '-'}-{inside[-1] if inside else '-'}x")
    lo = max(c for c in inside if c <= want)
    hi = min(c for c in inside if c >= want)
    return lo, hi, (want - lo) / (hi - lo)


def trend_cell(path: str, prediction: str, capacity: float, metric: str, share: float, context: int,
               layers: int) -> tuple:
    """(centre, low, high) per layer of one trend cell at `context`: the power law of each depth band blended
    over the two nearest shares (log share) and capacities (linear), its 95 % interval of the mean."""
    doc = load_trend(path)
    fits = _fits(doc, prediction, metric)
    s_lo, s_hi, ws = _shares(fits, share)
    c_lo, c_hi, wc = _caps(path, fits, capacity)
    index = {(f["share"], float(f["capacity"]), str(f["band"])): f for f in fits}
    xc = math.log2(context / float(doc["ref_context"]))
    bands = int(doc["bands"])
    per_band = []
    for b in range(bands):
        c = lo = hi = 0.0
        for s, w1 in ((s_lo, 1 - ws), (s_hi, ws)):
            for cap, w2 in ((c_lo, 1 - wc), (c_hi, wc)):
                w = w1 * w2
                if w == 0:
                    continue
                f = index.get((s, cap, str(b)))
                if f is None:
                    raise DDBenchError(f"{path}: no fit for share {s}, capacity {cap:g}x, band {b}, {metric}")
                var = sum(v1 * v2 * float(f["cov"][i][j]) for i, v1 in enumerate((1.0, xc))
                          for j, v2 in enumerate((1.0, xc)))
                y = math.exp(float(f["log_a"]) + float(f["b"]) * xc)
                k = math.exp(float(f["t975"]) * math.sqrt(max(var, 0.0)))
                c, lo, hi = c + w * y, lo + w * y / k, hi + w * y * k
        per_band.append(tuple(min(max(v, 0.0), 1.0) for v in (c, lo, hi)))
    pick = [min(bands - 1, int((j + 0.5) * bands / layers)) for j in range(layers)]
    return tuple(tuple(per_band[b][i] for b in pick) for i in range(3))


def trend_rates(path: str, design: str, fam: str, layers: int, context: int, budget: int,
                cache_tokens: int) -> DesignRates:
    doc = load_trend(path)
    share = budget / context
    rates = []
    for metric in FAMILY_METRICS[fam]:
        pred, cap, tm = _CELLS[(fam, metric)]
        cap = cache_tokens / budget if cap is None else cap
        c, lo, hi = trend_cell(path, pred, cap, tm, share, context, layers)
        rates.append(Rate(metric, c, lo, hi))
    meas = measured(doc)
    ext = max(1.0, context / max(meas)) if meas else 1.0
    cap_txt = f", capacity {cache_tokens / budget:g}x" if fam.startswith("cache") else ""
    used = [f for m in FAMILY_METRICS[fam] for f in _fits(doc, _CELLS[(fam, m)][0], _CELLS[(fam, m)][2])]
    detail = (f"{os.path.basename(path)}: {POLICY} replay on {doc.get('model', '?')}, share {share:.4f}{cap_txt},"
              f" at {context} tokens, prompts per context {doc.get('prompts_per_context', {})}; the power law passed"
              f" its checks (no curvature, the longest context held out) in {sum(bool(f.get('supported')) for f in used)}"
              f" of {len(used)} fits")
    return DesignRates(design, fam, tuple(rates), str(doc.get("model", os.path.basename(path))), meas, ext, True,
                       detail)


def pick_trend(model: str, context: int, families, root: str | None = None) -> str | None:
    """The one trend every design is priced from: the model's own where it prices every family asked, else the
    trend that does and reaches closest to `context` (then more prompts, then the name); else the one pricing
    the most families; None where there is no trend."""
    files = trend_files(root)
    if not files:
        return None
    fams = sorted({f for f in families if f is not None})

    def key(p):
        doc = load_trend(p)
        n = sum(prices(doc, f) for f in fams)
        meas = measured(doc) or (0,)
        prompts = sum(int(v) for v in (doc.get("prompts_per_context") or {}).values())
        own = os.path.basename(p).startswith(f"{model}.")
        return (n, own and n == len(fams), -max(1.0, context / max(max(meas), 1)), prompts, p)
    return max(files, key=key)


# ---------------------------------------------------------------- a profile run's replay (no trend)
def pick_replay(model: str, root: str | None = None) -> str | None:
    """Where no trend prices a design: the model's own replay (<model>.cache.csv), else the first committed one
    (another model's, mapped by relative depth); None where there is none."""
    folder = str(root or traces_dir("accuracy"))
    own = os.path.join(folder, f"{model}.cache.csv")
    found = [own] if os.path.exists(own) else sorted(glob.glob(os.path.join(folder, "*.cache.csv")))
    return found[0] if found else None


def replay_rates(path: str, design: str, fam: str, layers: int, context: int, budget: int,
                 cache_tokens: int) -> DesignRates | None:
    """A profile run's cache replay (one context): per layer, the budget share nearest to this question's,
    the capacity interpolated between the profiled ones; no interval (one run). None where the replay has no
    rows of the design's prediction (a run from before the replay without prediction: ShadowKV, lru-cache)."""
    df = read_replay(path)
    share = budget / context
    out = []
    for metric in FAMILY_METRICS[fam]:
        pred, cap, tm = _CELLS[(fam, metric)]
        cap = cache_tokens / budget if cap is None else cap
        d = df[(df.policy == POLICY) & (df.prediction == pred)]
        if not len(d):
            return None
        pairs = d[["budget_tokens", "context_tokens"]].drop_duplicates().values
        pb, pc = min(((int(b), int(c)) for b, c in pairs), key=lambda bc: (abs(math.log(bc[0] / bc[1] / share)),
                                                                            -bc[1]))
        d = d[(d.budget_tokens == pb) & (d.context_tokens == pc)]
        lo, hi, w = _caps(path, [{"capacity": c} for c in d.capacity.unique()], cap)

        def per_layer(c):
            return list(d[d.capacity == c].groupby("layer")[tm].mean().sort_index().values)
        a, b = per_layer(lo), per_layer(hi)
        vals = tuple(map_depth([x + w * (y - x) for x, y in zip(a, b)], layers))
        out.append(Rate(metric, vals, vals, vals))
        ctx = pc
    return DesignRates(design, fam, tuple(out), model_of_profile(path), (ctx,), max(1.0, context / ctx), True,
                       f"{os.path.basename(path)}: one profile run's {POLICY} replay (no interval)")


def model_of_profile(path: str) -> str:
    """The model a profile file is of: <model>.cache-trend.json, <model>.cache.csv."""
    base = os.path.basename(path)
    for tail in (".cache-trend.json", ".cache.csv"):
        if base.endswith(tail):
            return base[: -len(tail)]
    return base


# ---------------------------------------------------------------- the rate set
def _from_values(src, design: str, fam: str, layers: int, context: int) -> DesignRates | None:
    own = [v for v in src.values if v[0] == design]
    kin = [v for v in src.values if family_of(v[0]) == fam]
    use = own if own else [v for v in kin if v[0] == kin[0][0]] if kin else []
    if not use:
        return None
    rates = tuple(constant_rate(m, c, layers, lo, hi) for _, m, c, lo, hi in use)
    meas = src.contexts
    ext = max(1.0, context / max(meas)) if meas else 1.0
    how = "" if own else f" ({use[0][0]}'s)"
    return DesignRates(design, fam, rates, src.name + how, meas, ext, True, f"rates file {src.path}{how}")


def family_of(name: str) -> str | None:
    from ddbench.core.designs import get_design
    return family(get_design(name))


def _override(dr: DesignRates, ov: list, layers: int) -> DesignRates:
    rates = {r.metric: r for r in dr.rates}
    for _, metric, value in ov:
        rates[metric] = constant_rate(metric, value, layers)
    what = ", ".join(f"{m}={v:g}" for _, m, v in ov)
    keep = [r for r in dr.rates if r.metric not in {m for _, m, _ in ov}]
    src = f"--rate {what}" + (f" (else {dr.source})" if keep and dr.matched else "")
    return replace(dr, rates=tuple(rates[m] for m in FAMILY_METRICS[dr.family]), source=src,
                   matched=True, measured=dr.measured if keep else (), extrapolation=dr.extrapolation if keep else 1.0,
                   detail=f"what-if {what}" + (f"; {dr.detail}" if dr.detail else ""))


@lru_cache(maxsize=256)
def rate_set(model: str, layers: int, context: int, budget: int, cache_tokens: int, designs: tuple,
             source=None, overrides: tuple = (), root: str | None = None) -> RateSet:
    """Every design's rates for one question (see the module's docstring); `source`: a
    ddbench.core.ratefile.RateSource or None; `overrides`: ((design, metric, value), ...)."""
    fams = {d: family_of(d) for d in designs}
    trend = pick_trend(model, context, tuple(fams.values()), root)
    if source is not None and source.kind == "trend":
        trend = source.path
    out = []
    for d, fam in fams.items():
        dr = None
        if fam is None:
            dr = DesignRates(d, None, source="-")
        elif source is not None and source.kind == "values":
            dr = _from_values(source, d, fam, layers, context)
        elif source is not None and source.kind == "replay":
            dr = replay_rates(source.path, d, fam, layers, context, budget, cache_tokens)
        if dr is None and trend is not None and prices(load_trend(trend), fam):
            dr = trend_rates(trend, d, fam, layers, context, budget, cache_tokens)
        replay = pick_replay(model, root) if dr is None and source is None else None
        if replay is not None:
            dr = replay_rates(replay, d, fam, layers, context, budget, cache_tokens)
        if dr is None:
            why = "no profile in traces/accuracy prices it" if trend is None and replay is None else \
                f"{os.path.basename(replay)} has no rows of its prediction" if trend is None else \
                f"{os.path.basename(trend)} has no {'/'.join(FAMILY_METRICS[fam])} cells for it"
            dr = DesignRates(d, fam, (), "", (), 1.0, False, why)
        ov = [o for o in overrides if o[0] == d]
        if ov:
            if not dr.matched and len({m for _, m, _ in ov}) < len(FAMILY_METRICS[fam]):
                raise DDBenchError(f"--rate {d}: no measured rates here to complete it; give every one of"
                                   f" {', '.join(FAMILY_METRICS[fam])}")
            dr = _override(dr if dr.matched else replace(dr, rates=()), ov, layers)
        out.append(dr)
    name = source.name if source is not None else (load_trend(trend).get("model", trend) if trend else "none")
    return RateSet(int(context), int(budget), int(cache_tokens), int(layers), str(name), tuple(out))


def at_end(dr: DesignRates, metric: str, end: str = "centre") -> tuple | None:
    r = dr.get(metric) if dr is not None else None
    return None if r is None else r.at(end)

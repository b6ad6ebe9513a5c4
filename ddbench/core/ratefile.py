"""The user's own rates: `--rates FILE` (a `ddbench profile` output folder, or a small YAML/JSON of per-design
rates) and `--rate design.metric=VALUE`, read into ddbench.core.rates' terms.

A rates file:

    # my-rates.yaml                        ddbench plan ... --rates my-rates.yaml
    source: llama-3-8b on our H100         # optional: what the rates were measured on (printed with them)
    contexts: [32768, 65536]               # optional: the contexts measured (the answer says how far it reaches)
    rates:
      shadowkv: {miss: 0.30}                        # 1 - reuse
      dualdecoder: {miss: {value: 0.15, low: 0.12, high: 0.19}}   # 1 - hit, with its 95 % interval
      dualdecoder-cache: {urgent: 0.012, churn: 0.08}             # churn: predicted chunks prefetched / k

Every design named must be a design of the registry, with every metric its family reads (ddbench.core.rates:
miss; urgent and churn for dualdecoder-cache; urgent for lru-cache) and no other; each value a finite share in
0..1 (low <= value <= high). A design the file does not name is priced from the matched profile, and the
answer says so on its line. A `ddbench profile` output folder: its `*.cache-trend.json` where it has one (the
rates against context, with intervals), else its `*.cache.csv` replay (one run: no interval).

Paths resolve against the folder of the file that names them (a sweep spec, a --config), or, given on the
command line, the current folder; a relative path in a spec that exists only from the current folder is an
error naming both. Every defect is one line naming the file and the field (DDBenchError, exit 2).
"""

from __future__ import annotations

import glob
import math
import os
from dataclasses import dataclass

from ddbench.core.errors import DDBenchError

TOP_KEYS = ("source", "contexts", "rates")


@dataclass(frozen=True)
class RateSource:
    """Where --rates points: kind "trend" (path: a context trend), "replay" (path: a profile's cache.csv) or
    "values" (values: ((design, metric, value, low, high), ...) from a rates file)."""
    kind: str
    path: str
    name: str                     # printed as the rates' source
    values: tuple = ()
    contexts: tuple = ()

    def designs(self) -> tuple:
        return tuple(dict.fromkeys(v[0] for v in self.values))


def resolve_path(text: str, base: str | None, what: str) -> str:
    """`text` as an absolute path: against `base` (the folder of the file that names it) where given, else the
    current folder. A relative path that exists only from the current folder is an error naming both."""
    p = os.path.expanduser(str(text).strip())
    if not p:
        raise DDBenchError(f"{what}: the rates path is empty")
    if os.path.isabs(p) or base is None:
        full = os.path.abspath(p)
    else:
        full = os.path.normpath(os.path.join(base, p))
        if not os.path.exists(full):
            here = " (it exists from the current folder, but paths in a file resolve beside the file)" \
                if os.path.exists(p) else ""
            raise DDBenchError(f"{what}: rates {text}: no such file or folder beside it ({full}){here}")
    if not os.path.exists(full):
        raise DDBenchError(f"{what}: rates {text}: no such file or folder")
    return full


def load_source(path: str) -> RateSource:
    """A checked RateSource from an absolute path (a profile output folder, or a rates file)."""
    if os.path.isdir(path):
        return _folder(path)
    if path.endswith(".cache-trend.json"):
        from ddbench.core.rates import load_trend, model_of_profile
        load_trend(path)
        return RateSource("trend", path, model_of_profile(path))
    return _values(path)


def _folder(path: str) -> RateSource:
    from ddbench.core.rates import load_trend, model_of_profile
    trends = sorted(glob.glob(os.path.join(path, "*.cache-trend.json")))
    replays = sorted(glob.glob(os.path.join(path, "*.cache.csv")))
    if len(trends) > 1 or (not trends and len(replays) > 1):
        raise DDBenchError(f"rates {path}: more than one model's profile in the folder; name the file")
    if trends:
        load_trend(trends[0])
        return RateSource("trend", trends[0], model_of_profile(trends[0]))
    if replays:
        from ddbench.core.rates import read_replay
        read_replay(replays[0])
        return RateSource("replay", replays[0], model_of_profile(replays[0]))
    raise DDBenchError(f"rates {path}: not a `ddbench profile` output folder (no *.cache-trend.json or"
                       " *.cache.csv; profile with --cache-capacity 0,1,2,4)")


def _number(v, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise DDBenchError(f"{where}: expected a number, got {v!r}")
    if not math.isfinite(float(v)):
        raise DDBenchError(f"{where}: not finite ({v!r})")
    return float(v)


def check_value(design: str, metric: str, v, where: str) -> float:
    from ddbench.core.rates import METRIC_RANGE
    x = _number(v, where)
    lo, hi = METRIC_RANGE[metric]
    if not lo <= x <= hi:
        raise DDBenchError(f"{where}: {design}'s {metric} must be within {lo:g}..{hi:g}, got {x:g}")
    return x


def _one(design: str, metric: str, v, where: str) -> tuple:
    """(value, low, high) of one metric: a number, or {value, low, high}."""
    if isinstance(v, dict):
        extra = sorted(set(map(str, v)) - {"value", "low", "high"})
        if extra:
            raise DDBenchError(f"{where}.{extra[0]}: not a field (value, low, high)")
        if "value" not in v:
            raise DDBenchError(f"{where}.value: missing")
        c = check_value(design, metric, v["value"], f"{where}.value")
        lo = check_value(design, metric, v.get("low", c), f"{where}.low")
        hi = check_value(design, metric, v.get("high", c), f"{where}.high")
        if not lo <= c <= hi:
            raise DDBenchError(f"{where}: low {lo:g} <= value {c:g} <= high {hi:g} does not hold")
        return c, lo, hi
    c = check_value(design, metric, v, where)
    return c, c, c


def _design_rates(name, metrics, where: str) -> list:
    from ddbench.core.designs import get_design
    from ddbench.core.rates import FAMILY_METRICS, family
    try:
        d = get_design(str(name))
    except DDBenchError as exc:
        raise DDBenchError(f"{where}: {exc}") from None
    fam = family(d)
    if fam is None:
        raise DDBenchError(f"{where}: {d.name} fetches on no prediction; it has no rates")
    if not isinstance(metrics, dict):
        raise DDBenchError(f"{where}: expected a mapping of metric to value, got {type(metrics).__name__}")
    want = FAMILY_METRICS[fam]
    for m in metrics:
        if m not in want:
            raise DDBenchError(f"{where}.{m}: not a rate of {d.name} (it has {', '.join(want)})")
    out = []
    for m in want:
        if m not in metrics:
            raise DDBenchError(f"{where}.{m}: missing ({d.name} needs {', '.join(want)})")
        out.append((d.name, m, *_one(d.name, m, metrics[m], f"{where}.{m}")))
    return out


def _values(path: str) -> RateSource:
    from ddbench.core.io import read_mapping
    raw = read_mapping(path, f"rates {path}", "source, contexts and rates")
    for k in raw:
        if k not in TOP_KEYS:
            raise DDBenchError(f"rates {path}: {k}: not a field ({', '.join(TOP_KEYS)})")
    if "rates" not in raw:
        raise DDBenchError(f"rates {path}: rates: missing (a mapping of design to its rates)")
    if not isinstance(raw["rates"], dict) or not raw["rates"]:
        raise DDBenchError(f"rates {path}: rates: expected a mapping of design to its rates, got {raw['rates']!r}")
    values = []
    for name, metrics in raw["rates"].items():
        values += _design_rates(name, metrics, f"rates {path}: rates.{name}")
    src = raw.get("source", os.path.basename(path))
    if not isinstance(src, str) or not src.strip():
        raise DDBenchError(f"rates {path}: source: expected a non-empty text, got {src!r}")
    ctx = raw.get("contexts", [])
    if not isinstance(ctx, list) or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in ctx):
        raise DDBenchError(f"rates {path}: contexts: expected a list of positive token counts, got {ctx!r}")
    return RateSource("values", path, src.strip(), tuple(values), tuple(sorted(ctx)))


def parse_override(text: str) -> tuple:
    """'design.metric=VALUE' -> (design, metric, value), checked (a one-line DDBenchError)."""
    from ddbench.core.designs import get_design
    from ddbench.core.rates import FAMILY_METRICS, family
    key, eq, val = str(text).partition("=")
    name, dot, metric = key.strip().rpartition(".")
    if not eq or not dot or not name or not metric:
        raise DDBenchError(f"--rate {text!r}: expected design.metric=VALUE (e.g. dualdecoder-cache.churn=0.2)")
    d = get_design(name)
    fam = family(d)
    if fam is None or metric not in FAMILY_METRICS[fam]:
        has = ", ".join(FAMILY_METRICS[fam]) if fam else "none"
        raise DDBenchError(f"--rate {text!r}: {metric!r} is not a rate of {d.name} (it has {has})")
    try:
        v = float(val)
    except ValueError:
        raise DDBenchError(f"--rate {text!r}: {val.strip()!r} is not a number") from None
    return d.name, metric, check_value(d.name, metric, v, f"--rate {text!r}")

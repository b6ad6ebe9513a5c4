"""Service-level objectives: `p99-completion=60s,p99-tpot=100ms,p50-ttft=2s`.

Each term is `p<percentile>-<metric>=<limit><unit>`: metric one of completion, ttft, tpot; the
percentile in (0, 100] (nearest rank over the completed requests); the limit a positive number
with a unit of s, ms or us. A run meets the SLO when every term holds.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ddbench.core.errors import DDBenchError

METRICS = ("completion", "ttft", "tpot")
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_TERM = re.compile(r"p(\d+(?:\.\d+)?)-([a-z]+)=(\d+(?:\.\d*)?|\.\d+)(s|ms|us)")


@dataclass(frozen=True)
class SLO:
    pct: float
    metric: str
    limit_s: float
    text: str

    @property
    def name(self) -> str:
        return f"p{_pct_name(self.pct)}-{self.metric}"

    @property
    def column(self) -> str:
        """The run row's column holding this percentile, in seconds."""
        return f"{self.metric}_p{_pct_name(self.pct)}_s"


def _pct_name(p: float) -> str:
    return str(int(p)) if float(p).is_integer() else str(p).replace(".", "_")


def parse_slo(text: str | None) -> list[SLO]:
    """A comma list of terms -> SLOs; a DDBenchError naming the bad term otherwise. None/'' -> []."""
    if text is None or not str(text).strip():
        return []
    out, seen = [], set()
    for raw in str(text).split(","):
        term = raw.strip().lower()
        m = _TERM.fullmatch(term)
        if not m:
            raise DDBenchError(f"cannot parse SLO term '{raw.strip()}': use p<percentile>-<metric>=<limit><unit>,"
                               f" e.g. p99-tpot=100ms (metrics: {', '.join(METRICS)}; units: s, ms, us)")
        pct, metric, value, unit = float(m.group(1)), m.group(2), float(m.group(3)), m.group(4)
        if metric not in METRICS:
            raise DDBenchError(f"SLO term '{raw.strip()}': unknown metric '{metric}'; known: {', '.join(METRICS)}")
        if not 0 < pct <= 100:
            raise DDBenchError(f"SLO term '{raw.strip()}': percentile must be within (0, 100]")
        if not (value > 0 and math.isfinite(value)):
            raise DDBenchError(f"SLO term '{raw.strip()}': the limit must be positive and finite")
        if (pct, metric) in seen:
            raise DDBenchError(f"SLO term '{raw.strip()}': p{_pct_name(pct)}-{metric} is given twice")
        seen.add((pct, metric))
        out.append(SLO(pct, metric, value * _UNITS[unit], f"p{_pct_name(pct)}-{metric}={m.group(3)}{unit}"))
    return out


def violations(row: dict, slos: list[SLO]) -> list[str]:
    """The terms a run row misses (a NaN value misses)."""
    bad = []
    for s in slos:
        v = row.get(s.column)
        if v is None or not (v <= s.limit_s):
            bad.append(s.text)
    return bad


def fmt_seconds(v: float) -> str:
    if v != v:
        return "n/a"
    if v >= 1.0:
        return f"{v:.3g} s" if v < 100 else f"{v:.0f} s"
    if v >= 1e-3:
        return f"{v * 1e3:.3g} ms"
    return f"{v * 1e6:.3g} us"

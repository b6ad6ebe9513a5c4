"""The paper's reported numbers (traces/paper/reported.json), validated on load.

Schema 2: every number the paper's text states, each with the sentence that states it and a
status saying what this project does with it:

- ``replayed``: a figure of `ddbench figures` computes our value beside it;
- ``not replayable``: it cannot be replayed here, and ``reason`` says why (a property of the
  paper's testbed, say);
- ``not replayed yet``: it could be, once a missing piece exists; ``reason`` names the piece;
- ``inconsistent``: the paper contradicts itself on it; ``reason`` says how.

Optional fields: ``inconsistency`` (a replayed number the paper also contradicts elsewhere),
``derived`` (how a number the paper implies but does not print follows from the ones it does).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache

from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir

SCHEMA = 2
STATUSES = ("replayed", "not replayable", "not replayed yet", "inconsistent")
_REQUIRED = ("id", "figure", "value", "unit", "quote", "status")
_OPTIONAL = ("reason", "inconsistency", "derived")


@dataclass(frozen=True)
class Reported:
    id: str
    figure: str
    value: float
    unit: str
    quote: str
    status: str = "replayed"
    reason: str = ""
    inconsistency: str = ""
    derived: str = ""

    @property
    def replayed(self) -> bool:
        return self.status == "replayed"


def _entry(path: str, i: int, row) -> Reported:
    where = f"{path}: entry {i}"
    if not isinstance(row, dict):
        raise DDBenchError(f"{where} is not an object")
    if "id" in row:
        where += f" ({row['id']})"
    missing = [k for k in _REQUIRED if k not in row]
    if missing:
        raise DDBenchError(f"{where} is malformed (missing {', '.join(missing)})")
    extra = sorted(set(row) - set(_REQUIRED) - set(_OPTIONAL))
    if extra:
        raise DDBenchError(f"{where} is malformed (unknown field(s) {', '.join(extra)})")
    for k in ("id", "figure", "unit", "quote", "status") + tuple(k for k in _OPTIONAL if k in row):
        if not isinstance(row[k], str) or not row[k].strip():
            raise DDBenchError(f"{where} is malformed ({k} must be a non-empty string)")
    value = row["value"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DDBenchError(f"{where} is malformed (value must be a finite number, got {value!r})")
    if row["status"] not in STATUSES:
        raise DDBenchError(f"{where} is malformed (status {row['status']!r}; expected one of "
                           f"{', '.join(STATUSES)})")
    if row["status"] != "replayed" and "reason" not in row:
        raise DDBenchError(f"{where} is malformed (status {row['status']!r} needs a reason)")
    return Reported(id=row["id"], figure=row["figure"], value=float(value), unit=row["unit"], quote=row["quote"],
                    status=row["status"], reason=row.get("reason", ""), inconsistency=row.get("inconsistency", ""),
                    derived=row.get("derived", ""))


def load_reported(path: str | None = None) -> dict[str, Reported]:
    path = str(path or traces_dir("paper", "reported.json"))
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DDBenchError(f"cannot read the paper's numbers {path}: {exc}".replace("\n", " ")) from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise DDBenchError(f"{path}: expected schema {SCHEMA}, got {got!r}")
    numbers = doc.get("numbers")
    if not isinstance(numbers, list) or not numbers:
        raise DDBenchError(f"{path}: 'numbers' must be a non-empty list")
    out: dict[str, Reported] = {}
    for i, row in enumerate(numbers):
        rep = _entry(path, i, row)
        if rep.id in out:
            raise DDBenchError(f"{path}: duplicate id {rep.id}")
        out[rep.id] = rep
    return out


@lru_cache(maxsize=1)
def reported() -> dict[str, Reported]:
    return load_reported()


def coverage(paper: dict[str, Reported], compared: set[str]) -> dict:
    """Counts by status. A number counts as replayed only if its status says so and a figure of
    this run compares it; DDBenchError where the two disagree."""
    marked = {k for k, r in paper.items() if r.replayed}
    unknown = sorted(compared - set(paper))
    if unknown:
        raise DDBenchError(f"figures compare against paper number(s) not in reported.json: {', '.join(unknown)}")
    wrongly = sorted(compared - marked)
    if wrongly:
        raise DDBenchError(f"reported.json marks {', '.join(wrongly)} as not replayed, but a figure compares it")
    counts = {s: sum(r.status == s for r in paper.values()) for s in STATUSES}
    counts["total"] = len(paper)
    counts["replayed_now"] = len(marked & compared)
    counts["replayed_missing"] = sorted(marked - compared)
    counts["contradicted"] = sum(bool(r.inconsistency) for r in paper.values() if r.replayed)
    return counts


def coverage_line(c: dict) -> str:
    line = (f"{c['replayed_now']} of {c['total']} paper numbers replayed; {c['not replayable']} not replayable, "
            f"with reasons; {c['inconsistent']} inconsistent in the paper; {c['not replayed yet']} not replayed yet")
    if c.get("contradicted"):
        line += f"; of the replayed, {c['contradicted']} contradicted elsewhere in the paper"
    if c["replayed_missing"]:
        line += f" ({len(c['replayed_missing'])} marked replayed but not in this run)"
    return line

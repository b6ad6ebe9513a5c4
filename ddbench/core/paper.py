"""The paper's reported numbers (traces/paper/reported.json), validated on load."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache

from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir

SCHEMA = 1


@dataclass(frozen=True)
class Reported:
    id: str
    figure: str
    value: float
    unit: str
    quote: str


def load_reported(path: str | None = None) -> dict[str, Reported]:
    path = str(path or traces_dir("paper", "reported.json"))
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise DDBenchError(f"cannot read the paper's numbers {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise DDBenchError(f"{path}: expected schema {SCHEMA}, got {doc.get('schema') if isinstance(doc, dict) else doc!r}")
    out: dict[str, Reported] = {}
    for i, row in enumerate(doc.get("numbers", [])):
        try:
            rep = Reported(id=str(row["id"]), figure=str(row["figure"]), value=float(row["value"]),
                           unit=str(row["unit"]), quote=str(row["quote"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise DDBenchError(f"{path}: entry {i} is malformed ({exc})") from None
        if rep.id in out:
            raise DDBenchError(f"{path}: duplicate id {rep.id}")
        out[rep.id] = rep
    return out


@lru_cache(maxsize=1)
def reported() -> dict[str, Reported]:
    return load_reported()

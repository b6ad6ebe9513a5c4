"""What every doctables generator shares: the repository root, the engine sweeps' names, the
formatting of numbers and tables, and the readers of the committed traces."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import median

from ddbench.core.designs import DUALDECODER, FULL_KV, SHADOWKV, SPECACHE

ROOT = Path(__file__).resolve().parent.parent.parent


# The engine sweep (kernels/engine) runs Llama-3-8B shapes at the default budget of 2048 tokens;
# the traces do not repeat the model's name, so the prose says it here.
ENGINE_MODEL = "Llama-3-8B"
CALIBRATION_SWEEP = "engine/h200"              # seed 0: floor, mechanism and validation phases
VALIDATION_SWEEP = "engine/h200-validation"    # seed 1: the validation phase again, a separate run
DESIGNS = (FULL_KV, SHADOWKV, SPECACHE, DUALDECODER)
CTX = 131072


class DocTablesError(Exception):
    """A malformed generated block or a missing trace."""


# -- formatting ---------------------------------------------------------------------------------

def fmt_num(x: float, nd: int) -> str:
    return f"{x:,.{nd}f}" if abs(x) >= 1000 else f"{x:.{nd}f}"


def fmt_spread(values: list[float], nd: int, runs: bool = True) -> str:
    """One value as it is; several as `median (min-max, n runs)` (`median (min-max)` without runs)."""
    if not values:
        return "-"
    if len(values) == 1:
        return fmt_num(values[0], nd)
    tail = f", {len(values)} runs" if runs else ""
    return f"{fmt_num(median(values), nd)} ({fmt_num(min(values), nd)}-{fmt_num(max(values), nd)}{tail})"


def fmt_pct(x: float, nd: int = 1) -> str:
    return f"{100 * x:.{nd}f} %"


def fmt_context(context: int) -> str:
    return f"{context // 1024}K"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


# -- readers ------------------------------------------------------------------------------------

def read_trace_csv(path: Path):
    import pandas as pd
    if not path.is_file():
        raise DocTablesError(f"{path}: missing")
    return pd.read_csv(path)


def read_engine_csv(path: Path):
    """An engine sweep's engine.csv through the typed loader (ddbench.core.traces.load_engine)."""
    from ddbench.core.errors import DDBenchError
    from ddbench.core.traces import load_engine
    if not path.is_file():
        raise DocTablesError(f"{path}: missing")
    try:
        return load_engine(str(path))
    except DDBenchError as exc:
        raise DocTablesError(str(exc)) from None


def read_trace_json(path: Path) -> dict:
    if not path.is_file():
        raise DocTablesError(f"{path}: missing")
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def read_engine_sweep(root: Path, name: str):
    """An engine sweep's rows, with its meta.json (git sha, date, seed)."""
    folder = root / "traces" / name
    rows = read_engine_csv(folder / "engine.csv")
    meta = read_trace_json(folder / "meta.json")
    return rows, meta


def sweep_provenance(name: str, meta: dict) -> str:
    p = meta.get("provenance", {})
    return f"`traces/{name}` (git {p.get('git_sha')}, {str(p.get('date_utc', ''))[:10]}, seed {meta.get('seed')})"


def own_step_rows(rows):
    """A design's own step: DualDecoder's and SpeCache's rows with two query tokens (the dual-token
    step), not the one-token variant the floor phase also runs under the same design name."""
    return rows[rows["tokens"] == rows["tokens"].max()] if len(rows) else rows



def is_present(x) -> bool:
    return x is not None and x == x        # NaN != NaN


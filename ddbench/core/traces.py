"""Readers for measured traces committed under traces/ (no torch): the kernel
benchmark CSVs written by `ddbench bench kernels` and the engine sweep of
`ddbench bench engine`. Bad or missing files raise DDBenchError with one line."""

from __future__ import annotations

import os

from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir

KERNEL_COLUMNS = ("schema", "kernel", "variant", "batch", "bytes", "latency_ms", "gpu", "git_sha", "date_utc")
ENGINE_PROVENANCE = ("gpu", "git_sha", "date_utc")


def _read(what: str, path: str, columns: tuple[str, ...]):
    import pandas as pd

    try:
        df = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise DDBenchError(f"cannot read {what} {path}: {exc}") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise DDBenchError(f"{path}: missing columns {', '.join(missing)}")
    return df


def kernel_bench(gpu_dir: str = "h200"):
    """traces/kernels/<gpu_dir>/kernels.csv as a DataFrame, columns and latencies checked."""
    path = str(traces_dir("kernels", gpu_dir, "kernels.csv"))
    df = _read("kernel benchmarks", path, KERNEL_COLUMNS)
    if (df.latency_ms <= 0).any():
        raise DDBenchError(f"{path}: non-positive latency_ms")
    return df


def engine_bench(gpu_dir: str = "h200"):
    """traces/engine/<gpu_dir>/engine.csv (the decode-step engine sweep), checked, with its provenance."""
    path = str(traces_dir("engine", gpu_dir, "engine.csv"))
    df = load_engine(path)
    missing = [c for c in ENGINE_PROVENANCE if c not in df.columns]
    if missing:
        raise DDBenchError(f"{path}: missing columns {', '.join(missing)}")
    return df


REQUIRED = {"design": str, "context": int, "batch": int, "miss_rate": str, "transfers": int,
            "urgent_programs": int, "status": str, "step_ms": float, "prefetch_mib": float,
            "urgent_mib": float, "link_mib": float, "link_gbps": float, "exposed_ms": float}


def load_engine(path: str):
    """An engine sweep's engine.csv as a DataFrame, checked: the columns a replay needs, their
    types, known designs, miss rates in [0, 1] or 'none'."""
    import pandas as pd
    from ddbench.core.systems import SYSTEMS
    name = os.path.basename(path)
    try:
        df = pd.read_csv(path, comment="#", dtype={"miss_rate": str})
    except FileNotFoundError:
        raise DDBenchError(f"{path}: no such file (run the engine sweep, kernels/engine/bench.py)") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise DDBenchError(f"{path}: not a CSV ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    missing = sorted(set(REQUIRED) - set(df.columns))
    if missing:
        raise DDBenchError(f"{name}: missing column(s) {', '.join(missing)}")
    if df.empty:
        raise DDBenchError(f"{name}: no rows")
    for col, typ in REQUIRED.items():
        if typ is str:
            if df[col].isna().any():
                raise DDBenchError(f"{name}: empty {col} in row {int(df[col].isna().idxmax()) + 1}")
            df[col] = df[col].astype(str).str.strip()
            continue
        num = pd.to_numeric(df[col], errors="coerce")
        bad = num.isna() & (df.status == "ok") if col not in ("context", "batch", "transfers", "urgent_programs") \
            else num.isna()
        if bad.any():
            i = int(bad.idxmax())
            raise DDBenchError(f"{name}: {col} is not a number in row {i + 1}: {df[col][i]!r}")
        if typ is int:
            if ((num % 1) != 0).any() or (num < 0).any():
                raise DDBenchError(f"{name}: {col} must be a non-negative integer")
            num = num.astype(int)
        df[col] = num
    for r in df.itertuples():
        if r.design not in SYSTEMS:
            raise DDBenchError(f"{name}: unknown design {r.design!r} in row {r.Index + 1}")
        if r.miss_rate != "none":
            try:
                v = float(r.miss_rate)
            except ValueError:
                raise DDBenchError(f"{name}: miss_rate {r.miss_rate!r} in row {r.Index + 1} is neither a number"
                                   " nor 'none'") from None
            if not 0.0 <= v <= 1.0:
                raise DDBenchError(f"{name}: miss_rate {v} in row {r.Index + 1} is outside [0, 1]")
        if r.status == "ok" and (r.step_ms <= 0 or r.batch < 1 or r.context < 1):
            raise DDBenchError(f"{name}: row {r.Index + 1} has a non-positive step, batch or context")
    return df


def provenance(df) -> str:
    """'NVIDIA H200, torch 2.11.0+cu130, triton 3.6.0, git dff4507, 2026-11-29' from a trace's columns."""
    r = df.iloc[0]
    parts = [str(r.gpu)]
    for col, label in (("torch", "torch "), ("triton", "triton ")):
        if col in df.columns:
            parts.append(f"{label}{r[col]}")
    parts += [f"git {str(r.git_sha)[:7]}", str(r.date_utc)[:10]]
    return ", ".join(parts)

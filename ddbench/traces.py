"""Readers for measured traces committed under traces/ (no torch): the kernel
benchmark CSVs written by `ddbench bench kernels` and the engine sweep of
`ddbench bench engine`. Bad or missing files raise DDBenchError with one line."""

from __future__ import annotations

import os

from ddbench.errors import DDBenchError

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "traces")
KERNEL_COLUMNS = ("schema", "kernel", "variant", "batch", "bytes", "latency_ms", "gpu", "git_sha", "date_utc")
ENGINE_COLUMNS = ("schema", "design", "context", "batch", "miss_rate", "transfers", "urgent_programs", "status",
                  "step_ms", "link_gbps", "gpu", "git_sha", "date_utc")


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


def kernel_bench(gpu_dir: str = "nvidia-h200"):
    """traces/kernels/<gpu_dir>/kernels.csv as a DataFrame, columns and latencies checked."""
    path = os.path.join(ROOT, "kernels", gpu_dir, "kernels.csv")
    df = _read("kernel benchmarks", path, KERNEL_COLUMNS)
    if (df.latency_ms <= 0).any():
        raise DDBenchError(f"{path}: non-positive latency_ms")
    return df


def engine_bench(gpu_dir: str = "nvidia-h200"):
    """traces/engine/<gpu_dir>/engine.csv (the decode-step engine sweep) as a DataFrame, columns checked."""
    return _read("engine measurements", os.path.join(ROOT, "engine", gpu_dir, "engine.csv"), ENGINE_COLUMNS)


def provenance(df) -> str:
    """'NVIDIA H200, torch 2.11.0+cu130, triton 3.6.0, git dff4507, 2026-11-29' from a trace's columns."""
    r = df.iloc[0]
    parts = [str(r.gpu)]
    for col, label in (("torch", "torch "), ("triton", "triton ")):
        if col in df.columns:
            parts.append(f"{label}{r[col]}")
    parts += [f"git {str(r.git_sha)[:7]}", str(r.date_utc)[:10]]
    return ", ".join(parts)

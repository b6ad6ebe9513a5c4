"""Readers for measured traces committed under traces/ (no torch): the kernel
benchmark CSVs written by `ddbench bench kernels` and the engine sweep of
`ddbench bench engine`, validated row by row against the typed schemas of
ddbench/core/schemas.py. Bad or missing files raise DDBenchError with one line
naming the file, the line and the field."""

from __future__ import annotations

from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir

KERNEL_COLUMNS = ("schema", "kernel", "variant", "batch", "bytes", "latency_ms", "gpu", "git_sha", "date_utc")
ENGINE_PROVENANCE = ("gpu", "git_sha", "date_utc")
# a profile's side files beside its per-layer <model>.csv in traces/accuracy (ddbench/profile/trace.py)
PROFILE_SIDE_CSVS = (".steps.csv", ".cache.csv", ".fp8.csv", ".tasks.csv", ".runs.csv", ".contexts.csv", ".index.csv")


def is_profile_layer_csv(name: str) -> bool:
    """Whether a CSV of traces/accuracy is a profile's per-layer file, not one of its side files."""
    return name.endswith(".csv") and not name.endswith(PROFILE_SIDE_CSVS)


def _frame(path: str, model, what: str, **read):
    """The CSV validated row by row against `model` (ddbench.core.schemas), as a DataFrame whose
    schema columns hold the validated values and whose other columns are read by pandas."""
    import pandas as pd

    from ddbench.core.schemas import read_csv
    rows = read_csv(path, model, what=what)
    try:
        df = pd.read_csv(path, comment="#", **read)
    except (OSError, ValueError) as exc:
        raise DDBenchError(f"cannot read {what} {path}: {str(exc).splitlines()[0]}") from None
    if len(df) != len(rows):
        raise DDBenchError(f"{what} {path}: {len(df)} rows read, {len(rows)} validated (blank or broken lines)")
    for name, field in model.model_fields.items():
        col = field.alias or name
        df[col] = [getattr(r, name) for r in rows]
    return df


def kernel_bench(gpu_dir: str = "h200"):
    """traces/kernels/<gpu_dir>/kernels.csv as a DataFrame, every row checked (schemas.KernelRow)."""
    from ddbench.core.schemas import KernelRow
    return _frame(str(traces_dir("kernels", gpu_dir, "kernels.csv")), KernelRow, "kernel benchmarks")


def engine_bench(gpu_dir: str = "h200"):
    """traces/engine/<gpu_dir>/engine.csv (the decode-step engine sweep), checked, with its provenance."""
    path = str(traces_dir("engine", gpu_dir, "engine.csv"))
    df = load_engine(path)
    missing = [c for c in ENGINE_PROVENANCE if c not in df.columns]
    if missing:
        raise DDBenchError(f"engine sweep {path}, field {missing[0]}: missing from the header")
    return df


def load_engine(path: str):
    """An engine sweep's engine.csv as a DataFrame, every row checked (schemas.EngineRow): the columns
    a replay needs, their types, known designs, miss rates in [0, 1] or 'none', measured values in
    'ok' rows. Non-'ok' rows may leave measurements empty (NaN in the frame)."""
    import math

    from ddbench.core.schemas import EngineRow
    # provenance as text: a sha of digits and one 'e' would otherwise read as a float
    df = _frame(path, EngineRow, "engine sweep", dtype={"miss_rate": str, "git_sha": str})
    for col in ("step_ms", "prefetch_mib", "urgent_mib", "link_mib", "link_gbps", "exposed_ms"):
        df[col] = [math.nan if v is None else v for v in df[col]]
    return df


def provenance(df) -> str:
    """'NVIDIA H200, torch 2.11.0+cu130, triton 3.6.0, git <sha>, 2026-11-29' from a trace's columns."""
    r = df.iloc[0]
    parts = [str(r.gpu)]
    for col, label in (("torch", "torch "), ("triton", "triton ")):
        if col in df.columns:
            parts.append(f"{label}{r[col]}")
    parts += [f"git {str(r.git_sha)[:7]}", str(r.date_utc)[:10]]
    return ", ".join(parts)


def accuracy_rows(path: str) -> list:
    """An accuracy profile (traces/accuracy/<model>.csv, `ddbench profile --layer-accuracy`) as
    validated rows (schemas.AccuracyRow: layer, hit_rate, optional reuse_hit_rate, n, context_tokens,
    budget_tokens, temperature; other columns in `row.model_extra`). One-line errors name the file,
    the line and the field. Selecting and averaging rows is sim/hitrates.py's job."""
    from ddbench.core.schemas import AccuracyRow, read_csv
    return read_csv(str(path), AccuracyRow, what="accuracy profile")


def cache_profile(path: str):
    """A chunk-cache replay (traces/accuracy/<model>.cache.csv) as a DataFrame, every row checked
    (schemas.CacheRow): a bad layer, policy or rate, or a truncated line, is a one-line error naming
    the file, the line and the field."""
    from ddbench.core.schemas import CacheRow
    df = _frame(str(path), CacheRow, "cache profile")
    _complete_grid(df, str(path))
    return df


def _complete_grid(df, path: str) -> None:
    """A file cut at a line's end still parses: every configuration must cover every layer, and (for each
    kind of prediction) every profiled context, task, budget, policy and capacity must meet each other."""
    from itertools import product
    keys = [k for k in ("prediction", "context_tokens", "task", "budget_tokens", "chunk_tokens", "policy",
                        "capacity") if k in df.columns]
    layers = set(df.layer)
    for cfg, g in df.groupby(keys, dropna=False):
        if set(g.layer) != layers:
            raise DDBenchError(f"cache profile {path}: truncated or incomplete: {_named(keys, cfg)} has"
                               f" {g.layer.nunique()} of the {len(layers)} layers")
    for _, g in df.groupby(keys[:1], dropna=False):
        have = set(map(tuple, g[keys[1:]].drop_duplicates().values.tolist()))
        for cfg in product(*(sorted(g[k].unique()) for k in keys[1:])):
            if tuple(cfg) not in have:
                raise DDBenchError(f"cache profile {path}: truncated or incomplete: no rows for"
                                   f" {_named(keys[1:], cfg)}")


def _named(keys, values) -> str:
    return ", ".join(f"{k} {v.item() if hasattr(v, 'item') else v}" for k, v in zip(keys, values))


def accuracy_frame(path: str):
    """An accuracy profile (traces/accuracy/<model>.csv) as a DataFrame, every row checked (AccuracyRow)."""
    from ddbench.core.schemas import AccuracyRow
    return _frame(str(path), AccuracyRow, "accuracy profile")

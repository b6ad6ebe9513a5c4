"""ShadowKV's fetch as the engine ran it before its in-place ShadowKV step (the copy-then-regather step; sim/fitted.py
ReuseFetchFit: it prices that engine's rows in the validation only), fitted per gather shape to the
bundle's `reuse_fetch` records (kernels/engine/sweep.py, its `reuse-fetch` phase: the engine's fetch of
one layer alone). Run by `python -m ddbench.sim.fit`; the cost model only loads the result."""

from __future__ import annotations

import numpy as np

from ddbench.sim.fitted import ReuseFetchFit


def fit_reuse_fetch(rows: list[dict], source: str = "") -> ReuseFetchFit | None:
    """ReuseFetchFit of reuse_fetch records of one gather shape; None where they do not determine it
    (fewer than two slot counts or three miss shares)."""
    slots = np.array([float(r["slots"]) for r in rows])
    if len(set(slots)) < 2 or len({r["miss_chunks"] / r["slots"] for r in rows}) < 3:
        return None
    cb, prog, items = (int(rows[0][k]) for k in ("chunk_bytes", "programs", "items"))
    p = np.array([r["miss_chunks"] / r["slots"] for r in rows])
    rounds = np.ceil(slots / (prog * items))
    fetch = np.array([r["fetch_ms"] / 1e3 for r in rows])
    copy = np.array([r["copy_ms"] / 1e3 for r in rows])
    nbytes = 2 * slots * cb
    _, per_byte = np.linalg.lstsq(np.c_[np.ones_like(nbytes), nbytes], copy, rcond=None)[0]
    x = np.c_[np.ones_like(p), rounds * (1 - p), rounds * p, rounds * p * (1 - p)]
    k = np.linalg.lstsq(x / fetch[:, None], (fetch - nbytes * per_byte) / fetch, rcond=None)[0]
    rel = (x @ k + nbytes * per_byte) / fetch - 1
    res = tuple((int(r["context"]), int(r["batch"]), float(r["miss_rate"]), float(e)) for r, e in zip(rows, rel))
    return ReuseFetchFit(float(k[0]), float(1 / per_byte), float(k[1]), float(k[2]), float(k[3]), len(rows), res,
                         source)


def fit_bundle(bundle) -> dict:
    """(chunk_bytes, programs, in_flight) -> ReuseFetchFit of every gather shape of the bundle's
    reuse_fetch records (any design and model: the fetch's cost is a function of its slots, chunk size
    and miss share) that determines one; {} for a bundle without the section (older bundles)."""
    rows = bundle.rows.get("reuse_fetch", [])
    src = bundle.meta.get("sections", {}).get("reuse_fetch", {}).get("source", {}) or {}
    source = f"engine sweep git {src.get('git_sha')} {src.get('date_utc')}" if src else ""
    groups: dict = {}
    for r in rows:
        groups.setdefault((int(r["chunk_bytes"]), int(r["programs"]), int(r["items"])), []).append(r)
    fits = {}
    for key, rs in groups.items():
        fit = fit_reuse_fetch(rs, source)
        if fit is not None:
            fits[key] = fit
    return fits

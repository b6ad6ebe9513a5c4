"""The link bench's measured gather rates (`ddbench bench link`, traces/link/<gpu>/link.csv) where a launch
differs from the calibration bundle's (32 programs, 2 pieces in flight each):

    slot_gather_gbps(gpu, piece_bytes) -> (GB/s, rows) | None   the engine's urgent slot gather (64 programs)
        that ShadowKV's in-place step fetches its misses with: the median of the bench's gather rows at 64
        programs within 10 % of the piece size
    fp8_gather_gbps(gpu, piece_bytes) -> (GB/s, rows) | None    the engine's gathers of fp8 pieces, which keep
        ENGINE_FP8_IN_FLIGHT pieces in flight per launch (32 programs x 8 for a prefetch, 64 x 4 urgent):
        the median of the bench's fp8 gather rows at that many in flight, within 10 % of the piece size,
        from calls of at least LARGE_CALL bytes (the fixed cost of a call stays the bundle's)
"""

from __future__ import annotations

import csv

from ddbench.core.paths import traces_dir

SLOT_PROGRAMS = "64"
ENGINE_FP8_IN_FLIGHT = 256          # kernels/gather.FP8_IN_FLIGHT (tests/test_linkrates.py holds them equal)
LARGE_CALL = 16 << 20


def _gather_rows(gpu: str, piece_bytes: int, keep) -> tuple[float, int] | None:
    path = traces_dir("link", gpu, "link.csv")
    if not path.exists():
        return None
    with open(path, encoding="utf-8") as fh:
        vals = sorted(float(r["gbps"]) for r in csv.DictReader(fh) if r["test"] == "gather"
                      and abs(float(r["piece_bytes"]) - piece_bytes) <= 0.1 * piece_bytes and keep(r))
    return (vals[len(vals) // 2], len(vals)) if vals else None


def slot_gather_gbps(gpu: str, piece_bytes: int) -> tuple[float, int] | None:
    return _gather_rows(gpu, piece_bytes, lambda r: r["programs"] == SLOT_PROGRAMS)


def fp8_gather_gbps(gpu: str, piece_bytes: int) -> tuple[float, int] | None:
    return _gather_rows(gpu, piece_bytes, lambda r: r["variant"].startswith("fp8") and r["programs"] and r["items"]
                        and int(float(r["programs"])) * int(float(r["items"])) == ENGINE_FP8_IN_FLIGHT
                        and float(r["call_bytes"]) >= LARGE_CALL)

"""The link bench's measured gather rates (`ddbench bench link`, traces/link/<gpu>/link.csv) where a launch
differs from the calibration bundle's: the engine's urgent slot gather (64 programs) that ShadowKV's in-place
step fetches its misses with.

    slot_gather_gbps(gpu, piece_bytes) -> (GB/s, rows) | None   the median of the bench's gather rows at
                                                                64 programs within 10 % of the piece size
"""

from __future__ import annotations

import csv

from ddbench.core.paths import traces_dir

SLOT_PROGRAMS = "64"


def slot_gather_gbps(gpu: str, piece_bytes: int) -> tuple[float, int] | None:
    path = traces_dir("link", gpu, "link.csv")
    if not path.exists():
        return None
    with open(path, encoding="utf-8") as fh:
        vals = sorted(float(r["gbps"]) for r in csv.DictReader(fh) if r["test"] == "gather"
                      and r["programs"] == SLOT_PROGRAMS and abs(float(r["piece_bytes"]) - piece_bytes)
                      <= 0.1 * piece_bytes)
    return (vals[len(vals) // 2], len(vals)) if vals else None

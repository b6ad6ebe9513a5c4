"""What a calibration bundle holds: its sections, their columns, and the provenance keys.

Both the bundle reader and writer (ddbench/core/calibration.py) and the row schemas
(ddbench/core/schemas.py) read this table; it imports nothing, so neither imports the other.
"""

from __future__ import annotations

# section -> (file, key columns, numeric columns that must be > 0, other columns)
SECTIONS: dict[str, dict] = {
    "link": {
        "file": "link.csv",
        "key": ["method", "direction", "transfer_bytes", "chunk_bytes", "blocks"],
        "positive": ["latency_ms", "gbps"],
        "other": [],
    },
    "linear": {
        "file": "linear.csv",
        "key": ["model", "layer", "k", "n", "m_tokens"],
        "positive": ["latency_ms", "tflops"],
        "other": [],
    },
    "kernels": {
        "file": "kernels.csv",
        "key": ["kernel", "batch", "q_tokens", "kv_tokens", "num_heads", "num_kv_heads", "head_dim", "param"],
        "positive": ["latency_ms", "hbm_floor_ms"],
        "other": [],
    },
    "interference": {
        "file": "interference.csv",
        "key": ["background", "background_blocks", "urgent", "urgent_stream"],
        "positive": ["urgent_alone_ms", "urgent_ms", "urgent_slowdown", "gemm_alone_ms", "gemm_ms",
                     "gemm_slowdown"],
        "other": [],
    },
    "compute_interference": {
        "file": "compute_interference.csv",
        "key": ["family", "shape", "gather_programs"],
        "positive": ["size", "calls", "alone_ms", "beside_ms", "slowdown", "gather_gbps_alone", "gather_gbps_beside"],
        "other": ["size_unit"],
    },
    "ceilings": {
        "file": "ceilings.csv",
        "key": ["name"],
        "positive": ["value"],
        "other": ["unit"],
    },
    "engine": {
        "file": "engine.csv",
        "key": ["system", "model", "batch", "context", "layer"],
        "positive": ["compute_ms"],
        "other": ["exposed_transfer_ms", "urgent_bytes", "prefetch_bytes"],
    },
    # per layer: ms (median of CUDA-graph replays of 32 layers, / 32); slots = B x H x k chunks;
    # miss_chunks (chunks read from the host) and link_bytes = miss_chunks x chunk_bytes; programs x
    # items = the gather's persistent blocks x chunks in flight per block
    "reuse_fetch": {
        "file": "reuse_fetch.csv",
        "key": ["system", "model", "context", "batch", "miss_rate"],
        "positive": ["fetch_ms", "copy_ms", "plan_ms", "gather_ms", "slots", "chunk_bytes", "programs", "items"],
        "other": ["miss_chunks", "link_bytes"],
    },
}
STRING_COLUMNS = {"method", "direction", "model", "layer", "kernel", "background", "urgent", "urgent_stream",
                  "name", "unit", "system", "family", "shape", "size_unit"}


def columns(section: str) -> list[str]:
    s = SECTIONS[section]
    return s["key"] + s["positive"] + s["other"]


# what bundle.json's provenance must name
PROVENANCE_KEYS = ("gpu", "device_name", "driver", "cuda", "torch", "triton", "git_sha", "date", "command", "host")

"""Device-side checks used during development of the graph engine (one call, several checks).

    python -m kernels.engine.devcheck   (prints a short table; see kernels/engine/README.md)
"""
from __future__ import annotations

import sys

import torch


def specache_kernel(splits=(None, 2, 4, 8, 16)):
    from kernels.bench import Rows, bench_specache_triton
    from kernels.engine.bench import hbm_gbps
    hbm = hbm_gbps()
    rows = Rows()
    bench_specache_triton(rows, torch.device("cuda"), hbm, [(8, 32768), (16, 131072)], splits=splits)
    return rows


if __name__ == "__main__":
    specache_kernel()
    sys.exit(0)

"""Programmatic dependent launch (PDL, Hopper and later) for the engine's Triton kernels.

A kernel launched with PDL may be scheduled while its predecessor on the stream is still running;
it signals its own dependents at once (`gdc_launch_dependents`) and waits (`gdc_wait`) for the
predecessor's completion, and the visibility of its writes, before its first load. Each kernel calls
`pdl_enter(PDL)` as its first statement and is launched with `**pdl_kw(tensor)`. Inside a CUDA graph
this hides part of each kernel's launch: measured on the H200 (traces/engine/h200/devcheck-pdl.json,
`python -m kernels.engine.devcheck_pdl`): 1.09 -> 0.65 us per kernel in a chain of 400 small
dependent kernels, 1.46 -> 1.23 us with a cuBLAS GEMV every 4 kernels.

Off on the CPU (the interpreter has no grid dependency control), before sm_90, and with
DDBENCH_PDL=0 (for A/B timing).
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl


@functools.lru_cache(maxsize=None)
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


MODES = {"0": 0, "start": 1, "1": 1, "wait": 2}   # DDBENCH_PDL: off; trigger at start + wait; wait only


def pdl_mode() -> int:
    return MODES.get(os.environ.get("DDBENCH_PDL", "1"), 1)


def pdl_on(t: torch.Tensor) -> bool:
    if not t.is_cuda or pdl_mode() == 0:
        return False
    return _capable(t.device.index if t.device.index is not None else torch.cuda.current_device())


def pdl_kw(t: torch.Tensor) -> dict:
    """Launch keywords for a kernel that starts with pdl_enter(PDL), on the device of `t`."""
    return dict(PDL=pdl_mode(), launch_pdl=True) if pdl_on(t) else dict(PDL=0)


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    if PDL == 1:
        tl.extra.cuda.gdc_launch_dependents()
    if PDL != 0:
        tl.extra.cuda.gdc_wait()

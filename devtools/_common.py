"""Shared by the device checks.

refusal(name, reps=None) -> the one-line error of a check that cannot run (no CUDA GPU, or --reps
    below 1), else None; each script prints it to stderr and exits 2.
rand_bf16(*shape) -> a fresh standard-normal bf16 tensor on the GPU.
command(name, argv=None) -> the command line a check records in its provenance.
"""
from __future__ import annotations

import torch


def refusal(name: str, reps: int | None = None) -> str | None:
    if not torch.cuda.is_available():
        return f"{name}: needs a CUDA GPU"
    if reps is not None and reps < 1:
        return f"{name}: --reps must be at least 1"
    return None


def rand_bf16(*shape, device="cuda"):
    return torch.randn(*shape, device=device, dtype=torch.bfloat16)


def command(name: str, argv=None) -> str:
    """The command line recorded in a check's provenance: `python3 -m devtools.<name> <args>`."""
    import sys
    args = sys.argv[1:] if argv is None else list(argv)
    return " ".join([f"python3 -m devtools.{name}", *args])

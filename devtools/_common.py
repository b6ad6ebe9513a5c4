"""Shared by the device checks.

refusal(name, reps=None) -> the one-line error of a check that cannot run (no CUDA GPU, or --reps
    below 1), else None; each script prints it to stderr and exits 2.
rand_bf16(*shape) -> a fresh standard-normal bf16 tensor on the GPU.
command(name, argv=None) -> the command line a check records in its provenance.
context_batches(name, text, contexts=None) -> ([(context, batch)], None), or (None, the one-line error) for
    a --points value that is not CONTEXT:BATCH,... of positive integers (contexts: the allowed ones).
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


def context_batches(name: str, text: str, contexts=None):
    try:
        pts = [tuple(int(v) for v in p.split(":")) for p in text.split(",")]
    except ValueError:
        pts = None
    if not pts or any(len(p) != 2 or min(p) < 1 for p in pts):
        return None, f"{name}: --points must be CONTEXT:BATCH,... of positive integers, got {text!r}"
    if contexts is not None and any(c not in contexts for c, _ in pts):
        return None, f"{name}: contexts must be among {sorted(contexts)}"
    return pts, None

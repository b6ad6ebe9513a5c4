"""Shared test set-up.

Without a CUDA GPU, Triton kernels run through its CPU interpreter: the flag must
be set before any kernel module is imported, so it is set here, first.
"""

import os


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

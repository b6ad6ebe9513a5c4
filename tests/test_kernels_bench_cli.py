"""`ddbench bench kernels` without a GPU: one-line error, exit status 2."""

import subprocess
import sys

import pytest
import torch

from ddbench.commands.bench import slug


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_bench_without_cuda_fails_in_one_line():
    p = subprocess.run([sys.executable, "-m", "ddbench", "bench", "kernels"], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "CUDA" in p.stderr and "Traceback" not in p.stderr


def test_gpu_folder_slug():
    assert slug("NVIDIA H200") == "nvidia-h200"

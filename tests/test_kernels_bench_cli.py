"""`ddbench bench kernels` without a GPU: one-line error, exit status 2."""

import subprocess
import sys

import pytest
import torch

from ddbench.core.catalog.gpus import catalog_gpu_name


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_bench_without_cuda_fails_in_one_line():
    p = subprocess.run([sys.executable, "-m", "ddbench", "bench", "kernels"], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "CUDA" in p.stderr and "Traceback" not in p.stderr


def test_one_gpu_folder_rule():
    """Every trace folder is named by the catalog GPU name the driver's device name maps to."""
    assert catalog_gpu_name("NVIDIA H200", 150_109_880_320) == "h200"
    assert catalog_gpu_name("NVIDIA H100 80GB HBM3", 85 * 2**30) == "h100-80gb"
    assert catalog_gpu_name("NVIDIA A100-SXM4-40GB", 40 * 2**30) == "a100-40gb"
    assert catalog_gpu_name("Some New GPU", 1) == "some-new-gpu"


def test_git_sha_marks_a_dirty_tree(monkeypatch):
    """provenance's sha: HEAD, '+dirty' when tracked files differ (a copied tree with a stale .git),
    'unknown' without git."""
    from kernels import timing
    answers = {"rev-parse": "abc123", "status": " M kernels/x.py"}
    monkeypatch.setattr(timing, "command_output", lambda args: next((v for k, v in answers.items() if k in args), ""))
    assert timing.git_sha("/r") == "abc123+dirty"
    answers["status"] = ""
    assert timing.git_sha("/r") == "abc123"
    answers["rev-parse"] = ""
    assert timing.git_sha("/r") == "unknown"


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
    """The one git sha (ddbench.core.provenance, kernels' provenance too): HEAD, '+dirty' when tracked files
    differ (a copied tree with a stale .git), 'unknown' without git, DDBENCH_GIT_SHA where set."""
    from ddbench.core import provenance
    answers = {"rev-parse": "abc123", "status": " M kernels/x.py"}
    monkeypatch.setattr(provenance, "command_output",
                        lambda args, timeout=20: next((v for k, v in answers.items() if k in args), ""))
    monkeypatch.delenv("DDBENCH_GIT_SHA", raising=False)

    def sha():
        provenance.git_sha.cache_clear()
        return provenance.git_sha()
    assert sha() == "abc123+dirty"
    answers["status"] = ""
    assert sha() == "abc123"
    answers["rev-parse"] = ""
    assert sha() == "unknown"
    monkeypatch.setenv("DDBENCH_GIT_SHA", "feed42")
    assert sha() == "feed42"
    provenance.git_sha.cache_clear()


"""GPU-only: a short calibration writes a valid bundle, and a rerun resumes without re-measuring."""

import pytest

pytestmark = pytest.mark.gpu


def test_calibrate_ceilings_resume(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from ddbench.core.calibration import load_bundle
    from ddbench.kernels.calibrate import run_calibration

    r1 = run_calibration(str(tmp_path), "testgpu", ["ceilings"], 120, False, "pytest", log=lambda m: None)
    assert r1["measured"] == 2 and not r1["errors"]
    b = load_bundle(r1["path"])
    values = {r["name"]: r["value"] for r in b.rows["ceilings"]}
    assert values["hbm_d2d_copy_gbps"] > 100
    assert values["bf16_gemm_tflops"] > 10
    r2 = run_calibration(str(tmp_path), "testgpu", ["ceilings"], 120, False, "pytest", log=lambda m: None)
    assert r2["measured"] == 0 and r2["skipped"] == 2
    assert len(load_bundle(r2["path"]).provenance["runs"]) == 2

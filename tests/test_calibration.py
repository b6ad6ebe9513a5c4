"""Calibration bundles on the CPU: resumable writing, schema check, one-line errors on defects."""

import json
import os

import pytest

from ddbench.core.calibration import SCHEMA_VERSION, BundleWriter, load_bundle
from ddbench.core.errors import DDBenchError

PROV = {"gpu": "testgpu", "device_name": "Test GPU", "driver": "1", "cuda": "1", "torch": "x", "triton": "y",
        "git_sha": "abc", "date": "2026-01-01", "command": "pytest", "host": "h"}


def _link_row(size, gbps):
    return {"method": "copy_engine", "direction": "h2d", "transfer_bytes": size, "chunk_bytes": size, "blocks": 0,
            "latency_ms": size / gbps / 1e6, "gbps": gbps}


def test_writer_roundtrip_and_resume(tmp_path):
    path = str(tmp_path / "testgpu")
    w = BundleWriter(path, "testgpu", PROV)
    w.add("link", _link_row(4096, 0.1))
    w.add("link", _link_row(1 << 20, 30.0))
    # an interrupted run: section not completed; a new writer resumes with both rows present
    w2 = BundleWriter(path, "testgpu", dict(PROV, date="2026-01-02"))
    assert w2.resumed == 2
    assert w2.have("link", method="copy_engine", direction="h2d", transfer_bytes=4096, chunk_bytes=4096, blocks=0)
    assert not w2.have("link", method="copy_engine", direction="d2h", transfer_bytes=4096, chunk_bytes=4096, blocks=0)
    w2.add("link", _link_row(16 << 20, 50.0))
    w2.complete("link")
    b = load_bundle(path)
    assert b.complete("link") and len(b.rows["link"]) == 3
    assert [r["date"] for r in b.provenance["runs"]] == ["2026-01-01", "2026-01-02"]
    assert b.rows["link"][2]["gbps"] == 50.0


def test_writer_refuses_other_gpu(tmp_path):
    path = str(tmp_path / "g")
    BundleWriter(path, "testgpu", PROV).add("link", _link_row(4096, 0.1))
    with pytest.raises(DDBenchError, match="use --fresh"):
        BundleWriter(path, "testgpu", dict(PROV, device_name="Other GPU"))
    assert BundleWriter(path, "testgpu", dict(PROV, device_name="Other GPU"), fresh=True).resumed == 0


def _bundle(tmp_path):
    path = str(tmp_path / "b")
    w = BundleWriter(path, "testgpu", PROV)
    w.add("link", _link_row(4096, 0.1))
    w.complete("link")
    return path


@pytest.mark.parametrize("defect, message", [
    ("version", "schema_version"),
    ("json", "not valid JSON"),
    ("columns", "has columns"),
    ("number", "is not a number"),
    ("negative", "must be positive"),
    ("provenance", "provenance lacks"),
])
def test_malformed_bundle_one_line_error(tmp_path, defect, message):
    path = _bundle(tmp_path)
    meta_file, csv_file = os.path.join(path, "bundle.json"), os.path.join(path, "link.csv")
    meta = json.load(open(meta_file))
    text = open(csv_file).read()
    if defect == "version":
        meta["schema_version"] = SCHEMA_VERSION + 1
    elif defect == "provenance":
        del meta["provenance"]["git_sha"]
    if defect == "json":
        open(meta_file, "w").write("{not json")
    else:
        json.dump(meta, open(meta_file, "w"))
    if defect == "columns":
        open(csv_file, "w").write(text.replace("gbps", "GBps"))
    elif defect == "number":
        open(csv_file, "w").write(text.replace(",0.1", ",fast"))
    elif defect == "negative":
        open(csv_file, "w").write(text.replace(",0.1", ",-0.1"))
    with pytest.raises(DDBenchError, match=message) as exc:
        load_bundle(path)
    assert "\n" not in str(exc.value)


def test_missing_bundle_is_user_error(tmp_path):
    with pytest.raises(DDBenchError, match="no calibration bundle"):
        load_bundle(str(tmp_path / "none"))

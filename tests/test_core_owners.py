"""One owner per value (issue 30 part 3): the GPU side's provenance, the git sha's two conventions, the date
and the CSV writer live in ddbench.core, and the copies elsewhere give the same values."""

from __future__ import annotations

import csv
import io

import pytest

from ddbench.core import provenance as P
from ddbench.core.io import rows_csv, write_rows_csv


@pytest.fixture
def fixed_git(monkeypatch):
    answers = {"rev-parse": "0123456789abcdef", "status": " M sim/x.py", "nvidia-smi": "550.1"}
    monkeypatch.setattr(P, "command_output",
                        lambda args, timeout=20: next((v for k, v in answers.items() if k in args), ""))
    for k in ("DDBENCH_GIT_SHA", "DDBENCH_GIT_DIRTY"):
        monkeypatch.delenv(k, raising=False)
    P.git_sha.cache_clear()
    yield answers
    P.git_sha.cache_clear()


def test_git_head_and_dirty_are_the_sha_in_two_fields(fixed_git, monkeypatch):
    assert (P.git_head(), P.git_dirty(), P.git_sha(), P.short_sha()) == ("0123456789abcdef", True, "0123456789abcdef+dirty", "0123456789ab")
    monkeypatch.setenv("DDBENCH_GIT_SHA", "feed42+dirty")
    P.git_sha.cache_clear()
    assert (P.git_head(), P.git_dirty(), P.git_sha()) == ("feed42", True, "feed42+dirty")
    monkeypatch.setenv("DDBENCH_GIT_DIRTY", "no")
    assert P.git_dirty() is False
    monkeypatch.delenv("DDBENCH_GIT_SHA")
    monkeypatch.delenv("DDBENCH_GIT_DIRTY")
    fixed_git["rev-parse"] = ""
    P.git_sha.cache_clear()
    assert (P.git_head(), P.git_dirty(), P.git_sha(), P.short_sha()) == ("unknown", None, "unknown", "unknown")


def test_utc_now_formats():
    z, off = P.utc_now(), P.utc_now(offset=True)
    assert len(z) == 20 and z.endswith("Z") and off.endswith("+00:00") and "." not in off


def test_gpu_provenance_is_kernels_timing_provenance(fixed_git, monkeypatch):
    """gpu_provenance takes the caller's torch and triton; ddbench.kernels.timing.provenance is it, fields in this
    order (the engine CSV's provenance columns)."""
    torch = pytest.importorskip("torch")
    triton = pytest.importorskip("triton")
    import ddbench.kernels.timing as timing
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    ours, theirs = P.gpu_provenance("cmd", torch, triton), timing.provenance("cmd")
    assert list(ours) == list(theirs) == ["gpu", "driver", "cuda", "torch", "triton", "git_sha", "date_utc", "command"]
    ours.pop("date_utc"), theirs.pop("date_utc")
    assert ours == theirs and ours["git_sha"] == "0123456789abcdef+dirty" and ours["driver"] == "550.1"


def test_rows_csv_columns_then_provenance(tmp_path):
    rows = [{"a": 1, "b": 0.5}, {"a": 2}]
    text = rows_csv(rows, ["a", "b"], {"git_sha": "x"})
    assert text == "a,b,git_sha\n1,0.5,x\n2,,x\n"
    assert rows_csv(rows[:1], ["b", "a"], fmt=lambda v: f"<{v}>") == "b,a\n<0.5>,<1>\n"
    with pytest.raises(KeyError):
        rows_csv(rows, ["a", "b"], strict=True)
    path = tmp_path / "t.csv"
    write_rows_csv(str(path), rows, ["a", "b"], {"git_sha": "x"})
    raw = path.read_bytes()
    buf = io.StringIO()                     # what the csv module writes by default: CRLF lines
    w = csv.DictWriter(buf, fieldnames=["a", "b", "git_sha"])
    w.writeheader()
    for r in rows:
        w.writerow({"a": r.get("a"), "b": r.get("b"), "git_sha": "x"})
    assert raw == buf.getvalue().encode()


def test_calibration_provenance_is_gpu_provenance_under_the_bundles_names(fixed_git, monkeypatch):
    """ddbench.kernels.calibrate.provenance builds on ddbench.kernels.timing.provenance and keeps the committed bundle's keys,
    in its order (the runs list aside), with git_sha and git_dirty apart."""
    import json
    import types

    torch = pytest.importorskip("torch")
    triton = pytest.importorskip("triton")
    import ddbench.kernels.calibrate as cal
    from ddbench.core.paths import traces_dir
    props = types.SimpleNamespace(total_memory=150109880320, multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: props)
    ours = cal.provenance("h200", "cmd")
    with open(traces_dir("calibration") / "h200" / "bundle.json", encoding="utf-8") as fh:
        committed = json.load(fh)["provenance"]
    assert list(ours) == [k for k in committed if k != "runs"]
    gpu = P.gpu_provenance("cmd", torch, triton)
    assert {k: ours[k] for k in ("driver", "cuda", "torch", "triton", "command")} == \
           {k: gpu[k] for k in ("driver", "cuda", "torch", "triton", "command")}
    assert (ours["gpu"], ours["device_name"], ours["sm_count"]) == ("h200", "NVIDIA H200", 132)
    assert (ours["git_sha"], ours["git_dirty"]) == ("0123456789abcdef", "yes") and ours["date"].endswith("+00:00")

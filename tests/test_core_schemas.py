"""Typed trace loaders: every committed trace validates, and each defect is one line naming file, line and field."""

import shutil

import pytest

from ddbench.core.calibration import load_bundle
from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir
from ddbench.core.schemas import AccuracyRow, KernelRow, read_csv
from ddbench.core.traces import load_engine
from tests.cli import assert_one_line_error, ddbench


def test_committed_traces_validate():
    k = read_csv(str(traces_dir("kernels", "h200", "kernels.csv")), KernelRow)
    assert len(k) > 50 and all(r.latency_ms > 0 for r in k)
    e = load_engine(str(traces_dir("engine", "h200", "engine.csv")))
    assert (e[e.status == "ok"].step_ms > 0).all() and set(e.design) <= {"dualdecoder", "dualdecoder-fifo",
                                                                          "shadowkv", "full-kv", "specache",
                                                                          "dualdecoder-per-layer",
                                                                          "dualdecoder-cpu-gather",
                                                                          "dualdecoder-two-pass"}
    b = load_bundle(str(traces_dir("calibration", "h200")))
    assert all(isinstance(r["transfer_bytes"], int) and r["gbps"] > 0 for r in b.rows["link"])


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


ENGINE_HEAD = ("design,context,batch,miss_rate,transfers,urgent_programs,status,step_ms,prefetch_mib,urgent_mib,"
               "link_mib,link_gbps,exposed_ms,gpu,git_sha,date_utc\n")
ENGINE_OK = "dualdecoder,131072,4,0.33,1,64,ok,128.3,1024,336,1360,11.1,1.3,H200,abc,2026\n"


@pytest.mark.parametrize("row, line, message", [
    (ENGINE_OK.replace("dualdecoder,", "vllm,", 1), 3, "field design: unknown design 'vllm'"),
    (ENGINE_OK.replace(",0.33,", ",1.5,"), 3, "field miss_rate: 1.5 is outside [0, 1]"),
    (ENGINE_OK.replace(",0.33,", ",lots,"), 3, "field miss_rate: 'lots' is neither a number nor 'none'"),
    (ENGINE_OK.replace(",4,", ",four,", 1), 3, "field batch: is not an integer, got 'four'"),
    (ENGINE_OK.replace(",128.3,", ",,"), 3, "step_ms is not a number in an 'ok' row"),
    (ENGINE_OK.replace(",128.3,", ",-1,"), 3, "step_ms must be positive"),
])
def test_engine_rows(tmp_path, row, line, message):
    path = _write(tmp_path, "engine.csv", "# a comment line\n" + ENGINE_HEAD + ENGINE_OK + row)
    with pytest.raises(DDBenchError) as exc:
        load_engine(path)
    text = str(exc.value)
    assert f"{path} line {line + 1}" in text and message in text and "\n" not in text


def test_engine_rows_not_ok_may_leave_measurements_empty(tmp_path):
    oom = "shadowkv,131072,64,none,1,64,oom,,,,,,,H200,abc,2026\n"
    df = load_engine(_write(tmp_path, "engine.csv", ENGINE_HEAD + ENGINE_OK + oom))
    assert list(df.status) == ["ok", "oom"] and df.step_ms.isna().tolist() == [False, True]
    assert df.batch.tolist() == [4, 64] and df.context.dtype.kind == "i"


def test_engine_git_sha_stays_text(tmp_path):
    """A sha of digits and one 'e' (0996e93, the 2026-11-30 sweep) is text, not 9.96e+95."""
    from ddbench.core.traces import provenance
    df = load_engine(_write(tmp_path, "engine.csv", ENGINE_HEAD + ENGINE_OK.replace(",abc,", ",0996e93,")))
    assert df.git_sha.tolist() == ["0996e93"] and "git 0996e93" in provenance(df)


KERNEL = ("schema,kernel,variant,batch,bytes,latency_ms,gpu,git_sha,date_utc\n"
          "1,gather,uva,8,4096,0.5,H200,abc,2026\n")


@pytest.mark.parametrize("row, message", [
    ("1,gather,uva,8,4096,-0.5,H200,abc,2026\n", "line 3, field latency_ms: must be positive, got '-0.5'"),
    ("1,gather,uva,8,4096,nan,H200,abc,2026\n", "line 3, field latency_ms: must be finite"),
    ("1,gather,uva,8,4096.5,0.5,H200,abc,2026\n", "line 3, field bytes: is not an integer"),
    ("1,,uva,8,4096,0.5,H200,abc,2026\n", "line 3, field kernel: is empty"),
    ("1,gather,uva,8,4096,0.5,H200\n", "line 3: 7 fields, the header has 9"),
])
def test_kernel_rows(tmp_path, row, message):
    path = _write(tmp_path, "kernels.csv", KERNEL + row)
    with pytest.raises(DDBenchError, match=message):
        read_csv(path, KernelRow, what="kernel benchmarks")


@pytest.mark.parametrize("text, message", [
    ("layer,hit_rate\n0,0.9\n1,1.2\n", "line 3, field hit_rate: must be <= 1"),
    ("layer,hit_rate,reuse_hit_rate\n0,0.9,\n-1,0.5,0.5\n", "line 3, field layer: must be >= 0"),
    ("layer,hit\n0,0.9\n", "line 1: missing column(s) hit_rate"),
    ("layer,hit_rate\n", "no rows"),
])
def test_accuracy_rows(tmp_path, text, message):
    path = _write(tmp_path, "acc.csv", text)
    with pytest.raises(DDBenchError) as exc:
        read_csv(path, AccuracyRow, what="accuracy profile")
    assert message in str(exc.value) and f"accuracy profile {path}" in str(exc.value)


def test_accuracy_row_optional_columns():
    r = AccuracyRow.model_validate({"layer": "3", "hit_rate": "0.75", "reuse_hit_rate": "", "task": "niah"})
    assert (r.layer, r.hit_rate, r.reuse_hit_rate, r.model_extra["task"]) == (3, 0.75, None, "niah")


def test_bad_calibration_row_through_the_cli(tmp_path):
    """A corrupted bundle row stops `ddbench simulate` with one line naming the file, line and field."""
    root = tmp_path / "cal"
    shutil.copytree(traces_dir("calibration", "h200"), root / "h200")
    link = root / "h200" / "link.csv"
    lines = link.read_text().splitlines(keepends=True)
    cells = lines[4].rstrip("\n").split(",")
    cells[-1] = "fast"
    lines[4] = ",".join(cells) + "\n"
    link.write_text("".join(lines))
    p = ddbench("simulate", "--model", "llama-3-8b", "--gpu", "h200", "--batch", "2", "--steps", "2",
                "--calibration", str(root), "--out", str(tmp_path / "o"))
    assert_one_line_error(p, contains=f"{link} line 5, field gbps: is not a number, got 'fast'")
    assert not (tmp_path / "o").exists()


def test_accuracy_rows_loader(tmp_path):
    from ddbench.core.traces import accuracy_rows
    path = _write(tmp_path, "m.csv", "# profile\nlayer,hit_rate,reuse_hit_rate,task\n0,0.9,0.8,niah\n1,0.7,,qa\n")
    rows = accuracy_rows(path)
    assert [(r.layer, r.hit_rate, r.reuse_hit_rate, r.model_extra["task"]) for r in rows] == \
        [(0, 0.9, 0.8, "niah"), (1, 0.7, None, "qa")]
    with pytest.raises(DDBenchError, match=r"line 4, field reuse_hit_rate: must be <= 1"):
        accuracy_rows(_write(tmp_path, "bad.csv", "# profile\nlayer,hit_rate,reuse_hit_rate\n0,0.9,0.8\n1,0.7,2\n"))

"""`ddbench figures --out`, through a subprocess: a temporary folder renamed into place, the
marker, one-line errors, modes from the umask, and Ctrl-C leaving nothing half-written."""

import os
import signal
import stat
import subprocess
import time

import pytest

from ddbench.core.outputs import MANIFEST as MARKER
from tests.cli import command, ddbench, default_signals, env

FAST = "fig05"     # a memory-model figure: about a second


def ddb(*args, cwd, umask=None):
    return ddbench("figures", *args, cwd=cwd, umask=umask)


def one_line_error(p, pattern):
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddbench: error:"), p.stderr
    assert pattern in lines[0], lines[0]


def test_writes_a_marked_folder_with_umask_modes(tmp_path):
    out = tmp_path / "a"
    p = ddb("--only", FAST, "--out", str(out), cwd=tmp_path, umask=0o027)
    assert p.returncode == 0, p.stderr
    assert sorted(os.listdir(out)) == sorted([MARKER, f"{FAST}.csv", f"{FAST}.png", f"{FAST}.pdf"])
    for f in os.listdir(out):
        assert stat.S_IMODE(os.stat(out / f).st_mode) == 0o640, f
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o750
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".")]          # no temporary folder left
    p = ddb("--only", FAST, "--out", str(out), cwd=tmp_path, umask=0o022)      # a figures folder: rewritten
    assert p.returncode == 0, p.stderr
    assert stat.S_IMODE(os.stat(out / f"{FAST}.png").st_mode) == 0o644


def test_only_keeps_the_other_figures(tmp_path):
    out = tmp_path / "f"
    assert ddb("--only", FAST, "--out", str(out), cwd=tmp_path).returncode == 0
    p = ddb("--only", "fig15", "--out", str(out), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert {f"{FAST}.png", "fig15.png", "fig15.csv"} <= set(os.listdir(out))


def test_refuses_a_foreign_folder_unless_forced(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    one_line_error(ddb("--only", FAST, "--out", str(out), cwd=tmp_path), "holds files ddbench did not write")
    assert os.listdir(out) == ["notes.txt"]
    p = ddb("--only", FAST, "--out", str(out), "--force", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert (out / "notes.txt").read_text() == "keep me" and (out / MARKER).exists() and (out / f"{FAST}.png").exists()


@pytest.mark.parametrize("where, pattern", [
    ("", "--out is empty"),
    ("/proc/x", "cannot write --out /proc/x"),
    ("FILE/sub", "FILE is not a folder"),
    ("FILE", "exists and is not a folder"),
])
def test_bad_out_is_one_line(tmp_path, where, pattern):
    (tmp_path / "FILE").write_text("x")
    where = where.replace("FILE", str(tmp_path / "FILE"))
    one_line_error(ddb("--only", FAST, "--out", where, cwd=tmp_path), pattern)


def test_unwritable_parent_is_one_line(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    one_line_error(ddb("--only", FAST, "--out", str(ro / "x"), cwd=tmp_path), "cannot write")


def test_ctrl_c_leaves_the_previous_folder_whole(tmp_path):
    out = tmp_path / "figs"
    assert ddb("--only", FAST, "--out", str(out), cwd=tmp_path).returncode == 0
    before = {f: (out / f).read_bytes() for f in os.listdir(out)}
    log = tmp_path.parent / f"{tmp_path.name}-stderr.txt"
    with open(log, "w") as fh:
        proc = subprocess.Popen(command("figures", "--only", f"fig13,fig18,{FAST}", "--out", out), cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=fh, text=True, env=env(),
                                preexec_fn=default_signals)  # not an inherited SIG_IGN
        deadline = time.time() + 120
        while "fig13:" not in log.read_text() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.02)          # fig13 (first) is done, fig18 (seconds) is being computed: interrupt it
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    err = log.read_text()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert {f: (out / f).read_bytes() for f in os.listdir(out)} == before    # untouched, no fig13.csv alone
    assert sorted(os.listdir(tmp_path)) == ["figs"]                          # no temporary folder left

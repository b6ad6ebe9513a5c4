"""Bad input of profile, figures, bench and calibrate: one line, exit 2, nothing written; bars only on a
terminal. No model or GPU is needed: every case is refused before either is touched."""

import os

import pytest

from tests.cli import assert_one_line_error, ddbench

PROFILE = ("profile", "--layer-accuracy", "--model", "no-such-model.gguf")


@pytest.mark.parametrize("flag,value", [
    ("--temperature", "nan"), ("--temperature", "0,inf"), ("--temperature", "-1"), ("--temperature", ""),
    ("--temperature", ",,"), ("--context", ""), ("--context", "4k,,8k"), ("--context", "0"),
    ("--budget", ""), ("--tasks", ""), ("--steps", "0"), ("--steps", "x"), ("--samples", "0"), ("--questions", "0"),
    ("--questions", "x"),
    ("--top-p", "0"), ("--top-p", "nan"), ("--top-p", "1.5"), ("--lowrank-threshold", "nan"),
    ("--rank", "0"), ("--chunk", "0"), ("--seed", "-1"), ("--threads", "-2"), ("--out", ""), ("--model", ""),
])
def test_profile_flags(tmp_path, flag, value):
    assert_one_line_error(ddbench(*PROFILE, flag, value, cwd=tmp_path))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("out", [".", ".."])
def test_profile_refuses_the_current_folder_before_the_model_loads(tmp_path, out):
    r = ddbench(*PROFILE, "--out", out, cwd=tmp_path)
    assert_one_line_error(r, contains="current folder")


@pytest.mark.parametrize("args", [
    ("bench", "kernels", "--out", ""), ("bench", "engine", "--out", "."),
    ("calibrate", "--budget-s", "nan"), ("calibrate", "--budget-s", "0"), ("calibrate", "--out", ""),
    ("calibrate", "--sections", ""), ("calibrate", "--gpu", " "),
])
def test_gpu_commands_check_their_flags_first(tmp_path, args):
    assert_one_line_error(ddbench(*args, cwd=tmp_path))
    assert os.listdir(tmp_path) == []


def test_figures_in_a_pipe_print_no_progress_bar(tmp_path):
    r = ddbench("figures", "--only", "fig02", "--out", str(tmp_path / "f"))
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr and "|" not in r.stderr
    assert r.stderr.splitlines() == [r.stderr.splitlines()[0], f"wrote 1 figure(s) into {tmp_path / 'f'}"]


def test_quiet_silences_transformers_bars():
    transformers = pytest.importorskip("transformers")
    from ddbench.progress import quiet_third_party
    before = transformers.utils.logging.is_progress_bar_enabled()
    try:
        quiet_third_party(True)
        assert not transformers.utils.logging.is_progress_bar_enabled()
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    finally:
        if before:
            transformers.utils.logging.enable_progress_bar()
        os.environ.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
        os.environ.pop("TQDM_DISABLE", None)


def test_a_closed_pipe_is_no_traceback():
    import subprocess
    import sys

    from tests.cli import ROOT, env
    p = subprocess.Popen([sys.executable, "-m", "ddbench", "plan", "--model", "llama-3-8b", "--gpu", "h100-80gb",
                          "--context", "128k", "--design", "every"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         cwd=ROOT, env=env())
    p.stdout.close()                    # as `| head` does once it has its lines
    err = p.stderr.read().decode()
    p.wait(timeout=120)
    assert "Traceback" not in err and err == ""

"""No line of any command's default output (not --verbose, not --json) is over 120 characters (issue 46): every
command's --help, at a terminal wide enough that argparse alone would go past it, and each command's default
text on small, fast inputs. Lines too long are wrapped between words (ddbench.commands.wrap), so no number is
dropped; tests/test_sim_cli.py and tests/test_tp.py pin what the lines say."""

import pytest

from ddbench.cli import COMMANDS
from tests.cli import in_process

WIDTH = 120
SIM = ["simulate", "--model", "llama-3-8b", "--gpu", "h100-80gb"]
SPEC = """name: tiny
requests: 10
grid:
  model: llama-3-8b
  gpu: h200
  system: [shadowkv, dualdecoder]
  context: 32k
  output: "64"
  rate: 0.5
"""

CASES = {
    **{f"{c} --help": [c, "--help"] for c in COMMANDS},
    "--help": ["--help"],
    "plan": ["plan", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--context", "128k", "--design", "all"],
    # serving: every design, each one's throughput, latencies, accuracy and the queue warning
    "simulate serving": SIM + ["--design", "all", "--context", "128k", "--requests", "5", "--rate", "0.1"],
    "simulate host, prefill elsewhere": SIM + ["--design", "dualdecoder", "--context", "128k", "--rate", "0.3",
                                               "--requests", "5", "--host", "paper-testbed", "--prefill",
                                               "elsewhere"],
    "simulate timeline": SIM + ["--design", "all", "--context", "128k", "--batch", "8", "--steps", "3"],
    "simulate batch sweep": SIM + ["--design", "dualdecoder,shadowkv", "--context", "64k", "--batch", "1:16",
                                   "--steps", "3"],
    "sweep": ["sweep", "SPEC", "--workers", "1", "--quiet"],
    "figures": ["figures", "--only", "fig05"],
}


@pytest.mark.parametrize("name", list(CASES))
def test_no_default_line_over_120(name, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")          # argparse would wrap --help at 398 characters
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.yaml").write_text(SPEC)
    argv = ["spec.yaml" if a == "SPEC" else a for a in CASES[name]]
    if argv[0] in ("simulate", "sweep", "figures"):
        argv += ["--out", str(tmp_path / "out")]
    rc, out, err = in_process(argv, capsys)
    assert rc == 0, err
    lines = out.splitlines() + err.splitlines()
    assert len(lines) >= 2
    wide = [x for x in lines if len(x) > WIDTH]
    assert not wide, f"{len(wide)} lines over {WIDTH}: {wide[0]!r}"


def test_validate_user_path_within_120(capsys):
    """`python -m ddbench.sim.validate --user-path`, the check a user runs on the simulator's own path."""
    from ddbench.sim.validate import main as validate
    assert validate(["--user-path"]) in (0, None)
    out = capsys.readouterr().out.splitlines()
    assert out and max(len(x) for x in out) <= WIDTH


def test_wrap_keeps_every_word():
    from ddbench.commands import wrap
    line = "accuracy " + ", ".join(f"{i}.{i:02d} [0.{i}, 0.{i + 1}]" for i in range(40))
    out = wrap(["  " + line, "short"])
    assert len(out) > 2 and max(map(len, out)) <= WIDTH and out[-1] == "short"
    assert " ".join(x.strip() for x in out[:-1]) == line

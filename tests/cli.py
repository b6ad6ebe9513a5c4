"""The one helper for running ddbench (or a `python -m` module of the repo) as a subprocess in tests.

    from tests.cli import ddbench, module, ROOT
    r = ddbench("plan", "--model", "llama-3-8b", cwd=tmp_path)      # CompletedProcess, text
    assert_one_line_error(r)                                          # exit 2, one stderr line

The child sees the repository on PYTHONPATH, so it runs from any folder; `env=` adds or removes
variables (a value of None removes one); `umask=` gives the child a umask of its own. A test that needs
the process running (an interrupt test) uses `subprocess.Popen(command(...), env=env(),
preexec_fn=default_signals, cwd=ROOT)`. In this process: `rc, out, err = in_process(argv, capsys)`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def env(extra: dict | None = None) -> dict:
    """The child's environment: this one, with the repository on PYTHONPATH and `extra` applied."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


_env = env


def command(*args, name: str = "ddbench") -> list[str]:
    """The argv of `python -m NAME ARGS...` (for subprocess.Popen)."""
    return [sys.executable, "-m", name, *map(str, args)]


def default_signals() -> None:
    """A Popen preexec_fn: a shell that starts the test run in the background without job control (a CI
    runner may) passes SIGINT ignored to its children, and Python then installs no KeyboardInterrupt
    handler; `nohup` passes SIGHUP ignored, and ddbench rightly keeps an ignored SIGHUP so. Restore both
    defaults, so an interrupt test's signal reaches the child as Ctrl-C or a closed terminal would."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def in_process(argv: list, capsys) -> tuple:
    """(exit status, stdout, stderr) of ddbench's CLI run in this process (argparse's usage errors too)."""
    from ddbench.cli import main
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def after_rates_block(out: str) -> list[str]:
    """The output's lines after the rates block ('rates (95 % interval) ...' and its indented lines), which
    comes first."""
    lines = out.splitlines()
    if lines and lines[0].startswith("rates ("):
        i = 1
        while i < len(lines) and lines[i].startswith("  "):
            i += 1
        lines = lines[i:]
    return lines


def module(name: str, *args, cwd=ROOT, env: dict | None = None, timeout: float = 300, stdin=None,
           umask: int | None = None):
    """`python -m NAME ARGS...` as a subprocess; returns the CompletedProcess (text mode)."""
    pre = None if umask is None else (lambda: os.umask(umask))
    return subprocess.run(command(*args, name=name), capture_output=True, text=True, cwd=str(cwd),
                          env=_env(env), timeout=timeout, input=stdin, preexec_fn=pre)


def ddbench(*args, cwd=ROOT, env: dict | None = None, timeout: float = 300, stdin=None, umask: int | None = None):
    """`python -m ddbench ARGS...` as a subprocess."""
    return module("ddbench", *args, cwd=cwd, env=env, timeout=timeout, stdin=stdin, umask=umask)


def assert_one_line_error(r, code: int = 2, contains: str | None = None) -> str:
    """The run failed with `code` and printed exactly one line on stderr, with no traceback."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    if contains is not None:
        assert contains in lines[0], lines[0]
    return lines[0]

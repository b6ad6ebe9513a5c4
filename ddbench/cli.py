"""The `ddbench` command line. Each subcommand lives in ddbench/commands/<name>.py (<name>_cmd.py where the
name would share its basename with the code it runs: bench, calibrate, sweep) and exposes
`register(subparsers)`; GPU commands import `kernels` lazily.

Errors a user can cause print one line and exit 2, with no traceback.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import importlib.util
import io
import os
import signal
import sys

from ddbench.core.errors import DDBenchError
from ddbench.core.flags import OneLineParser, one_line

# Subcommand modules under ddbench/commands, in --help order.
COMMANDS = ("plan", "sweep", "figures", "calibrate", "bench", "simulate", "profile")
# a command whose module is not ddbench/commands/<command>.py (no basename shared with kernels/ or sim/)
MODULES = {"sweep": "sweep_cmd", "calibrate": "calibrate_cmd", "bench": "bench_cmd"}


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush of a failed stdout is silent."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def version_line() -> str:
    """'ddbench 0.1.0 (git SHA)': the version and git sha that every provenance.json records."""
    from ddbench import __version__
    from ddbench.core.provenance import git_sha, version
    v = version()
    return f"ddbench {__version__ if v == 'unknown' else v} (git {git_sha()})"


class VersionAction(argparse.Action):
    """--version: print version_line() and exit 0 (the git sha is looked up only when asked)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="ddbench",
        description="DualDecoder replay: sparse-KV kernels, simulator and capacity planning.",
        epilog="example: ddbench plan --model llama-3-8b --gpu h100-80gb --context 128k --design all",
    )
    parser.add_argument("--version", action=VersionAction, help="print the ddbench version and git sha, and exit")
    parser.add_argument("--data", metavar="DIR",
                        help="data root holding the traces (default: the installed package's; env DDBENCH_DATA)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(f"ddbench.commands.{MODULES.get(name, name)}").register(sub)
    return parser


TORCH = "pip install torch==2.13.0 triton==3.9.0 (the Makefile's pins; a CUDA build of your own serves too)"
# a command's optional dependencies, checked before it starts: module -> how to install it
EXTRAS = {
    "sweep": {"yaml": "pip install -e '.[plan]'", "pyarrow": "pip install -e '.[plan]'"},
    "profile": {"torch": TORCH, "triton": TORCH, "transformers": "pip install -e '.[profile]'"},
}


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


def check_extras(command: str) -> None:
    """A one-line DDBenchError, before anything runs, naming the modules `command` needs that are not
    installed and how to install them."""
    need = {m: how for m, how in EXTRAS.get(command, {}).items() if _missing(m)}
    if need:
        how = "; ".join(dict.fromkeys(need.values()))
        raise DDBenchError(f"{command} needs {', '.join(need)}, not installed here: {how}")


def _terminate(signum, frame):
    """SIGTERM and SIGHUP (the terminal closed) unwind like Ctrl-C, so run folders and atomic files are
    cleaned up. A second one while that cleanup runs is ignored (a third party may send several)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt


def _ignore_further_signals():
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        try:
            signal.signal(sig, signal.SIG_IGN)
        except ValueError:             # not the main thread
            pass


def _parse(argv):
    """The parsed arguments. --help and --version print and exit here: argparse ignores a failed write, so
    their text is caught and written here, where `--help > /dev/full` fails and is reported."""
    real, sys.stdout = sys.stdout, io.StringIO()
    try:
        return build_parser().parse_args(argv)
    except SystemExit as exc:
        if exc.code in (0, None):
            real.write(sys.stdout.getvalue())
            real.flush()
        raise
    finally:
        sys.stdout = real


def run() -> None:
    """The console script's and `python -m ddbench`'s entry: main(), then exit with its code. An interrupted run
    (130, main() has cleaned up) leaves through os._exit, so that nothing run while the interpreter shuts down (a
    finaliser of a held-signal block) can turn the exit into a death by SIGINT."""
    code = main()
    if code == 130:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os._exit(130)
    raise SystemExit(code)


def main(argv: list[str] | None = None) -> int:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            if signal.getsignal(sig) is signal.SIG_DFL:
                signal.signal(sig, _terminate)
        except ValueError:  # not the main thread
            pass
    if sys.stdout is None or sys.stderr is None:    # started with `>&-` or `2>&-`: nowhere to answer
        if sys.stderr is not None:
            print("ddbench: error: stdout is closed: give it a file or a pipe (or > /dev/null)", file=sys.stderr)
        return 2
    from ddbench.core.catalog.files import forget
    from ddbench.core.outputs import start_run
    forget()                           # a run's own hardware files: names unique within it
    start_run()
    try:
        return _answer(argv)
    except BaseException:              # an unforeseen error: the run's new outputs go with it
        from ddbench.core.outputs import undo_run
        undo_run()
        raise


def _answer(argv) -> int:
    """main's body. An error after the command's outputs moved in (a full stdout, a later output refused,
    Ctrl-C, SIGTERM, SIGHUP) undoes the files it created (ddbench.core.outputs.undo_run); a reader that went
    away (`| head`) does not."""
    from ddbench.core.outputs import undo_run
    try:
        args = _parse(argv)
        if args.data is not None:
            os.environ["DDBENCH_DATA"] = args.data
        if os.environ.get("DDBENCH_DATA") is not None and not os.environ["DDBENCH_DATA"].strip():
            raise DDBenchError("the data root (--data or DDBENCH_DATA) is empty: name a folder")
        check_extras(args.command)
        rc = int(args.func(args) or 0)
        sys.stdout.flush()             # a full stdout fails here, not in the interpreter's last flush
        return rc
    except DDBenchError as exc:
        undo_run()
        print(f"ddbench: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        _ignore_further_signals()      # exiting: a late or repeated signal must not cut the clean-up or the exit short
        undo_run()
        print("ddbench: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:            # the reader went away (`ddbench plan ... | head`): stop quietly
        _quiet_stdout()
        return 1
    except MemoryError:
        undo_run()
        print("ddbench: error: out of memory: ask for a smaller run (fewer --requests, a shorter --context, a"
              " smaller grid)", file=sys.stderr)
        return 2
    except OSError as exc:             # stdout on a full disk (/dev/full), or another file the system refuses
        if exc.errno not in (errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EFBIG, errno.EROFS):
            raise
        undo_run()
        _quiet_stdout()
        where = f" {exc.filename}" if exc.filename else " the output"
        print(f"ddbench: error: cannot write{one_line(where)}: {exc.strerror}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())

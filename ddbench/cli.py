"""The `ddbench` command line. Each subcommand lives in ddbench/commands/<name>.py
and exposes `register(subparsers)`; GPU commands import `kernels` lazily.

Errors a user can cause print one line and exit 2, with no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

from ddbench.core.errors import DDBenchError

# Subcommand modules under ddbench/commands, in --help order.
COMMANDS = ("plan", "sweep", "figures", "calibrate", "bench", "simulate", "profile")


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line and exits 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message}\n")


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
        importlib.import_module(f"ddbench.commands.{name}").register(sub)
    return parser


def _terminate(signum, frame):
    """SIGTERM unwinds like Ctrl-C, so run folders and atomic files are cleaned up."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread
        pass
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.data is not None:
        os.environ["DDBENCH_DATA"] = args.data
    if os.environ.get("DDBENCH_DATA") is not None and not os.environ["DDBENCH_DATA"].strip():
        print("ddbench: error: the data root (--data or DDBENCH_DATA) is empty: name a folder", file=sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except DDBenchError as exc:
        print(f"ddbench: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ddbench: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:            # the reader went away (`ddbench plan ... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Where an output came from: the command and its arguments, the ddbench version and the git sha.

    write_json(os.path.join(out, "provenance.json"), provenance("simulate", args, cost_model=notes))

The arguments are the parsed namespace (values JSON can hold; tuples as lists). The git sha is
DDBENCH_GIT_SHA where set (a copied tree whose .git lags, as on the device machine), else the
checkout's HEAD with "+dirty" when tracked files differ from it, or "unknown" for an installed copy or
where git is missing.
"""

from __future__ import annotations

import datetime
import os
import shlex
import subprocess
import sys
from functools import lru_cache

from ddbench.core.paths import repo_root


@lru_cache(maxsize=1)
def version() -> str:
    from importlib.metadata import PackageNotFoundError, version as dist_version
    try:
        return dist_version("ddbench")
    except PackageNotFoundError:
        return "unknown"


def command_output(args: list[str], timeout: float = 20) -> str:
    """A command's stdout, stripped; "" where it is missing, fails to start or times out."""
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


@lru_cache(maxsize=1)
def git_sha() -> str:
    """The one git sha every output records (see the module's docstring)."""
    if os.environ.get("DDBENCH_GIT_SHA"):
        return os.environ["DDBENCH_GIT_SHA"]
    root = repo_root()
    if root is None:
        return "unknown"
    sha = command_output(["git", "-C", str(root), "rev-parse", "HEAD"], timeout=10)
    if not sha:
        return "unknown"
    dirty = command_output(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"], timeout=10)
    return sha + ("+dirty" if dirty else "")


def _plain(v):
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return v if v is None or isinstance(v, (str, int, float, bool)) else str(v)


def provenance(command: str, args=None, **extra) -> dict:
    """{command, arguments, ddbench_version, git_sha, date (UTC), **extra}."""
    arguments = {k: _plain(v) for k, v in sorted(vars(args).items()) if not callable(v)} if args is not None else {}
    return {"command": f"ddbench {command}", "arguments": arguments, "ddbench_version": version(),
            "git_sha": git_sha(), "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            **{k: _plain(v) for k, v in extra.items()}}


def local_part(arg: str) -> str:
    """An argument as a trace may record it: a local path cut to its last part (no machine's paths)."""
    if arg.startswith("--") and "=" in arg:
        flag, _, value = arg.partition("=")
        return f"{flag}={local_part(value)}"
    if os.path.isabs(arg) or arg.startswith("~"):
        return os.path.basename(arg.rstrip(os.sep)) or arg
    return arg


def command_line(prefix: str = "ddbench", argv=None) -> str:
    """The command as typed (sys.argv[1:] by default), local paths cut to their last part."""
    argv = sys.argv[1:] if argv is None else argv
    return " ".join([prefix] + [shlex.quote(local_part(a)) for a in argv])

"""Where an output came from: the command and its arguments, the ddbench version and the git sha.
The one owner of these values; the GPU side (kernels/) imports them from here.

    write_json(os.path.join(out, "provenance.json"), provenance("simulate", args, cost_model=notes))
    gpu_provenance(command, torch, triton)    # the GPU benchmarks' and the engine sweep's (kernels/)
    git_sha()          # "<sha>", "<sha>+dirty" or "unknown"; short_sha(): its first 12 digits
    git_head(), git_dirty()                   # the same, as two values (a calibration bundle's git_sha, git_dirty)
    utc_now()          # "2026-12-03T05:38:30Z"; utc_now(offset=True): "2026-12-03T05:38:30+00:00"

The arguments are the parsed namespace (values JSON can hold; tuples as lists). The git sha is
DDBENCH_GIT_SHA where set (a copied tree whose .git lags, as on the device machine), else the
checkout's HEAD with "+dirty" when tracked files differ from it (untracked files do not count; on a
copied tree DDBENCH_GIT_DIRTY=yes|no says it), or "unknown" for an installed copy or where git is missing.
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


DIRTY = "+dirty"


def _git(*args: str) -> str:
    root = repo_root()
    return "" if root is None else command_output(["git", "-C", str(root), *args], timeout=10)


def git_head() -> str:
    """The commit: DDBENCH_GIT_SHA (less any +dirty) where set, else the checkout's HEAD, else "unknown"."""
    env = os.environ.get("DDBENCH_GIT_SHA")
    if env:
        return env[:-len(DIRTY)] if env.endswith(DIRTY) else env
    return _git("rev-parse", "HEAD") or "unknown"


def git_dirty() -> bool | None:
    """Whether tracked files differ from the commit: DDBENCH_GIT_DIRTY (yes/no) where set, else whether
    DDBENCH_GIT_SHA ends in +dirty where that is set, else git status; None where there is no checkout."""
    flag = os.environ.get("DDBENCH_GIT_DIRTY")
    if flag in ("yes", "no"):
        return flag == "yes"
    if os.environ.get("DDBENCH_GIT_SHA"):
        return os.environ["DDBENCH_GIT_SHA"].endswith(DIRTY)
    if git_head() == "unknown":
        return None
    return bool(_git("status", "--porcelain", "--untracked-files=no"))


@lru_cache(maxsize=1)
def git_sha() -> str:
    """The one git sha every output records (see the module's docstring)."""
    if os.environ.get("DDBENCH_GIT_SHA"):
        return os.environ["DDBENCH_GIT_SHA"]
    head = git_head()
    return head if head == "unknown" else head + (DIRTY if git_dirty() else "")


def short_sha() -> str:
    """git_sha() cut to its first 12 digits (a profile's provenance); "unknown" stays."""
    sha = git_sha()
    return sha if sha == "unknown" else sha[:12]


def utc_now(offset: bool = False) -> str:
    """The time now, UTC, to the second: 2026-12-03T05:38:30Z (offset: 2026-12-03T05:38:30+00:00)."""
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    return now.isoformat() if offset else now.strftime("%Y-%m-%dT%H:%M:%SZ")


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
            "git_sha": git_sha(), "date": utc_now(),
            **{k: _plain(v) for k, v in extra.items()}}


def gpu_provenance(command: str, torch, triton) -> dict:
    """The GPU side's provenance (kernel, link and host benchmarks, the engine sweep and breakdown): gpu,
    driver, cuda, torch, triton, git_sha, date_utc, command. `torch` and `triton` are the caller's modules
    (the core imports neither)."""
    driver = command_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]).splitlines()
    return {
        "gpu": torch.cuda.get_device_name(0),
        "driver": driver[0] if driver else "unknown",
        "cuda": torch.version.cuda or "",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "git_sha": git_sha(),
        "date_utc": utc_now(),
        "command": command,
    }


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

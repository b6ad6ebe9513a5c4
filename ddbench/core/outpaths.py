"""Which folders a command may write into: the output guard's path rule (ddbench/core/outputs.py).

`check_path` refuses the current folder (and every folder above it), the home folder, a filesystem root,
the data root, every folder above it and every folder under it except the one a command is meant to
write there (`DATA_OUTPUTS`), a dangling link on the way, and a path that is not a folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from ddbench.core.errors import DDBenchError

# the folders under the data root that a command is meant to write ("*": one folder of any name);
# every other folder under the data root is refused as an output
DATA_OUTPUTS = {
    "ddbench calibrate": ("calibration/*",),
    "ddbench profile": ("accuracy",),
    "python -m ddbench.profile.indexrecall": ("accuracy",),
    "ddbench bench kernels": ("kernels/*",),
    "python -m ddbench.kernels.linkbench": ("link/*",),
    "python -m ddbench.kernels.hostbench": ("host/*",),
    "python -m ddbench.kernels.engine.sweep": ("engine/*",),
    "python -m ddbench.sim.validate": ("validation",),
    "python -m ddbench.sim.fit": ("fit/*",),
}




def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _matches(rel: Path, patterns) -> bool:
    """`rel` (a path under the data root) is one of `patterns` ("a/*": any one folder inside a)."""
    parts = rel.parts
    for pat in patterns:
        want = Path(pat).parts
        if len(want) == len(parts) and all(w == "*" or w == p for w, p in zip(want, parts)):
            return True
    return False


def check_path(out, flag: str = "--out", allow_cwd: bool = False, data_ok=()) -> Path:
    """The absolute output folder, or a one-line DDBenchError for one ddbench must not write into.
    `allow_cwd`: a single file may go into the current folder (nothing else there is touched).
    `data_ok`: the folders under the data root this output may be (patterns of DATA_OUTPUTS)."""
    if out is None or not str(out).strip():
        raise DDBenchError(f"{flag} is empty: name an output folder")
    try:
        return _checked_path(out, flag, allow_cwd, data_ok)
    except OSError as exc:      # a name too long for the file system, a folder that cannot be read, ...
        raise DDBenchError(f"{flag} {out}: {_why(exc)}") from None


def _checked_path(out, flag: str, allow_cwd: bool, data_ok) -> Path:
    path = Path(os.path.abspath(os.path.expanduser(str(out))))
    for p in (path, *path.parents):
        if p.is_symlink() and not p.exists():
            raise DDBenchError(f"{flag} {out}: {p} is a link to {os.readlink(p)}, which does not exist; name a folder")
    real = Path(os.path.realpath(path))
    if real == Path(real.anchor):
        raise DDBenchError(f"{flag} {out} is a filesystem root; name a folder of its own")
    cwd = Path(os.path.realpath(os.getcwd()))
    if (real == cwd and not allow_cwd) or real in cwd.parents:
        raise DDBenchError(f"{flag} {out} is the current folder or above it; name a folder of its own")
    home = os.path.expanduser("~")
    if home and home != "~" and real == Path(os.path.realpath(home)):
        raise DDBenchError(f"{flag} {out} is the home folder; name a folder of its own")
    from ddbench.core.paths import data_root
    try:
        data = Path(os.path.realpath(data_root()))
    except DDBenchError:
        data = None
    if data is not None and (real == data or real in data.parents):
        raise DDBenchError(f"{flag} {out} is the data root or above it ({data}); name a folder of its own")
    if data is not None and data in real.parents and not _matches(real.relative_to(data), data_ok):
        raise DDBenchError(f"{flag} {out} is inside the data root ({data}), whose folders hold the traces;"
                           " name a folder of its own")
    if path.exists() and not path.is_dir():
        raise DDBenchError(f"{flag} {out} exists and is not a folder")
    above = path
    while not above.exists():
        above = above.parent
    if not above.is_dir():
        raise DDBenchError(f"{flag} {out}: {above} is not a folder")
    return path

"""Your own GPU, link or host from a YAML or JSON file, checked by one strict schema.

    --gpu my-gpu.yaml          name: my-gpu            # the catalog fields of GPUSpec (gpus.py)
                               hbm_bytes: 85899345920
                               hbm_gbps: 3350
                               bf16_tflops: 989
                               default_link: pcie5      # a catalog link, or a link file
    --link my-link.json        {"name": "ib-ndr", "nominal_gbps": 50, "achievable_gbps": 45, "measured": false,
                                "bidir_total_gbps": 90}
    --host my-host.yaml        the fields of HostSpec (hosts.py); gpu and link: catalog names or files

A value that names a file (it ends in .yaml, .yml or .json) is read here; anything else is a catalog name.
The schema is the catalog's own dataclass (every field, its type, the defaults of the optional ones) made
strict and validated by pydantic (ddbench.core.schemas.strict_model): a number is a number (a quoted
"-50" or "inf" is refused, not converted), a switch is true or false, every number lies in the range of
RULES (integers bounded before any arithmetic), and the cross-field rules hold (achievable_gbps <=
nominal_gbps, gpus_per_switch <= gpus). Every catalog entry passes the same check (a test holds it).
Errors name the file and every bad field in one line.

Names are unique: a file's `name` must not be a catalog name, and two files of one kind with one name
and different contents in one run are an error (`forget()` starts a run). A loaded file is remembered by
its name for the rest of the run, so the cost model, which looks a GPU up by name, finds it. Relative
paths inside a file (a host's gpu and link, a GPU's default_link) resolve against that file's folder.
"""

from __future__ import annotations

import dataclasses
import os

from ddbench.core.errors import DDBenchError
from ddbench.core.io import read_mapping

SUFFIXES = (".yaml", ".yml", ".json")
BYTES = 1 << 50          # 1 PiB: above any GPU's memory, far below where arithmetic on it overflows
GBPS = 1e6               # GB/s or TFLOP/s: far above any device
# field -> (lowest, highest, lowest excluded): every number's range
RULES = {
    "GPU": {"hbm_bytes": (0, BYTES, True), "hbm_gbps": (0.0, GBPS, True), "bf16_tflops": (0.0, GBPS, True),
            "runtime_overhead_bytes": (0, BYTES, False), "measured_hbm_gbps": (0.0, GBPS, True)},
    "link": {"nominal_gbps": (0.0, GBPS, True), "achievable_gbps": (0.0, GBPS, True),
             "bidir_total_gbps": (0.0, GBPS, True)},
    "host": {"gpus": (1, 4096, False), "gpus_per_switch": (1, 4096, False), "host_mem_gbps": (0.0, GBPS, True),
             "sockets": (1, 64, False), "host_mem_gb": (0.0, 1e9, False)},
}
# (field, field it must not exceed)
CROSS = {"link": (("achievable_gbps", "nominal_gbps"),), "host": (("gpus_per_switch", "gpus"),)}
_BY_PATH: dict = {}    # (kind, absolute path, mtime) -> spec
_BY_NAME: dict = {}    # (kind, name) -> (spec, path)


def is_file_name(name: str) -> bool:
    return str(name).lower().endswith(SUFFIXES)


def forget() -> None:
    """Start a run: the files loaded so far (and their names) are forgotten."""
    _BY_PATH.clear()
    _BY_NAME.clear()


def loaded(kind: str, name: str):
    """A spec loaded from a file earlier in this run, by its name; else None."""
    got = _BY_NAME.get((kind, str(name).lower()))
    return None if got is None else got[0]


def _read(kind: str, full: str, path: str) -> dict:
    return read_mapping(full, f"{kind} file {path}", "the catalog's fields")


def check(kind: str, cls, raw: dict, where: str):
    """`raw` (a mapping) as a `cls` (the catalog's dataclass), every bad field named in one DDBenchError."""
    from ddbench.core.schemas import strict_model, validate_all
    model = strict_model(cls, RULES.get(kind, {}), CROSS.get(kind, ()), blank_ok=("source",))
    values = validate_all(model, raw, where)
    return cls(**values)


def refs_error(kind: str, path: str, exc: DDBenchError) -> DDBenchError:
    """An unknown name inside a file (a GPU's default_link, a host's gpu or link), naming the file."""
    return DDBenchError(f"{kind} file {path}: {exc}")


def load(kind: str, path: str, cls, table: dict, aliases: dict):
    """The spec in `path` (see the module's text); remembered by path and by name."""
    full = os.path.abspath(os.path.expanduser(path))
    try:
        key = (kind, full, os.path.getmtime(full))
    except OSError:
        raise DDBenchError(f"{kind} file {path}: no such file") from None
    if key in _BY_PATH:
        return _BY_PATH[key]
    raw = _read(kind, full, path)
    raw = _resolve_refs(kind, raw, os.path.dirname(full))
    spec = check(kind, cls, raw, f"{kind} file {path}")
    name = spec.name.lower()
    if name in table or name in aliases:
        raise DDBenchError(f"{kind} file {path}: name '{spec.name}' is a catalog {kind}'s; give yours another name")
    seen = _BY_NAME.get((kind, name))
    if seen is not None and seen[0] != spec:
        diff = [f.name for f in dataclasses.fields(cls) if getattr(seen[0], f.name) != getattr(spec, f.name)]
        raise DDBenchError(f"{kind} file {path}: name '{spec.name}' is also the name of {kind} file {seen[1]}, whose"
                           f" {', '.join(diff)} differ; give each {kind} its own name")
    _BY_PATH[key] = spec
    _BY_NAME[(kind, name)] = (spec, path)
    return spec


def _resolve_refs(kind: str, raw: dict, folder: str) -> dict:
    """A host file's gpu and link, a GPU file's default_link: a file named relative to this file's folder."""
    refs = {"host": ("gpu", "link"), "GPU": ("default_link",)}.get(kind, ())
    out = dict(raw)
    for k in refs:
        v = out.get(k)
        if isinstance(v, str) and is_file_name(v) and not os.path.isabs(os.path.expanduser(v)):
            out[k] = os.path.join(folder, v)
    return out

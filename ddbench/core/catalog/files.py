"""Your own GPU, link or host from a YAML or JSON file, checked by the schema of the catalog's entries.

    --gpu my-gpu.yaml          name: my-gpu            # the catalog fields of GPUSpec (gpus.py)
                               hbm_bytes: 85899345920
                               hbm_gbps: 3350
                               bf16_tflops: 989
                               default_link: pcie5      # a catalog link, or a link file
    --link my-link.json        {"name": "ib-ndr", "nominal_gbps": 50, "achievable_gbps": 45, "measured": false,
                                "bidir_total_gbps": 90}
    --host my-host.yaml        the fields of HostSpec (hosts.py); gpu and link: catalog names or files

A value that names a file (it ends in .yaml, .yml or .json) is read here; anything else is a catalog name.
The schema is the catalog's own dataclass (every field, its type, the defaults of the optional ones),
validated by pydantic, plus the ranges in RULES; every catalog entry passes the same check (a test holds
it). Errors name the file and every bad field in one line. A file's `name` must not be a catalog name; a
loaded file is remembered by its name for the rest of the process, so the cost model, which looks a GPU
up by name, finds it. Relative paths inside a host file resolve against that file's folder.
"""

from __future__ import annotations

import dataclasses
import math
import os

from ddbench.core.errors import DDBenchError
from ddbench.core.io import read_mapping

SUFFIXES = (".yaml", ".yml", ".json")
# field -> (lowest, highest, lowest excluded): numbers checked beyond their type
POSITIVE = (0.0, math.inf, True)
RULES = {
    "GPU": {"hbm_bytes": POSITIVE, "hbm_gbps": POSITIVE, "bf16_tflops": POSITIVE,
            "runtime_overhead_bytes": (0.0, math.inf, False), "measured_hbm_gbps": POSITIVE},
    "link": {"nominal_gbps": POSITIVE, "achievable_gbps": POSITIVE, "bidir_total_gbps": POSITIVE},
    "host": {"gpus": (1, 4096, False), "gpus_per_switch": (1, 4096, False), "host_mem_gbps": POSITIVE,
             "sockets": (1, 64, False), "host_mem_gb": (0.0, math.inf, False)},
}
_BY_PATH: dict = {}    # (kind, absolute path, mtime) -> spec
_BY_NAME: dict = {}    # (kind, name) -> spec


def is_file_name(name: str) -> bool:
    return str(name).lower().endswith(SUFFIXES)


def loaded(kind: str, name: str):
    """A spec loaded from a file earlier in this process, by its name; else None."""
    return _BY_NAME.get((kind, str(name).lower()))


def _read(kind: str, full: str, path: str) -> dict:
    return read_mapping(full, f"{kind} file {path}", "the catalog's fields")


def check(kind: str, cls, raw: dict, where: str):
    """`raw` (a mapping) as a `cls` (the catalog's dataclass), every bad field named in one DDBenchError."""
    from pydantic import TypeAdapter, ValidationError
    fields = {f.name: f for f in dataclasses.fields(cls)}
    bad = {}
    for k in raw:
        if k not in fields:
            bad[k] = f"unknown field (the {kind} fields: {', '.join(fields)})"
    known = {k: v for k, v in raw.items() if k in fields}
    spec = None
    try:
        spec = TypeAdapter(cls).validate_python(known)
    except ValidationError as exc:
        for e in exc.errors():
            loc = ".".join(map(str, e["loc"])) or kind
            bad.setdefault(loc, "missing" if e["type"] == "missing" else e["msg"])
    for k, v in known.items():
        if k in bad:
            continue
        if isinstance(v, str) and not v.strip() and not k.endswith("source"):
            bad[k] = "empty"
        elif isinstance(v, bool) and k in RULES.get(kind, {}):
            bad[k] = f"must be a number, got {v}"
        elif isinstance(v, float) and not math.isfinite(v):
            bad[k] = f"must be finite, got {v}"
        elif k in RULES.get(kind, {}) and isinstance(v, (int, float)):
            lo, hi, open_lo = RULES[kind][k]
            if v < lo or (open_lo and v == lo) or v > hi:
                bad[k] = (f"must be {'above' if open_lo else 'at least'} {lo:g}"
                          + (f" and at most {hi:g}" if math.isfinite(hi) else "") + f", got {v}")
    order = list(fields) + list(raw)
    bad = [f"{k}: {bad[k]}" for k in sorted(bad, key=lambda k: order.index(k) if k in order else len(order))]
    if bad:
        raise DDBenchError(f"{where}: " + "; ".join(dict.fromkeys(bad)))
    if kind == "link" and spec.achievable_gbps > spec.nominal_gbps:
        raise DDBenchError(f"{where}: achievable_gbps: must be at most nominal_gbps ({spec.nominal_gbps:g}),"
                           f" got {spec.achievable_gbps:g}")
    return spec


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
    _BY_PATH[key] = spec
    _BY_NAME[(kind, name)] = spec
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

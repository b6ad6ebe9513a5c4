"""`--config FILE` for `plan` and `simulate`: a YAML or JSON mapping whose keys are the command's flags.

    # plan.yaml                          ddbench plan --config plan.yaml --design shadowkv
    model: llama-3.1-8b
    gpu: my-h100.yaml                    # a catalog name or a file of your own (ddbench.core.catalog.files)
    host: hgx-h100
    context: 128k
    slo: p99-tpot=100ms
    design: [all, dualdecoder-cache]     # a list is a comma list
    prefill: elsewhere
    json: false                          # a switch: true or false

A key is a flag without its dashes (`max-runs` or `max_runs`); the flags given on the command line
override the file's. Every value is checked by the flag's own parser before the command runs; the
errors name the file and every bad key in one line (exit 2). A relative file name among the values of
model, gpu, link, host, hit_rate and calibration resolves against the config's folder, never the current
folder (`names_a_file`); so does `rates:` (ddbench.core.ratefile: one found only from the current folder is an
error).
"""

from __future__ import annotations

import argparse
import os

from ddbench.core.errors import DDBenchError
from ddbench.core.io import read_mapping

FILE_KEYS = ("model", "gpu", "link", "host", "hit_rate", "calibration")   # values that may name a file beside it


def names_a_file(key: str, value) -> bool:
    """`value` of the field `key` names a file or folder by a relative path (resolved against the folder of
    the file that names it, never the current folder): a hardware file (.yaml, .yml, .json), a model's
    config.json (a path: it has a '/' or ends in .json), an accuracy CSV (a hit rate that is not a number),
    a calibration folder."""
    from ddbench.core.catalog.files import is_file_name
    if not isinstance(value, str) or not value.strip() or os.path.isabs(os.path.expanduser(value)) \
            or value.startswith("~"):
        return False
    if key in ("gpu", "link", "host"):
        return is_file_name(value)
    if key == "model":
        return "/" in value or value.lower().endswith(".json")
    if key == "hit_rate":
        try:
            float(value)
            return False
        except ValueError:
            return True
    return key == "calibration"


def _read(path: str) -> dict:
    return read_mapping(path, f"config {path}", "flags to values")


def _actions(sub: argparse.ArgumentParser) -> dict:
    out = {}
    for a in sub._actions:
        for opt in a.option_strings:
            if opt.startswith("--"):
                out[opt[2:].replace("-", "_")] = a
    return out


def _text(value, key: str, bad: dict):
    if isinstance(value, list):
        if not value or not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
            bad[key] = "a list must hold plain values"
            return None
        return ",".join(str(v) for v in value)
    if isinstance(value, (dict, bool)) or value is None:
        bad[key] = f"expected a value, got {type(value).__name__ if value is not None else 'null'}"
        return None
    return str(value)


def config_args(sub: argparse.ArgumentParser, path: str) -> list[str]:
    """The flags a config file stands for, each value checked by its flag's parser."""
    raw = _read(path)
    acts, folder = _actions(sub), os.path.dirname(os.path.abspath(path))
    out, bad = [], {}
    for k, v in raw.items():
        key = str(k).replace("-", "_")
        a = acts.get(key)
        if a is None or key in ("config", "help"):
            bad[k] = "not a flag of this command"
            continue
        opt = "--" + key.replace("_", "-")
        if isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            if not isinstance(v, bool):
                bad[k] = f"a switch: true or false, got {v!r}"
            elif v == isinstance(a, argparse._StoreTrueAction):
                out.append(opt)
            continue
        if hasattr(a, "check"):          # --rate: a what-if (a list: one flag per item) or, in simulate, arrivals
            try:
                for item in (v if isinstance(v, list) else [v]):
                    a.check(str(item))
                    out += [opt, str(item)]
            except (argparse.ArgumentTypeError, ValueError, DDBenchError) as exc:
                bad[k] = str(exc)
            continue
        text = _text(v, k, bad)
        if text is None:
            continue
        if key == "rates":        # beside the config, never from the current folder
            from ddbench.core.ratefile import resolve_path
            try:
                text = resolve_path(text, folder, f"config {path}")
            except DDBenchError as exc:
                bad[k] = str(exc).split(": ", 1)[-1]
                continue
        elif key in FILE_KEYS and names_a_file(key, text):
            text = os.path.join(folder, text)
        try:
            value = a.type(text) if a.type is not None else text
            if a.choices is not None and value not in a.choices:
                raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from"
                                                 f" {', '.join(map(str, a.choices))})")
        except (argparse.ArgumentTypeError, ValueError, TypeError, DDBenchError) as exc:
            bad[k] = str(exc)
            continue
        out += [opt, text]
    if bad:
        raise DDBenchError(f"config {path}: " + "; ".join(f"{k}: {m}" for k, m in bad.items()))
    return out


def _split(argv: list[str]) -> tuple[str | None, list[str]]:
    """(the --config FILE given, or None; the other arguments)."""
    rest, path, i = [], None, 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            rest += argv[i:]
            break
        if a == "--config":
            if i + 1 >= len(argv):
                raise DDBenchError("--config needs a file")
            path, i = argv[i + 1], i + 2
            continue
        if a.startswith("--config="):
            path, i = a.split("=", 1)[1], i + 1
            continue
        rest.append(a)
        i += 1
    return path, rest


def add_config_arg(p) -> None:
    """--config FILE on the command's parser `p`: its flags go before the command line's own (which win)."""
    base = type(p)

    class ConfigParser(base):
        def parse_known_args(self, args=None, namespace=None):
            try:
                path, rest = _split(list(args or []))
                if path is not None:
                    if not path.strip():
                        raise DDBenchError("--config is empty: name a YAML or JSON file")
                    args = config_args(self, path) + rest
            except DDBenchError as exc:
                self.error(str(exc))
            return super().parse_known_args(args, namespace)

    p.__class__ = ConfigParser
    p.add_argument("--config", metavar="FILE",
                   help="YAML or JSON file whose keys are this command's flags (model: ..., gpu: ...,"
                        " design: [a, b]); flags given here override it")

"""The one Workload: CLI flags generated from its fields, defaults from one place, validation."""

import argparse
from dataclasses import fields

import pytest

from ddbench.core.catalog import get_model
from ddbench.core.errors import DDBenchError
from ddbench.core.memory import Workload as MemoryWorkload
from ddbench.core.workload import Workload, add_workload_args, workload_from_args

M8 = get_model("llama-3-8b")


def _parser(**kw):
    p = argparse.ArgumentParser()
    add_workload_args(p, **kw)
    return p


def test_memory_model_uses_the_same_workload():
    assert MemoryWorkload is Workload


def test_every_field_has_a_flag_with_its_help_and_default():
    helps = {a.option_strings[0]: a.help for a in _parser()._actions if a.option_strings}
    for f in fields(Workload):
        text = helps["--" + f.name.replace("_", "-")]
        assert f.metadata["help"] in text
        if f.name != "context":
            assert f"(default {f.default})" in text


def test_defaults_come_from_the_dataclass_and_flags_override():
    w = workload_from_args(_parser().parse_args(["--context", "64k", "--budget", "1k", "--chunk", "16"]), M8)
    assert w == Workload(context=65536, budget=1024, chunk=16)
    w = workload_from_args(_parser().parse_args(["--context", "128k"]))
    assert w == Workload(context=131072)


def test_excluded_fields_come_from_the_command():
    p = _parser(exclude=("context", "batch"))
    assert "--batch" not in {s for a in p._actions for s in a.option_strings}
    w = workload_from_args(p.parse_args(["--rank", "64"]), M8, context=32768, batch=7)
    assert (w.context, w.batch, w.rank) == (32768, 7, 64)
    # a flag given on the command line wins over the command's own value
    w = workload_from_args(p.parse_args(["--budget", "512"]), M8, context=32768, budget=4096)
    assert w.budget == 512


@pytest.mark.parametrize("argv, message", [
    (["--context", "1k"], "larger than the context"),
    (["--context", "128k", "--lowrank-layers", "99"], "exceeds the model's 32 layers"),
    (["--context", "128k", "--budget", "1004"], "not a multiple of the chunk size"),
])
def test_validation_errors(argv, message):
    with pytest.raises(DDBenchError, match=message):
        workload_from_args(_parser().parse_args(argv), M8)


def test_validate_refuses_a_value_below_its_minimum():
    with pytest.raises(DDBenchError, match="chunk must be an integer >= 1"):
        Workload(context=131072, chunk=0).validate(M8)


@pytest.mark.parametrize("argv, message", [
    (["--context", "128k", "--chunk", "0"], "chunk must be an integer >= 1"),
    (["--context", "128k", "--gen-tokens", "-1"], "gen_tokens must be an integer >= 0"),
    (["--context", "128k", "--rank", str(1 << 60)], "at most"),
    (["--context", "2000000000000m"], "context must be at most"),
])
def test_out_of_range_flags_are_usage_errors(argv, message, capsys):
    """A value out of range is refused where argparse parses it (one line, exit 2)."""
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_token_flags_reject_garbage_as_usage_errors(capsys):
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(["--context", "lots"])
    assert e.value.code == 2 and "cannot parse context 'lots'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parser().parse_args(["--context", "128k", "--chunk", "eight"])

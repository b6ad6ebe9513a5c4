"""--context and --output are parsed once, at the CLI, into a Distribution that everything downstream takes."""

import json

from ddbench import cli
from ddbench.core.distribution import Distribution
from ddbench.planner.scenario import Scenario


def _count_parses(monkeypatch):
    calls = []
    real = Distribution.parse.__func__

    def counting(cls, spec, what="context"):
        calls.append((what, str(spec)))
        return real(cls, spec, what)
    monkeypatch.setattr(Distribution, "parse", classmethod(counting))
    return calls


def test_simulate_parses_the_context_once(monkeypatch, tmp_path, capsys):
    calls = _count_parses(monkeypatch)
    rc = cli.main(["simulate", "--model", "llama-3-8b", "--gpu", "h200", "--design", "dualdecoder,shadowkv",
                   "--context", "uniform:32k:64k", "--output", "32", "--rate", "1", "--requests", "8",
                   "--prefill-elsewhere", "--out", str(tmp_path / "o"), "--quiet"])
    capsys.readouterr()
    assert rc == 0
    assert [c for c in calls if c[0] == "context"] == [("context", "uniform:32k:64k")]   # two designs, one parse
    assert [c for c in calls if c[0] == "output"] == [("output", "32")]
    s = json.loads((tmp_path / "o" / "dualdecoder" / "summary.json").read_text()) \
        if (tmp_path / "o" / "dualdecoder").is_dir() else json.loads((tmp_path / "o" / "summary.json").read_text())
    assert "uniform:32k:64k" in json.dumps(s)


def test_plan_parses_the_context_once(monkeypatch, capsys):
    calls = _count_parses(monkeypatch)
    assert cli.main(["plan", "--model", "llama-3-8b", "--gpu", "h200", "--design", "all", "--context", "128k"]) == 0
    capsys.readouterr()
    assert [c for c in calls if c[0] == "context"] == [("context", "128k")]


def test_a_scenario_keeps_the_distribution_it_is_given():
    d = Distribution.parse("uniform:64k:128k")
    sc = Scenario(model="llama-3-8b", gpu="h200", context=d)
    assert sc.context is d and sc.contexts is d and str(sc.context) == "uniform:64k:128k"
    assert Scenario(model="llama-3-8b", gpu="h200", context="128k") == Scenario(model="llama-3-8b", gpu="h200",
                                                                                 context="131072")
    assert Distribution.parse("128k").tokens() == 131072

"""The output guard (ddbench/core/outputs.py), each promise checked in a subprocess.

`figures --only fig02` is the cheapest command that writes; `_driver` runs the guard alone in a child
process where a case needs a run that fails or is held part-way.
"""

import fcntl
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.cli import ROOT, assert_one_line_error, ddbench

FIG = ("figures", "--only", "fig02", "--quiet")


def _driver(code: str, cwd, timeout=60):
    """Run `code` (with output_folder imported) in a child process."""
    prog = "from ddbench.core.outputs import output_folder\nfrom ddbench.core.errors import DDBenchError\n" + \
        textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", prog], cwd=str(cwd), capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONPATH=ROOT))


def _tree(folder):
    return sorted(os.path.relpath(os.path.join(r, f), folder) for r, _, fs in os.walk(folder) for f in fs)


def test_issue_repro_force_then_plain_run_keeps_the_users_file(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("x")
    r = ddbench(*FIG, "--out", "mine", "--force", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (mine / "fig02.png").exists()
    r = ddbench("figures", "--quiet", "--out", "mine", cwd=tmp_path)   # the plain run that used to delete it
    assert (mine / "notes.txt").read_text() == "x"
    assert_one_line_error(r, contains="did not write (notes.txt)")


def test_foreign_files_are_refused_without_force_and_nothing_is_written(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.csv").write_text("a\n1\n")
    r = ddbench(*FIG, "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert_one_line_error(r, contains="pass --force")
    assert _tree(tmp_path / "out") == ["mine.csv"]


def test_force_never_overwrites_a_file_ddbench_did_not_write(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "fig02.csv").write_text("my own data\n")
    r = ddbench(*FIG, "--out", str(out), "--force", cwd=tmp_path)
    assert_one_line_error(r, contains="fig02.csv exists and was not written by ddbench")
    assert (out / "fig02.csv").read_text() == "my own data\n"
    assert _tree(out) == ["fig02.csv"]


WRITE = """
    import sys
    try:
        with output_folder("out", command="t", force="force" in sys.argv, own_ok=True) as w:
            w.write_text("a.csv", "x\\n1\\n")
    except DDBenchError as e:
        print(e, file=sys.stderr)
        sys.exit(2)
    """


def _write(cwd, *args):
    prog = "from ddbench.core.outputs import output_folder\nfrom ddbench.core.errors import DDBenchError\n" + \
        textwrap.dedent(WRITE)
    return subprocess.run([sys.executable, "-c", prog, *args], cwd=str(cwd), capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))


def test_a_file_changed_since_ddbench_wrote_it_is_no_longer_ddbenchs(tmp_path):
    out = tmp_path / "out"
    assert _write(tmp_path).returncode == 0
    assert _write(tmp_path).returncode == 0                     # its own file: replaced
    (out / "a.csv").write_text("edited by hand\n")
    assert_one_line_error(_write(tmp_path), contains="did not write (a.csv)")
    assert_one_line_error(_write(tmp_path, "force"), contains="refusing to overwrite")
    assert (out / "a.csv").read_text() == "edited by hand\n"


def test_an_earlier_figures_run_is_replaced_and_its_manifest_lists_every_file(tmp_path):
    out = tmp_path / "out"
    assert ddbench(*FIG, "--out", str(out), cwd=tmp_path).returncode == 0
    first = json.loads((out / ".ddbench-manifest.json").read_text())["files"]
    assert sorted(first) == ["fig02.csv", "fig02.pdf", "fig02.png"]
    r = ddbench(*FIG, "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert _tree(out) == [".ddbench-manifest.json", "fig02.csv", "fig02.pdf", "fig02.png"]


@pytest.mark.parametrize("where", ["cwd", "parent", "data", "root", "empty"])
def test_refuses_the_current_folder_the_data_root_and_above(tmp_path, where):
    data = tmp_path / "data"
    data.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    (work / "keep.txt").write_text("k")
    out = {"cwd": ".", "parent": "..", "data": str(data), "root": "/", "empty": ""}[where]
    r = ddbench("--data", str(data), *FIG, "--out", out, "--force", cwd=work)
    assert_one_line_error(r)
    assert _tree(work) == ["keep.txt"] and _tree(data) == []


def test_a_concurrent_writer_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)     # another ddbench run holds the folder
    try:
        r = ddbench(*FIG, "--out", str(out), cwd=tmp_path)
    finally:
        os.close(fd)
    assert_one_line_error(r, contains="another ddbench run is writing there")
    assert _tree(out) == []


def test_a_failed_run_leaves_nothing_not_even_the_parent_folders(tmp_path):
    r = _driver("""
        import sys
        try:
            with output_folder("a/b/c", command="t") as w:
                w.write_text("x.csv", "a\\n1\\n")
                raise DDBenchError("stop half-way")
        except DDBenchError as e:
            print(e)
            sys.exit(2)
        """, tmp_path)
    assert r.returncode == 2 and "stop half-way" in r.stdout
    assert os.listdir(tmp_path) == []


def test_a_killed_run_leaves_the_earlier_output_whole(tmp_path):
    out = tmp_path / "out"
    assert _write(tmp_path).returncode == 0
    before = {f: (out / f).read_bytes() for f in _tree(out)}
    prog = textwrap.dedent("""
        import os, time
        from ddbench.core.outputs import output_folder
        with output_folder("out", command="t", own_ok=True) as w:
            w.write_text("a.csv", "half")
            print("ready", flush=True)
            time.sleep(60)
        """)
    p = subprocess.Popen([sys.executable, "-c", prog], cwd=tmp_path, stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.stdout.readline().strip() == "ready"
    p.kill()
    p.wait()
    assert {f: (out / f).read_bytes() for f in _tree(out) if ".ddbench-stage-" not in f} == before
    r = _write(tmp_path)                                        # the next run clears the dead run's staging folder
    assert r.returncode == 0, r.stderr
    assert not [f for f in os.listdir(out) if f.startswith(".ddbench-stage-")]


def test_an_exclusive_folder_replaces_an_earlier_run_only_with_force(tmp_path):
    code = """
        import sys
        force = sys.argv[1:] == ["force"]
        try:
            with output_folder("o", command="t", force=force) as w:
                w.write_text("{name}", "v\\n")
        except DDBenchError as e:
            print(e, file=sys.stderr)
            sys.exit(2)
        """
    assert _driver(code.format(name="a.csv"), tmp_path).returncode == 0
    r = _driver(code.format(name="b.csv"), tmp_path)
    assert_one_line_error(r, contains="holds an earlier ddbench run")
    prog = "from ddbench.core.outputs import output_folder\nwith output_folder('o', command='t', force=True) as w:" \
           "\n    w.write_text('b.csv', 'v')\n"
    subprocess.run([sys.executable, "-c", prog], cwd=tmp_path, check=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert _tree(tmp_path / "o") == [".ddbench-manifest.json", "b.csv"]     # pruned: a.csv was ddbench's


def test_an_unreadable_manifest_is_one_line(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".ddbench-manifest.json").write_bytes(b"\xff\xfe not json")
    assert_one_line_error(ddbench(*FIG, "--out", str(out), "--force", cwd=tmp_path), contains="unreadable")


@pytest.mark.parametrize("folder,files", [
    ("figures", None),                                   # every file
    ("traces/accuracy", None),
    ("traces/calibration/h200", ["bundle.json", "link.csv", "engine.csv"]),
    ("traces/engine/h200", ["engine.csv", "meta.json", "rows.jsonl", "summary.json"]),
    ("traces/kernels/h200", ["kernels.csv"]),
])
def test_committed_outputs_are_ddbenchs_own(folder, files):
    """What ddbench commands wrote into the repository is in their folders' manifests, unchanged since, so
    a rerun (`make figures`, `ddbench profile --force`, ...) may replace it and nothing else. A folder's
    README.md is a person's file (what the folder holds), never ddbench's."""
    import os
    from pathlib import Path

    from ddbench.core.outputs import _files, _owned, read_manifest
    path = Path(ROOT) / folder
    own = _owned(path, read_manifest(path))
    assert [f for f in (files or _files(path)) if f not in own and os.path.basename(f) != "README.md"] == []


def test_the_same_bytes_again_leave_the_manifest_byte_identical(tmp_path, monkeypatch):
    """A re-run that writes what is there (make figures on another day) keeps each file's first date, so the
    folder, manifest included, is byte-identical; a changed file gets a new entry."""
    from ddbench.core import outputs as O
    monkeypatch.chdir(tmp_path)
    stamps = iter(["2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z"])
    monkeypatch.setattr(O.time, "strftime", lambda fmt, t=None: next(stamps))

    def run(text):
        with O.output_folder("out", command="t", own_ok=True) as w:
            w.write_text("a.txt", text)
            w.write_text("b.txt", "same")
        return (tmp_path / "out" / O.MANIFEST).read_bytes()
    first = run("one")
    assert run("one") == first
    third = json.loads(run("two"))["files"]
    assert third["a.txt"]["written_utc"] == "2026-01-03T00:00:00Z"
    assert third["b.txt"]["written_utc"] == "2026-01-01T00:00:00Z"


@pytest.mark.parametrize("recorded, ok", [("python -m sim.fit", True), ("python -m ddbench.sim.fit", True),
                                          ("python -m sim.validate", False)])
def test_a_renamed_commands_files_stay_its_own(tmp_path, monkeypatch, recorded, ok):
    """A folder written under a command's old module name (`python -m sim.fit`, before ddbench.sim) is that
    command's under its new name; another command's stay foreign (the negative control)."""
    from ddbench.core import outputs as O
    from ddbench.core.errors import DDBenchError
    monkeypatch.chdir(tmp_path)
    with O.output_folder("out", command=recorded) as w:
        w.write_text("fitted.json", "{}")

    def rewrite():
        with O.output_folder("out", command="python -m ddbench.sim.fit", own_ok=True) as w:
            w.write_text("fitted.json", '{"a": 1}')
    if ok:
        rewrite()
        assert (tmp_path / "out" / "fitted.json").read_text() == '{"a": 1}'
    else:
        with pytest.raises(DDBenchError, match="another ddbench command"):
            rewrite()
        assert (tmp_path / "out" / "fitted.json").read_text() == "{}"

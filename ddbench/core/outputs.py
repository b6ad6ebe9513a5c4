"""The one output guard: every command that writes files goes through `output_folder`.

What it promises:
- it never deletes or overwrites a file that it did not write for the same command. What ddbench wrote
  is listed, with each file's SHA-256 and the command that wrote it, in the folder's manifest
  `.ddbench-manifest.json`; a listed file that was changed since is no longer ddbench's. Another
  command's files are foreign to a command (kept, never replaced or pruned, `--force` included); a
  run with a `scope` (one model's profile) owns only the names in it;
- `--force` replaces only what the same command wrote: with `force`, a folder that holds other files
  is written beside them (they are kept); a new file that would land on one of them is refused;
- the manifest's paths are relative, normalised and inside the folder, and each entry is a record;
  anything else makes it corrupt: one line, and nothing is touched;
- it refuses the folders of ddbench/core/outpaths.py (`check_path`): the current folder and those above
  it, home, a filesystem root, the data root but a command's own folders there (`DATA_OUTPUTS`);
- it takes a lock (`flock` on the folder) against a concurrent writer, which is refused in one line;
- its writes are atomic: files are built in a staging folder inside the target and renamed into
  place together when the block ends without an error (SIGINT, SIGTERM and SIGHUP held off meanwhile);
  on any error, Ctrl-C, SIGTERM, SIGHUP or a full disk, nothing of the run is left (the new manifest is
  written before anything moves). A staging folder is ddbench's only where the marker file inside it
  holds the digest of the folder's own name and inode that ddbench wrote when it made it: a killed
  run's is removed by the next run, as is one that holds nothing (a full disk while making it); a
  user's folder of a like name (or a copy of a staging folder) is the user's;
- `undo_run` (called by the CLI when a command fails after its outputs moved in, e.g. its answer cannot
  be written to a full stdout) removes the files the run created where none was; one it replaced stays;
- it leaves no parent folders behind: folders it created are removed again if the run fails.

Kinds of output:
- an exclusive folder (`simulate --out`, `sweep --out`, `figures --out`): a folder that holds an
  earlier run of the same command is replaced only with `force` (or `own_ok`, for outputs that are
  regenerated or resumed in place); with `prune`, that run's files that this run does not write
  again are removed;
- a shared folder (`shared=True`: `profile --out`, `plan --plot`'s folder, a calibration bundle):
  other files are expected there and kept; only a file this run writes is checked.

Live files (`Writer.live`) are written in place, not staged: a sweep's store of finished points,
appended as points finish so that a rerun resumes. A run that ends cleanly seals each with its SHA-256;
a live entry whose file does not match (appended to by a run that was killed, or never sealed) may be
appended to again by its command, but is never replaced or pruned: a manifest entry alone, without its
checksum, never lets a command delete a file.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import signal
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from ddbench.core.errors import DDBenchError
from ddbench.core.outpaths import DATA_OUTPUTS, check_path  # noqa: F401 - the guard's path rule, used here

MANIFEST = ".ddbench-manifest.json"
STAGE_PREFIX = ".ddbench-stage-"
STAGE_MARK = ".ddbench-stage-token"      # inside a staging folder: the digest of its name and inode
LEGACY_MARKERS = (".ddbench-run", ".ddbench-figures")   # earlier versions' markers: ddbench's own
SCHEMA = 1
MANIFEST_TMP = (STAGE_PREFIX + "manifest-", ".tmp-manifest-")   # a new manifest's name before it moves in (now, before)
MANIFEST_HEAD = b'{\n "schema": 1,\n "written_by": "ddbench"'  # how every manifest ddbench writes starts
# commands renamed since they wrote files (the folders sim/ and kernels/ import as ddbench.sim and
# ddbench.kernels): what they wrote under the old name stays theirs under the new one
RENAMED = {f"python -m {old}": f"python -m ddbench.{old}"
           for old in ("sim.fit", "sim.validate", "kernels.linkbench", "kernels.hostbench", "kernels.engine.sweep")}


def owner(command):
    """The command a manifest entry's `command` names today."""
    return RENAMED.get(command, command)


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _plain(rel) -> bool:
    """`rel` is a relative, normalised path inside a folder (not the manifest, not a staging folder)."""
    return (isinstance(rel, str) and rel != "" and "\0" not in rel and not os.path.isabs(rel)
            and os.path.normpath(rel) == rel and ".." not in Path(rel).parts and rel != MANIFEST
            and not rel.startswith(STAGE_PREFIX))


def _bad_entry(rel, entry) -> str | None:
    if not _plain(rel):
        return f"entry {rel!r} is not a relative path inside the folder"
    if not isinstance(entry, dict):
        return f"entry {rel!r} is {type(entry).__name__ if entry is not None else 'null'}, not a record"
    for key, kind in (("command", str), ("sha256", str), ("live", bool)):
        if key in entry and not isinstance(entry[key], kind):
            return f"entry {rel!r}: field {key} is not a {kind.__name__}"
    return None


def read_manifest(folder: Path) -> dict:
    """{relative path: entry} of what ddbench wrote into `folder` ({} where there is no manifest); a
    one-line DDBenchError where it is unreadable or corrupt."""
    p = Path(folder) / MANIFEST
    if not p.exists() and not p.is_symlink():
        return {}
    try:
        data = json.loads(p.read_bytes().decode("utf-8"))
        files = data["files"]
        if not isinstance(files, dict):
            raise TypeError
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise DDBenchError(f"{p} is unreadable; ddbench cannot tell which files there are its own") from None
    for rel, entry in files.items():
        why = _bad_entry(rel, entry)
        if why:
            raise DDBenchError(f"{p} is corrupt ({why}); ddbench cannot tell which files there are its own:"
                               " move it away, or choose another folder")
    return files


def _owned(folder: Path, manifest: dict, command: str | None = None, scope=None, live: set | None = None) -> set[str]:
    """The files in `folder` that ddbench wrote and nobody changed since (their SHA-256 matches the entry's):
    with `command`, only those the same command wrote (and with `scope`, only those among its names). A
    live entry whose file does not match its checksum (appended since, or no checksum) goes into `live`
    instead: it may be appended to again, never replaced or pruned."""
    own = set()
    real = os.path.realpath(folder)
    for rel, entry in manifest.items():
        if command is not None and owner(entry.get("command")) != command:
            continue
        if scope is not None and rel not in scope:
            continue
        p = folder / rel
        if not p.is_file() or p.is_symlink() or os.path.realpath(p) != os.path.join(real, rel):
            continue                                    # a link on the way: not inside the folder
        if entry.get("sha256") == sha256(str(p)):
            own.add(rel)
        elif entry.get("live") and live is not None:
            live.add(rel)
    for m in LEGACY_MARKERS:
        if (folder / m).is_file() and not (folder / m).is_symlink():
            own.add(m)
    return own


def _files(folder: Path, skip=()) -> list[str]:
    """Every file (and link) under `folder`, relative, except the manifest and the folders in `skip`."""
    out = []
    for root, dirs, names in os.walk(folder):
        rel_root = os.path.relpath(root, folder)
        if rel_root == ".":
            dirs[:] = [d for d in dirs if d not in skip]
        for d in list(dirs):
            if os.path.islink(os.path.join(root, d)):
                out.append(os.path.normpath(os.path.join(rel_root, d)))
                dirs.remove(d)
        for n in names:
            rel = os.path.normpath(os.path.join(rel_root, n))
            if rel != MANIFEST:
                out.append(rel)
    return sorted(out)


def _names(items, k: int = 3) -> str:
    items = sorted(items)
    return ", ".join(items[:k]) + (f" and {len(items) - k} more" if len(items) > k else "")


class Writer:
    """What a command writes through: staged files, and live files written in place."""

    def __init__(self, folder: Path, stage: Path, command: str, check, live_ok=frozenset()):
        self.folder, self._stage, self.command = folder, stage, command
        self._live: set[str] = set()
        self._check = check
        self._live_ok = live_ok          # live files of this command not matching their checksum: appendable

    def claim(self, rels) -> None:
        """Refuse now (before the work) the files that could not be written at the end."""
        for rel in rels:
            if self._rel(rel) not in self._live_ok:     # a live file of this command's: appended to, checked then
                self._check(self._rel(rel))

    def _rel(self, rel: str) -> str:
        norm = os.path.normpath(rel)
        if not _plain(norm):
            raise DDBenchError(f"internal: output name {rel!r} is not a plain name inside the folder")
        return norm

    def stage_path(self, rel: str) -> str:
        """Where to write `rel` now (a path in the staging folder); it is moved in on commit."""
        p = self._stage / self._rel(rel)
        p.parent.mkdir(parents=True, exist_ok=True)
        return str(p)

    def scratch(self, prefix: str = "") -> str:
        """A fresh folder inside the staging folder for work in progress (not an output; it goes with
        the staging folder)."""
        return tempfile.mkdtemp(prefix=STAGE_PREFIX + prefix, dir=self._stage)

    def write_text(self, rel: str, text: str) -> str:
        p = self.stage_path(rel)
        with open(p, "w", encoding="utf-8") as fh:
            fh.write(text)
        return p

    def write_json(self, rel: str, obj) -> str:
        from ddbench.core.io import dumps_json
        return self.write_text(rel, dumps_json(obj) + "\n")

    def live(self, rel: str) -> str:
        """A file written in place (appended as work finishes), recorded at once as ddbench's."""
        rel = self._rel(rel)
        if rel not in self._live_ok:
            self._check(rel)             # the same rule as a staged file's, checked before it is written
        p = self.folder / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        self._live.add(rel)
        _update_manifest(self.folder, {rel: {"live": True, "command": self.command}}, ())
        return str(p)

    def staged(self) -> list[str]:
        """The staged outputs (the stage's marker and scratch folders are not outputs)."""
        return [f for f in _files(self._stage) if not f.startswith(STAGE_PREFIX)]


def _update_manifest(folder: Path, add: dict, remove) -> None:
    """Add and remove entries in the manifest; one left with none is removed."""
    tmp = _new_manifest(folder, add, remove)
    try:
        _put_manifest(folder, tmp)
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def _new_manifest(folder: Path, add: dict, remove) -> str | None:
    """The manifest with entries added and removed, written to a temporary file beside it (None: no entry
    is left). Written before anything moves: a full disk fails here, with nothing changed."""
    files = read_manifest(folder)
    for rel in remove:
        files.pop(rel, None)
    files.update(add)
    if not files:
        return None
    text = json.dumps({"schema": SCHEMA, "written_by": "ddbench", "files": dict(sorted(files.items()))},
                      indent=1, allow_nan=False) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=MANIFEST_TMP[0], dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def _put_manifest(folder: Path, tmp: str | None) -> None:
    if tmp is None:
        try:
            (folder / MANIFEST).unlink()
        except FileNotFoundError:
            pass
    else:
        os.replace(tmp, folder / MANIFEST)


def _make_dirs(path: Path) -> list[Path]:
    """mkdir -p, returning the folders it created (outermost first)."""
    made = []
    for p in reversed([path, *path.parents]):
        if not p.exists():
            try:
                p.mkdir()
            except FileExistsError:   # a concurrent run made it: not ours
                continue
            os.chmod(p, 0o777 & ~_umask())
            made.append(p)
    return made


def _remove_empty(made: list[Path]) -> None:
    for p in reversed(made):
        try:
            p.rmdir()
        except OSError:
            break


@contextmanager
def _locked(folder: Path, flag: str, out):
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise DDBenchError(f"{flag} {out}: another ddbench run is writing there; wait for it, or choose"
                                   " another folder") from None
            raise
        yield
    finally:
        os.close(fd)


HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def _signals_held():
    """SIGINT, SIGTERM and SIGHUP wait until the block ends, then act as they would have. Held by Python-level
    handlers, not by the thread's signal mask: a process-directed signal goes to any thread that does not
    block it (numpy's BLAS threads), and Python would run the handler in the block all the same."""
    got, prev = [], {}

    def note(signum, frame):
        got.append(signum)
    try:
        for sig in HELD:
            prev[sig] = signal.signal(sig, note)
    except ValueError:                 # not the main thread: no handler of Python's runs here anyway
        for sig, h in prev.items():
            signal.signal(sig, h)
        prev = {}
    try:
        yield
    finally:
        for sig, h in prev.items():
            signal.signal(sig, h)
        if got:
            h = prev[got[0]]
            if callable(h):
                h(got[0], None)        # Ctrl-C's default_int_handler, the CLI's SIGTERM/SIGHUP: KeyboardInterrupt
            elif h == signal.SIG_DFL:
                os.kill(os.getpid(), got[0])


def _stage_token(d: Path) -> str:
    """What the marker of the staging folder `d` holds: a digest of its name and of the folder itself
    (device and inode), so that neither a folder of a like name nor a copy of a staging folder matches."""
    st = os.lstat(d)
    return hashlib.sha256(f"ddbench-stage:{d.name}:{st.st_dev}:{st.st_ino}".encode()).hexdigest()


def _is_our_stage(d: Path) -> bool:
    """`d` is a staging folder that ddbench made: a real folder whose marker holds its token."""
    mark = d / STAGE_MARK
    try:
        return (d.is_dir() and not d.is_symlink() and mark.is_file() and not mark.is_symlink()
                and mark.read_text(encoding="utf-8").strip() == _stage_token(d))
    except (OSError, UnicodeDecodeError):
        return False


def _empty_leftover(d: Path) -> bool:
    """`d` holds nothing of anyone's: an empty staging folder, or one with nothing but an empty marker (a run
    that hit a full disk making it), or an empty temporary manifest file."""
    try:
        if d.is_symlink():
            return False
        if d.is_file():        # a new manifest not yet in place (a run killed or out of space writing it)
            with open(d, "rb") as fh:
                head = fh.read(len(MANIFEST_HEAD))
            return d.name.startswith(MANIFEST_TMP) and MANIFEST_HEAD.startswith(head)
        names = os.listdir(d)
        return not names or (names == [STAGE_MARK] and (d / STAGE_MARK).is_file()
                             and not (d / STAGE_MARK).is_symlink() and (d / STAGE_MARK).stat().st_size == 0)
    except OSError:
        return False


def _clear_stale_stages(path: Path) -> None:
    """Remove the staging folders of runs that were killed (the folder lock is free now): only those that
    ddbench made (their marker), and leftovers that hold nothing; every other folder, of whatever name, stays."""
    for d in path.iterdir():
        if d.name.startswith(MANIFEST_TMP) and _empty_leftover(d) or \
                d.name.startswith(STAGE_PREFIX) and (_is_our_stage(d) or _empty_leftover(d)):
            if d.is_file():
                d.unlink()
            else:
                shutil.rmtree(d, ignore_errors=True)


def _new_stage(path: Path) -> Path:
    """A staging folder in `path`, marked as ddbench's (its marker holds `_stage_token`); removed again where
    the marker cannot be written (a full disk)."""
    stage = Path(tempfile.mkdtemp(prefix=STAGE_PREFIX, dir=path))
    try:
        (stage / STAGE_MARK).write_text(_stage_token(stage) + "\n", encoding="utf-8")
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return stage


def _by(manifest: dict, rels) -> str:
    cmds = sorted({str(manifest.get(r, {}).get("command") or "an unnamed command") for r in rels})
    return ", ".join(f"`{c}`" for c in cmds)


@contextmanager
def output_folder(out, *, command: str, flag: str = "--out", force: bool = False, own_ok: bool = False,
                  shared: bool = False, prune: bool = True, allow_cwd: bool = False, scope=None):
    """Yield a Writer for the folder `out`; its staged files move in when the block ends cleanly.

    `command`: who writes (recorded in the manifest): a run replaces or prunes only files of the same command.
    `force`: write into a folder that holds other files (kept), and replace this command's own files.
    `own_ok`: replace this command's own files without `force` (regenerated or resumed outputs).
    `shared`: other files are expected in the folder (no `force` needed beside them).
    `prune`: remove this command's earlier files that this run does not write again.
    `scope`: the names this run may replace or prune (one model's files in a shared folder); the
    command's other files there are kept as they are.
    """
    path = check_path(out, flag, allow_cwd=allow_cwd and shared, data_ok=DATA_OUTPUTS.get(command, ()))
    scope = None if scope is None else frozenset(scope)
    try:
        made = _make_dirs(path)
    except OSError as exc:
        raise DDBenchError(f"cannot write {flag} {out}: {_why(exc)}") from None
    ok = False
    try:
        with _locked(path, flag, out):
            manifest = read_manifest(path)
            _clear_stale_stages(path)
            live_own, live_any = set(), set()               # live files not matching their checksum
            own = _owned(path, manifest, command, scope, live_own)
            # ddbench's, but another command's (or out of scope)
            theirs = (_owned(path, manifest, live=live_any) | live_any) - own - live_own
            present = _files(path)
            foreign = [f for f in present if f not in own and f not in theirs and f not in live_own]
            if foreign and not (force or shared):
                raise DDBenchError(f"{flag} {out} holds files ddbench did not write ({_names(foreign)}); choose"
                                   " another folder, or pass --force to write beside them (they are kept)")
            if theirs and not (force or shared):
                raise DDBenchError(f"{flag} {out} holds files another ddbench command wrote ({_names(theirs)},"
                                   f" by {_by(manifest, theirs)}); choose another folder, or pass --force to write"
                                   " beside them (they are kept)")
            if (own or live_own) and not (force or own_ok or shared):
                raise DDBenchError(f"{flag} {out} holds an earlier ddbench run; pass --force to replace it")
            stage = None
            try:
                try:
                    with _signals_held():      # a signal waits until the stage is made and marked
                        stage = _new_stage(path)
                except OSError as exc:
                    raise DDBenchError(f"cannot write {flag} {out}: {_why(exc)}") from None
                foreign_set = set(foreign)

                def check(rel):
                    _check_one(rel, path, own, foreign_set, theirs, manifest, force or own_ok, shared, flag, out)
                w = Writer(path, stage, command, check, frozenset(live_own))
                yield w
                created = _commit(w, path, own, manifest, prune)
                _JOURNAL.append((path, created, made))
                ok = True
            finally:
                if stage is not None:
                    shutil.rmtree(stage, ignore_errors=True)
    finally:
        if not ok:
            _forget_missing(path)
            _remove_empty(made)


def _forget_missing(path: Path) -> None:
    """After a failed run: drop the manifest entries of files that were never written (live files recorded
    before the work), and a manifest left with none."""
    try:
        gone = [rel for rel in read_manifest(path) if not (path / rel).exists()]
        if gone:
            _update_manifest(path, {}, gone)
    except (DDBenchError, OSError):
        return


def _check_one(rel: str, path: Path, own: set, foreign: set, theirs: set, manifest: dict, replace_own: bool,
               shared: bool, flag: str, out):
    dest = path / rel
    if rel in theirs:
        raise DDBenchError(f"{flag} {out}: {rel} was written by {_by(manifest, [rel])}, another command (or"
                           " another model); refusing to overwrite it (even with --force); choose another folder")
    if rel in foreign or (dest.exists() and rel not in own) or dest.is_symlink():
        raise DDBenchError(f"{flag} {out}: {rel} exists and was not written by ddbench; refusing to overwrite it"
                           " (even with --force); move it away or choose another folder")
    if rel in own and shared and not replace_own:
        raise DDBenchError(f"{flag} {out}: {rel} exists (an earlier ddbench run); pass --force to replace it")
    for parent in Path(rel).parents:
        if str(parent) != "." and (path / parent).exists() and not (path / parent).is_dir():
            raise DDBenchError(f"{flag} {out}: {parent} exists and is not a folder")


def _commit(w: Writer, path: Path, own: set, manifest: dict, prune: bool) -> None:
    """Move the staged files in (each checked again by the writer's rule, _check_one) with the manifest."""
    new = w.staged()
    for rel in new:
        w._check(rel)
    existed = {rel for rel in new if (path / rel).exists()}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    entries = {}
    mask = _umask()
    for rel in new:
        src = w._stage / rel
        os.chmod(src, 0o666 & ~mask)
        digest, prev = sha256(str(src)), manifest.get(rel) or {}
        # the same bytes from the same command keep their first date: a re-run that changes nothing
        # leaves the manifest (and so the folder) byte-identical
        same = prev.get("sha256") == digest and owner(prev.get("command")) == w.command and prev.get("written_utc")
        entries[rel] = {"sha256": digest, "command": w.command, "written_utc": prev["written_utc"] if same else now}
    for rel in sorted(w._live):        # a live file is sealed with its checksum: a later run trusts only that
        if (path / rel).is_file() and not (path / rel).is_symlink():
            entries[rel] = {"live": True, "command": w.command, "sha256": sha256(str(path / rel))}
    # only this command's own files (in scope) are pruned; `own` never holds another command's, nor a file
    # that does not match its checksum
    stale = sorted(own - set(new) - w._live - set(LEGACY_MARKERS)) if prune else []
    legacy = [m for m in LEGACY_MARKERS if m in own]
    for rel in new:
        _make_dirs((path / rel).parent)
    tmp = _new_manifest(path, entries, stale + legacy)     # a full disk fails here, before anything moves
    try:
        with _signals_held():
            for rel in new:
                os.replace(w._stage / rel, path / rel)
            for rel in stale + legacy:
                try:
                    (path / rel).unlink()
                except FileNotFoundError:
                    pass
                _remove_empty([p for p in reversed((path / rel).parents) if path in p.parents])
            _put_manifest(path, tmp)
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return {rel: entries[rel]["sha256"] for rel in new if rel not in existed}


# what this run wrote that no file was before: (folder, {relative path: SHA-256}, folders made), undone by
# `undo_run` where the run fails afterwards (its answer cannot be written to a full stdout)
_JOURNAL: list = []


def start_run() -> None:
    """A command starts: nothing of it to undo yet."""
    _JOURNAL.clear()


def undo_run() -> None:
    """The command failed after its outputs moved in (a full stdout, an error in a later output): remove the
    files it created where nothing was before (unchanged since: their SHA-256), their manifest entries and
    the folders it made. A file it replaced (--force) stays replaced. Never raises."""
    while _JOURNAL:
        path, created, made = _JOURNAL.pop()
        try:
            with _locked(path, "--out", path):
                gone = []
                for rel, digest in created.items():
                    p = path / rel
                    if p.is_file() and not p.is_symlink() and sha256(str(p)) == digest:
                        p.unlink()
                        _remove_empty([q for q in reversed(p.parents) if path in q.parents])
                        gone.append(rel)
                _update_manifest(path, {}, gone)
            _remove_empty(made)
        except (OSError, DDBenchError):
            continue


@contextmanager
def output_file(path, *, command: str, flag: str, force: bool = False):
    """One file written through the guard into its folder (kept as it is otherwise): yields the staged
    path to write; it moves in when the block ends cleanly. Refused at once where it cannot be written."""
    if path is None or not str(path).strip():
        raise DDBenchError(f"{flag} is empty: name a file")
    full = os.path.abspath(os.path.expanduser(str(path)))
    folder, name = os.path.split(full)
    if not name:
        raise DDBenchError(f"{flag} {path} names a folder, not a file")
    with output_folder(folder, command=command, flag=flag, force=force, shared=True, prune=False,
                       allow_cwd=True) as w:
        w.claim([name])
        yield w.stage_path(name)


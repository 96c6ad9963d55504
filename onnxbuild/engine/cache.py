"""The content-addressed step cache.

Layout under the cache root::

    objects/ab/abcdef...      output files, named by sha256, read-only
    entries/12/1234....json   one per step key: its ingredients and its outputs' digests
    last/<recipe>.json        the keys and ingredients of each recipe's last build (for `plan`'s reasons)
    state/hashes.json         sha256 of files keyed by (inode, size, mtime) as DVC does, so unchanged
                              files are not re-read on every build
    locks/                    flock files
    tmp/<pid>-<random>/       where running steps write; moved into objects/ on success

An entry is written last, atomically, after all its objects are in place: a build
killed at any moment leaves either a whole entry or none. An entry that cannot be
read, whose objects are missing or the wrong size, or which names an output path outside
its artifact folder, is a miss with a warning.

One module (~580 lines): the layout above, its invariants and every operation that
must keep them (put, get, gc, clean, verify, the hash memo) belong together; the remote
cache is remote.py, signatures signing.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Protocol, TypedDict, cast

from onnxbuild._util import JsonValue as JsonValue  # re-exported: readers of cache files import it from here
from onnxbuild._util import (
    atomic_write_text,
    canonical_json,
    pretty_json,
    sha256_file,
    sha256_text,
    temp_owner,
)
from onnxbuild.engine.locks import FileLock
from onnxbuild.engine.testhooks import pause_for_tests
from onnxbuild.environment import Versions
from onnxbuild.errors import CacheError

if TYPE_CHECKING:
    from onnxbuild.engine.codekeys import Code


class OutputRecord(TypedDict):
    """One file a step wrote: its path in the artifact folder, digest and size."""

    path: str
    sha256: str
    bytes: int


class EntryRecord(TypedDict):
    """A cache entry (entries/<kk>/<key>.json): what went into a step's key and what it wrote."""

    key: str
    step: str
    kind: str
    ingredients: Mapping[str, object]
    outputs: list[OutputRecord]
    data: dict[str, object]


class Remote(Protocol):
    """What the cache asks of a remote one (remote.RemoteCache, which imports this module)."""

    url: str

    def pull(self, key: str, local: Cache) -> bool: ...

    def push(self, entry: EntryRecord, local: Cache) -> None: ...

    def peek(self, key: str) -> EntryRecord | None: ...

    def verify(self, local: Cache) -> tuple[int, list[str]]: ...


class TamperedError(ValueError):
    """An object's bytes no longer match the digest it is stored under."""


def entry_problem(entry: object, key: str) -> str | None:
    """What makes ``entry`` (parsed JSON from a file, local or remote) unusable, or None.

    Entries are files anyone with write access to a cache can edit: every field a reader
    uses is checked for its type here, so a damaged one is a miss, never a crash.
    """
    if not isinstance(entry, dict):
        return f"not a JSON object ({type(entry).__name__})"
    if entry.get("key") != key:
        return "key mismatch"
    outputs = entry.get("outputs")
    if not isinstance(outputs, list):
        return "outputs is not a list"
    for out in outputs:
        if (
            not isinstance(out, dict)
            or not isinstance(out.get("sha256"), str)
            or not isinstance(out.get("bytes"), int)
            or isinstance(out.get("bytes"), bool)
        ):
            return "an output is not {path, sha256, bytes}"
        if len(out["sha256"]) != 64 or any(c not in "0123456789abcdef" for c in out["sha256"]):
            return f"output digest {str(out['sha256'])[:16]!r} is not a sha256"
        # Entries may come from a shared remote cache: a path must stay in its artifact folder.
        if not _plain_relative(out.get("path")):
            return f"output path {out.get('path')!r} leads out of the artifact folder"
    for field_name, kind in (("data", dict), ("ingredients", dict), ("step", str), ("kind", str)):
        if not isinstance(entry.get(field_name), kind):
            return f"{field_name} is not a {kind.__name__}"
    return None


def checked_entry(entry: JsonValue, key: str) -> EntryRecord:
    """``entry`` as an EntryRecord once ``entry_problem`` finds nothing wrong; else a ValueError naming it."""
    wrong = entry_problem(entry, key)
    if wrong:
        raise ValueError(wrong)
    return cast(EntryRecord, entry)  # entry_problem checked the type of every field EntryRecord names


def read_json(text: str | bytes) -> JsonValue:
    """JSON from a cache file; a file nested too deep to parse is a ValueError like any other damage."""
    try:
        value: JsonValue = json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    return value


TAG_NAME = "CACHEDIR.TAG"
TAG = (
    "Signature: 8a477f597d28d172789f06886806bc55\n# This folder is an onnxbuild cache (https://bford.info/cachedir/).\n"
)
"""The Cache Directory Tagging mark: written in a cache folder onnxbuild creates, so it only
ever deletes inside folders it made (backup tools skip it too)."""
SUBFOLDERS = ("objects", "entries", "tmp", "locks", "last", "state")


def tagged(root: Path) -> bool:
    """Whether ``root`` is a cache onnxbuild made (it holds the tag): the only folder it writes
    state or memos into, or deletes inside."""
    return (root / TAG_NAME).is_file()


def step_key(ingredients: Mapping[str, object]) -> str:
    """The cache key: sha256 of the canonical JSON of everything that can change a step's output."""
    return sha256_text(canonical_json(ingredients))


@dataclass
class Cache:
    """The local content-addressed cache: entries by step key, objects by digest, scratch space,
    and the lock that keeps ``gc`` and ``clean`` from removing what a running build uses.
    It only ever deletes what it created, never through a link."""

    root: Path
    warn: Callable[[str], None] = lambda message: None

    remote: Remote | None = None
    """A RemoteCache consulted on a local miss and given every new entry (see remote.py)."""

    pulled: set[str] = field(default_factory=set)
    """Keys this process took from the remote cache (for "pulled" in the build's output)."""

    dry: bool = False
    """Planning: a damaged entry is a miss, but left in place, and a remote entry is only
    looked at, not pulled (``plan`` changes and downloads nothing)."""

    remote_only: set[str] = field(default_factory=set)
    """Keys a dry cache found in the remote cache only (``make`` would pull them)."""

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self._hashes: dict[str, list[JsonValue]] | None = None
        self._hashes_dirty = False
        self.versions = Versions(self.root / "state" / "versions.json")
        """Package versions for keys, remembered in state/versions.json (saved by save_state)."""
        self._code: Code | None = None

    # ------------------------------------------------------------ paths

    def object_path(self, sha: str) -> Path:
        return self.root / "objects" / sha[:2] / sha

    def entry_path(self, key: str) -> Path:
        return self.root / "entries" / key[:2] / f"{key}.json"

    def lock(self, name: str, what: str = "", *, shared: bool = False) -> FileLock:
        return FileLock(self.root / "locks" / f"{name}.lock", what=what or name, shared=shared)

    def maintenance_lock(self, *, shared: bool) -> FileLock:
        """Builds hold it shared while they use the cache; ``gc`` and ``cache verify`` hold it
        alone, so they never delete an entry a running build is about to link."""
        return self.lock("gc", what="the cache (a build, gc or verify)", shared=shared)

    def ensure_writable(self) -> None:
        try:
            if not self.root.exists() or (self.root.is_dir() and not any(self.root.iterdir())):
                self.root.mkdir(parents=True, exist_ok=True)
                (self.root / TAG_NAME).write_text(TAG, encoding="utf-8")
            self.ensure_own()
            for sub in SUBFOLDERS:
                (self.root / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(
                f"cannot create the cache at {self.root} ({exc.strerror or exc}); "
                "pass --cache-dir or set ONNXBUILD_CACHE_DIR to a writable folder"
            ) from None

    def ensure_own(self) -> None:
        """Refuse a cache folder onnxbuild did not make, or one whose subfolders lead elsewhere.

        Building, ``gc`` and ``cache verify`` delete inside objects/, entries/ and tmp/; a
        folder someone else owns (``ONNXBUILD_CACHE_DIR=$HOME``) or a subfolder that is a
        symbolic link (a cloned repository can carry one) would make them delete other files.
        An untagged folder is taken only while nothing in it could be someone else's: empty, or
        onnxbuild's own subfolders with nothing inside but lock files. A look-alike (``tmp/`` and
        ``objects/`` holding files, no tag) is refused: its names prove nothing about its owner.
        """
        if not self.root.is_dir():
            return
        if not tagged(self.root):
            # the tag may appear between the two looks: another build creating this same cache
            # (mkdir, then the tag) at once; that one made it, so it is ours
            others = sorted(p.name for p in self.root.iterdir() if p.name not in SUBFOLDERS and p.name != TAG_NAME)
            for sub in SUBFOLDERS:
                folder = self.root / sub
                if folder.is_dir() and not folder.is_symlink():
                    others += sorted(
                        f"{sub}/{p.name}"
                        for p in folder.iterdir()
                        if not (sub == "locks" and p.suffix == ".lock" and p.is_file())
                    )
            if others and not tagged(self.root):
                raise CacheError(
                    f"{self.root} is not an onnxbuild cache (no {TAG_NAME}, "
                    f"and it holds {', '.join(others[:3])}{', ...' if len(others) > 3 else ''}); "
                    "onnxbuild deletes inside its cache, so it uses only a new or empty folder: "
                    "pass another --cache-dir or ONNXBUILD_CACHE_DIR"
                )
            try:
                (self.root / TAG_NAME).write_text(TAG, encoding="utf-8")
            except OSError:
                pass  # a read-only cache: nothing will be deleted in it either
        for sub in SUBFOLDERS:
            if (self.root / sub).is_symlink():
                raise CacheError(
                    f"{self.root / sub} is a symbolic link; onnxbuild deletes inside its cache folders and never "
                    "follows links: remove the link (onnxbuild makes the folder again)"
                )

    # ------------------------------------------------------------ entries

    def get(self, key: str) -> EntryRecord | None:
        """The entry for ``key`` if it is whole; a damaged one is a miss with a warning.

        On a local miss, a configured remote cache is asked, and what it has is pulled
        (digests checked) into the local cache first.
        """
        path = self.entry_path(key)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            if self.remote is not None and self.dry:
                peeked: EntryRecord | None = self.remote.peek(key)
                if peeked is not None:
                    self.remote_only.add(key)
                return peeked
            if self.remote is not None and self.remote.pull(key, self):
                self.pulled.add(key)
                return self.get(key)
            return None
        except (OSError, ValueError) as exc:  # a folder, unreadable, not UTF-8
            self.warn(f"cache entry {key[:12]} cannot be read ({exc.__class__.__name__}); rebuilding")
            if not self.dry:
                _remove(path)  # even a folder: it sits where this cache's own file belongs
            return None
        try:
            entry = checked_entry(read_json(text), key)
            for out in entry["outputs"]:
                st = os.stat(self.object_path(out["sha256"]))
                if st.st_size != out["bytes"]:
                    raise ValueError(f"{out['path']} has {st.st_size} bytes, expected {out['bytes']}")
            for out in entry["outputs"]:
                # Re-read only when the object's inode, size or mtime moved since it
                # was last hashed: an unchanged cache costs a stat per object, an edited
                # object (say, through a hard-linked artifact) is caught here.
                obj = self.object_path(out["sha256"])
                if self.file_digest(obj) != out["sha256"]:
                    self._drop(obj)
                    raise TamperedError(f"{out['path']} no longer matches its digest (modified in place?)")
        except FileNotFoundError:
            self.warn(f"cache entry {key[:12]} refers to a missing object; rebuilding")
            self._drop(path)
            return None
        except TamperedError as exc:
            self.warn(f"cache entry {key[:12]}: {exc}; discarded, rebuilding")
            self._drop(path)
            return None
        except (ValueError, KeyError, TypeError) as exc:
            self.warn(f"cache entry {key[:12]} is damaged ({exc}); rebuilding")
            self._drop(path)
            return None
        return entry

    def _drop(self, path: Path) -> None:
        if self.dry:
            return
        with contextlib.suppress(OSError):
            path.unlink()

    def discard(self, key: str) -> None:
        self._drop(self.entry_path(key))

    def commit(
        self,
        key: str,
        step: str,
        kind: str,
        ingredients: Mapping[str, object],
        workdir: Path,
        files: Iterable[str],
        data: dict[str, object],
        *,
        keep: bool = True,
    ) -> EntryRecord:
        """Move a step's output files into the object store, then write its entry (the commit
        point); with ``keep=False`` no entry is written or pushed: the objects serve this build's
        artifacts only (``gc`` drops them once no artifact names them)."""
        outputs: list[OutputRecord] = []
        for rel in sorted(set(files)):
            src = workdir / rel
            sha = sha256_file(src)
            size = src.stat().st_size
            dest = self.object_path(sha)
            if dest.exists() and dest.stat().st_size == size:
                src.unlink()
            else:
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.chmod(src, 0o444)
                os.replace(src, dest)
            self.remember_hash(dest, sha)
            outputs.append({"path": rel, "sha256": sha, "bytes": size})
            if len(outputs) == 1:
                pause_for_tests("cache-write", step)  # one object stored, the rest still in scratch, no entry yet
        entry: EntryRecord = {
            "key": key,
            "step": step,
            "kind": kind,
            "ingredients": ingredients,
            "outputs": outputs,
            "data": data,
        }
        if not keep:
            self.discard(key)  # an entry an earlier build kept is not this build's figures
            return entry
        atomic_write_text(self.entry_path(key), pretty_json(entry))
        if self.remote is not None:
            try:
                self.remote.push(entry.copy(), self)
            except OSError as exc:
                self.warn(
                    f"could not push {step} to the remote cache {self.remote.url} ({exc}); "
                    "the local build is unaffected"
                )
        return entry

    # ------------------------------------------------------------ last builds (plan's memory)

    def last_build(self, recipe: str) -> dict[str, Mapping[str, object]]:
        """The recipe's last build, step by step; anything damaged is forgotten (only reasons suffer)."""
        try:
            data = read_json((self.root / "last" / f"{recipe}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {k: v for k, v in data.items() if isinstance(v, dict)}

    def record_last_build(self, recipe: str, steps: Mapping[str, object]) -> None:
        path = self.root / "last" / f"{recipe}.json"
        text = pretty_json(steps)
        try:
            if path.read_text(encoding="utf-8") == text:
                return
        except (OSError, ValueError):
            pass
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)  # a folder where our file belongs: ours to replace
        atomic_write_text(path, text)

    # ------------------------------------------------------------ scratch space

    def scratch(self) -> Path:
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=self.root / "tmp"))

    def clean_scratch(self) -> None:
        """Remove scratch folders of processes that no longer exist (builds that were killed)."""
        self.ensure_own()
        tmp = self.root / "tmp"
        if not tmp.is_dir() or tmp.is_symlink():
            return
        for child in tmp.iterdir():
            pid = child.name.split("-", 1)[0].removeprefix("pull-")
            if pid.isdigit() and process_alive(int(pid)):
                continue
            _remove(child)
        # atomic writes killed before their rename (entries, last builds, state)
        for path in [
            *_children(self.root / "entries", 2),
            *_children(self.root / "last", 1),
            *_children(self.root / "state", 1),
        ]:
            owner = temp_owner(path.name)
            if owner is not None and not process_alive(owner):
                _remove(path)

    # ------------------------------------------------------------ file hashing with a stat cache

    def file_digest(self, path: Path) -> str:
        """sha256 of a file, re-read only when its inode, size or mtime changed.

        Not ctime: every hard link made to stage an input or materialise an artifact
        changes it, and re-hashing a 650 MB model after each would cost seconds.
        """
        st = os.stat(path)
        sig = [st.st_ino, st.st_size, st.st_mtime_ns]
        hashes = self._load_hashes()
        key = str(Path(path).resolve())
        known = hashes.get(key)
        if known and known[:3] == sig:
            return str(known[3])
        sha = sha256_file(path)
        hashes[key] = [*sig, sha]
        self._hashes_dirty = True
        return sha

    def remember_hash(self, path: Path, sha: str) -> None:
        st = os.stat(path)
        self._load_hashes()[str(Path(path).resolve())] = [st.st_ino, st.st_size, st.st_mtime_ns, sha]
        self._hashes_dirty = True

    def tree_digest(self, folder: Path) -> str:
        """Digest of a folder: its files' relative paths and contents (hidden files ignored)."""
        listing = {}
        for p in sorted(folder.rglob("*")):
            rel = p.relative_to(folder)
            if p.is_file() and not any(part.startswith(".") for part in rel.parts):
                listing[rel.as_posix()] = self.file_digest(p)
        return sha256_text(canonical_json(listing))

    def _load_hashes(self) -> dict[str, list[JsonValue]]:
        if self._hashes is None:
            try:
                data = read_json((self.root / "state" / "hashes.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                data = {}
            # only a speed-up: keep the well-formed rows of a damaged file
            self._hashes = (
                {k: v for k, v in data.items() if isinstance(v, list) and len(v) == 4} if isinstance(data, dict) else {}
            )
        return self._hashes

    def code(self, entries: Iterable[str], stops: Iterable[str]) -> dict[str, str]:
        """Module -> digest of the onnxbuild code that ``entries`` can execute, less ``stops``
        (``onnxbuild.engine.codekeys``), its parses memoised in state/code.json."""
        if self._code is None:
            from onnxbuild.engine.codekeys import Code

            self._code = Code(memo=self.root / "state" / "code.json")
        return self._code.reach(entries, stops)

    def save_state(self) -> None:
        if not tagged(self.root):
            return  # a plan before the first build: the folder is not made yet (nor ours to write in)
        self.versions.save()
        if self._code is not None:
            self._code.save()
        if self._hashes_dirty and self._hashes is not None:
            with contextlib.suppress(OSError):  # only a speed-up; losing it costs a re-hash
                atomic_write_text(self.root / "state" / "hashes.json", canonical_json(self._hashes))
            self._hashes_dirty = False

    # ------------------------------------------------------------ maintenance

    def verify(self) -> tuple[int, list[str]]:
        """Re-hash every object of every entry (ignoring the stat cache); drop what fails.

        Returns (entries checked, descriptions of what was dropped).
        """
        self.ensure_own()
        dropped: list[str] = []
        checked = 0
        for path in self._entry_files():
            checked += 1
            try:
                entry = checked_entry(read_json(path.read_text(encoding="utf-8")), path.stem)
                bad = [
                    o
                    for o in entry["outputs"]
                    if not _regular(self.object_path(o["sha256"]))
                    or sha256_file(self.object_path(o["sha256"])) != o["sha256"]
                ]
            except (OSError, ValueError) as exc:
                dropped.append(f"entry {path.stem[:12]}: unreadable ({exc})")
                _remove(path)
                continue
            if bad:
                for o in bad:
                    self._drop(self.object_path(o["sha256"]))
                names = ", ".join(o["path"] for o in bad)
                dropped.append(
                    f"entry {path.stem[:12]} ({entry.get('step', '?')}): {names} missing or not matching its digest"
                )
                self._drop(path)
        self._hashes = {}
        self._hashes_dirty = True
        self.save_state()
        return checked, dropped

    def _entry_files(self) -> list[Path]:
        """Every entry file, never through a symbolic link."""
        return [p for p in _children(self.root / "entries", 2) if p.name.endswith(".json")]

    def gc(self, keep_keys: set[str], keep_objects: set[str]) -> tuple[int, int]:
        """Delete entries not in ``keep_keys`` and objects no kept entry or artifact refers to."""
        self.ensure_own()
        freed = removed = 0
        live = set(keep_objects)
        for path in self._entry_files():
            if path.stem in keep_keys:
                entry = self.get(path.stem)
                if entry:
                    live.update(o["sha256"] for o in entry["outputs"])
                continue
            freed += _size(path)
            _remove(path)
            removed += 1
        for path in _children(self.root / "objects", 2):
            if path.name not in live:
                freed += _size(path)
                _remove(path)
                removed += 1
        for path in _children(self.root / "locks", 1):
            # a key lock nobody holds is only a leftover; taking it proves nobody does
            if path.name.startswith("key-") and path.name.endswith(".lock"):
                lock = FileLock(path)
                if lock.try_acquire():
                    _remove(path)
                    lock.release()
        return removed, freed


def _children(folder: Path, depth: int) -> list[Path]:
    """Entries ``depth`` levels below ``folder``, sorted; a symbolic link is listed, never entered."""
    level = [folder] if folder.is_dir() and not folder.is_symlink() else []
    for _ in range(depth):
        below: list[Path] = []
        for parent in level:
            with contextlib.suppress(OSError):
                below.extend(sorted(parent.iterdir()))
        level = below if _ == depth - 1 else [p for p in below if p.is_dir() and not p.is_symlink()]
    return level


def _remove(path: Path) -> None:
    """Delete a file, a link (never its target) or a folder of ours, ignoring what is already gone."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink()
    except FileNotFoundError:
        pass
    except OSError:
        pass


def _size(path: Path) -> int:
    try:
        return path.lstat().st_size
    except OSError:
        return 0


def _regular(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def _plain_relative(path: object) -> bool:
    """Whether ``path`` names a file below a folder: relative, no ``..``, not the folder itself."""
    if not isinstance(path, str):
        return False
    parts = PurePosixPath(path).parts
    return bool(parts) and not PurePosixPath(path).is_absolute() and ".." not in parts


def process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

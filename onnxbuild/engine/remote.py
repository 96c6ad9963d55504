"""A remote cache shared by machines (CI runners, colleagues), through fsspec.

Any fsspec URL works: ``file:///shared/cache``, ``s3://bucket/onnxbuild``, ``gs://...``,
``memory://`` (tests). The layout mirrors the local cache (``objects/ab/<sha>``,
``entries/12/<key>.json``). Objects are pulled into the local cache only after their
sha256 is checked, so a tampered remote cannot inject bytes; an entry is pushed after
its objects, under a temporary name then moved, so readers never see half an entry.
Concurrent pushes of one key write identical content-addressed bytes, so the race is
harmless. ``read_only`` pulls but never pushes (for untrusted pull-request builds).
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

from onnxbuild.errors import CacheError


class RemoteCache:
    """A shared cache behind an fsspec URL (file://, s3://, gs://, ...): entries and objects as in the
    local cache, every object checked against its digest (and, with keys configured, its
    signature) before use; a corrupt remote object is replaced on the next push."""

    def __init__(self, url: str, *, read_only: bool = False, signer: Any = None, verifier: Any = None) -> None:
        try:
            import fsspec
        except ImportError:  # pragma: no cover - fsspec is a dependency
            raise CacheError("a remote cache needs fsspec: pip install fsspec") from None
        try:
            self.fs, self.base = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as exc:
            raise CacheError(
                f"cannot use the remote cache {url!r}: {exc} (for s3:// install s3fs, for gs:// gcsfs)"
            ) from None
        self.url = url
        self.read_only = read_only
        self.base = self.base.rstrip("/")
        self.signer = signer
        """Signs each pushed entry (engine/signing.py); None: pushes are unsigned."""
        self.verifier = verifier
        """Refuses remote entries without a trusted signature; None: any consistent entry is taken."""
        self.damaged: set[str] = set()
        """Remote entries and objects found damaged this run: the next good build replaces them."""

    def _entry(self, key: str) -> str:
        return f"{self.base}/entries/{key[:2]}/{key}.json"

    def _object(self, sha: str) -> str:
        return f"{self.base}/objects/{sha[:2]}/{sha}"

    def pull(self, key: str, local: Any) -> bool:
        """Copy entry ``key`` and its objects into ``local`` (a Cache); False if the remote lacks it."""
        from onnxbuild.engine.cache import entry_problem, read_json

        if key in self.damaged:
            return False  # said once already; the build replaces it
        try:
            raw = self.fs.cat_file(self._entry(key))
            text = raw.decode("utf-8")
            entry = read_json(text)
        except FileNotFoundError:
            return False
        except (OSError, ValueError) as exc:
            local.warn(f"remote cache entry {key[:12]} is unreadable ({type(exc).__name__}); building instead")
            self.damaged.add(key)
            return False
        wrong = entry_problem(entry, key)
        if not wrong and self.verifier is not None:
            try:
                signature = self.fs.cat_file(self._entry(key) + ".sig")
            except (OSError, FileNotFoundError):
                signature = b""
            if not self.verifier.valid(raw, signature):
                local.warn(f"remote cache entry {key[:12]} is not signed by a trusted key; building instead")
                self.damaged.add(key)  # a signed build replaces it
                return False
        if wrong:
            local.warn(f"remote cache entry {key[:12]} is damaged ({wrong}); building instead")
            self.damaged.add(key)
            return False
        outputs = entry["outputs"]
        for o in outputs:
            dest = local.object_path(o["sha256"])
            if dest.is_file() and dest.stat().st_size == o["bytes"]:
                continue
            tmp = local.root / "tmp" / f"pull-{os.getpid()}-{uuid.uuid4().hex}"
            tmp.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.fs.get_file(self._object(o["sha256"]), str(tmp))
                digest = _sha256(tmp)
                if digest != o["sha256"]:
                    local.warn(
                        f"remote cache object for {o['path']} does not match its digest; "
                        f"ignoring the remote entry {key[:12]}"
                    )
                    self.damaged.update((key, o["sha256"]))
                    return False
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.chmod(tmp, 0o444)
                os.replace(tmp, dest)
                local.remember_hash(dest, digest)
            except FileNotFoundError:
                local.warn(f"remote cache entry {key[:12]} refers to a missing object; building instead")
                self.damaged.add(key)
                return False
            finally:
                if tmp.exists():
                    tmp.unlink()
        from onnxbuild._util import atomic_write_text

        atomic_write_text(local.entry_path(key), text)
        return True

    def push(self, entry: dict[str, Any], local: Any) -> None:
        if self.read_only:
            return
        key = entry["key"]
        if key not in self.damaged and self.fs.exists(self._entry(key)):
            return
        for o in entry["outputs"]:
            target = self._object(o["sha256"])
            if o["sha256"] in self.damaged or not self.fs.exists(target):
                self._put_atomically(str(local.object_path(o["sha256"])), target)
        data = json.dumps(entry, sort_keys=True, indent=2).encode("utf-8")
        self.fs.makedirs(self._entry(key).rsplit("/", 1)[0], exist_ok=True)
        if self.signer is not None:  # the signature first: a reader never sees a signed key without it
            sig_tmp = f"{self._entry(key)}.sig.{uuid.uuid4().hex}.tmp"
            self.fs.pipe_file(sig_tmp, self.signer.sign(data))
            self.fs.mv(sig_tmp, self._entry(key) + ".sig")
        tmp = f"{self._entry(key)}.{uuid.uuid4().hex}.tmp"
        self.fs.pipe_file(tmp, data)
        self.fs.mv(tmp, self._entry(key))

    def peek(self, key: str) -> dict[str, Any] | None:
        """The remote entry for ``key`` if it is whole and (when signing is on) trusted; no
        object is downloaded, so ``plan`` can say "make pulls it" without pulling."""
        from onnxbuild.engine.cache import entry_problem, read_json

        if key in self.damaged:
            return None
        try:
            raw = self.fs.cat_file(self._entry(key))
            entry = read_json(raw.decode("utf-8"))
        except (OSError, ValueError):
            return None
        if entry_problem(entry, key):
            return None
        if self.verifier is not None:
            try:
                signature = self.fs.cat_file(self._entry(key) + ".sig")
            except OSError:
                return None
            if not self.verifier.valid(raw, signature):
                return None
        result: dict[str, Any] = entry
        return result

    def verify(self, local: Any) -> tuple[int, list[str]]:
        """Re-read every remote entry and the objects it names; repair what the local cache
        holds good copies of (objects re-pushed, entries re-pushed), drop what it cannot.

        Returns (entries checked, one line per problem found and what was done). Read-only
        remotes are only checked.
        """
        from onnxbuild.engine.cache import entry_problem, read_json

        problems: list[str] = []
        paths = sorted(self.fs.glob(f"{self.base}/entries/*/*.json"))
        for path in paths:
            key = path.rsplit("/", 1)[1].removesuffix(".json")
            try:
                raw = self.fs.cat_file(path)
                entry = read_json(raw.decode("utf-8"))
                wrong = entry_problem(entry, key)
            except (OSError, ValueError) as exc:
                wrong = f"unreadable ({type(exc).__name__})"
                entry = None
            if wrong or entry is None:
                mine = local.get(key) if local is not None else None
                done = self._repair_entry(key, mine, local)
                problems.append(f"entry {key[:12]}: {wrong}; {done}")
                continue
            for o in entry["outputs"]:
                tmp = local.root / "tmp" / f"verify-{os.getpid()}-{uuid.uuid4().hex}"
                tmp.parent.mkdir(parents=True, exist_ok=True)
                try:
                    self.fs.get_file(self._object(o["sha256"]), str(tmp))
                    ok = _sha256(tmp) == o["sha256"]
                    why = "does not match its digest"
                except FileNotFoundError:
                    ok, why = False, "is missing"
                finally:
                    if tmp.exists():
                        tmp.unlink()
                if ok:
                    continue
                good = local.object_path(o["sha256"])
                if self.read_only:
                    done = "left as is (--cache-read-only)"
                elif good.is_file() and _sha256(good) == o["sha256"]:
                    self._put_atomically(str(good), self._object(o["sha256"]))
                    done = "re-pushed from the local cache"
                else:
                    self.fs.rm(path)
                    done = "entry removed (no good copy here; the next build pushes it again)"
                problems.append(f"object {o['sha256'][:12]} ({o['path']} of entry {key[:12]}) {why}; {done}")
                break
        return len(paths), problems

    def _repair_entry(self, key: str, mine: Any, local: Any) -> str:
        if self.read_only:
            return "left as is (--cache-read-only)"
        if mine is not None:
            self.damaged.add(key)
            self.push(dict(mine), local)
            return "re-pushed from the local cache"
        self.fs.rm(self._entry(key))
        return "removed (no good copy here; the next build pushes it again)"

    def get_object(self, sha: str, dest: Path) -> None:
        """Copy object ``sha`` to ``dest``, refusing bytes that do not hash to it."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.part")
        try:
            self.fs.get_file(self._object(sha), str(tmp))
        except FileNotFoundError:
            raise CacheError(
                f"the remote cache {self.url} has no object {sha[:12]} (pushed by another node?)"
            ) from None
        if _sha256(tmp) != sha:
            tmp.unlink()
            raise CacheError(f"remote cache object {sha[:12]} does not match its digest; refusing it")
        os.replace(tmp, dest)

    def put_object(self, path: Path) -> str:
        """Push one file as a content-addressed object; returns its sha256."""
        sha = _sha256(path)
        target = self._object(sha)
        if not self.fs.exists(target):
            self._put_atomically(str(path), target)
        return sha

    def _put_atomically(self, source: str, target: str) -> None:
        tmp = f"{target}.{uuid.uuid4().hex}.tmp"
        self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        self.fs.put_file(source, tmp)
        self.fs.mv(tmp, target)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def config_from_project(start: Path) -> dict[str, Any]:
    """``[tool.onnxbuild]`` from pyproject.toml, or onnxbuild.toml, in ``start`` (the project root)."""
    try:
        import tomllib  # type: ignore[import-not-found,unused-ignore]  # stdlib from 3.11
    except ImportError:  # Python 3.10
        return {}
    for name, table in (("onnxbuild.toml", None), ("pyproject.toml", ("tool", "onnxbuild"))):
        path = start / name
        if not path.is_file():
            continue
        try:
            data: Any = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CacheError(f"{path}: cannot read it as TOML ({exc})") from None
        for part in table or ():
            data = data.get(part, {}) if isinstance(data, dict) else {}
        if data:
            return dict(data)
    return {}

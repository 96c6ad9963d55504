"""A remote cache shared by machines (CI runners, colleagues), through fsspec.

Any fsspec URL works: ``file:///shared/cache``, ``s3://bucket/onnxbuild``, ``gs://...``,
``memory://`` (tests). The layout mirrors the local cache (``objects/ab/<sha>``,
``entries/12/<key>.json``). Objects are pulled into the local cache only after their
sha256 is checked, so a tampered remote cannot inject bytes. ``read_only`` pulls but never
pushes (for untrusted pull-request builds).

Writes depend on the store. On a file system an object or entry is written under a
temporary name and renamed, so readers never see half of one. On S3 a rename is a copy and a
delete, so each object goes straight to its content-addressed key with ``If-None-Match: *``:
S3 never shows a half-written object, a second writer of the same key gets 412 (counted as
done: the bytes are the same by construction), and a server that ignores the condition
overwrites with the same bytes. An entry is written last, the same way, so a reader who finds
it finds its objects. A signed entry travels with its signature in one object (an envelope),
so two runners pushing different bytes for one key cannot leave one's entry beside the other's
signature. A bucket is never created (a mistyped URL is an error at start, not a
new bucket), and nothing is decided from a listing: exact-key reads only.

One module (~500 lines): one class, whose pull, push, peek and verify share the store's
write rules above (conditional or renamed writes, the envelope, exact-key reads); split
apart, each half would need the other's private helpers.

Options for the store (``endpoint_url``, ``region_name``, ``profile``...) come from
``[tool.onnxbuild] cache_options`` and the ``ONNXBUILD_CACHE_OPTIONS`` environment variable (a
JSON object, over the file's). Credentials are refused in the file, which is committed: they
come from the environment, a profile or an instance role, as boto's own chain finds them.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from onnxbuild.errors import CacheError, UsageError

if TYPE_CHECKING:
    from onnxbuild.engine.cache import Cache, EntryRecord


class FileSystem(Protocol):
    """The few methods of an fsspec filesystem this module calls."""

    def exists(self, path: str) -> bool: ...
    def glob(self, path: str) -> list[str]: ...
    def cat_file(self, path: str, **kwargs: object) -> bytes: ...
    def get_file(self, rpath: str, lpath: str) -> None: ...
    def put_file(self, lpath: str, rpath: str, **kwargs: object) -> None: ...
    def pipe_file(self, path: str, value: bytes, **kwargs: object) -> None: ...
    def makedirs(self, path: str, exist_ok: bool = False) -> None: ...
    def mv(self, path1: str, path2: str) -> None: ...
    def rm(self, path: str) -> None: ...

    # s3fs only: called only where RemoteCache.object_store is set
    def call_s3(self, method: str, **kwargs: object) -> object: ...


class EntrySigner(Protocol):
    """Signs an entry's bytes (signing.Signer)."""

    def sign(self, data: bytes) -> bytes: ...


class EntryVerifier(Protocol):
    """Whether a signature over an entry's bytes is a trusted key's (signing.Verifier)."""

    def valid(self, data: bytes, signature: bytes) -> bool: ...


class RemoteCache:
    """A shared cache behind an fsspec URL (file://, s3://, gs://, ...): entries and objects as in the
    local cache, every object checked against its digest (and, with keys configured, its
    signature) before use; a corrupt remote object is replaced on the next push."""

    def __init__(
        self,
        url: str,
        *,
        read_only: bool = False,
        signer: EntrySigner | None = None,
        verifier: EntryVerifier | None = None,
        options: Mapping[str, object] | None = None,
    ) -> None:
        try:
            import fsspec
        except ImportError:  # pragma: no cover - fsspec is a dependency
            raise CacheError("a remote cache needs fsspec: pip install fsspec") from None
        merged: dict[str, object] = {**(options or {}), **options_from_environment()}
        s3 = url.startswith(("s3://", "s3a://"))
        if s3:
            merged.setdefault("use_listings_cache", False)  # exact-key reads, never a stale listing
        self.fs: FileSystem
        self.base: str
        try:
            self.fs, self.base = fsspec.core.url_to_fs(url, **merged)
        except (ImportError, ValueError, TypeError) as exc:
            raise CacheError(
                f"cannot use the remote cache {url!r}: {exc} (for s3:// pip install 'onnxbuild[s3]', for gs:// gcsfs)"
            ) from None
        self.url = url
        self.read_only = read_only
        self.base = self.base.rstrip("/")
        self.object_store = s3
        """Writes go straight to their keys, conditionally (module docstring), not through a rename."""
        if s3:
            self._check_bucket(merged)
        self.signer = signer
        """Signs each pushed entry (engine/signing.py); None: pushes are unsigned."""
        self.verifier = verifier
        """Refuses remote entries without a trusted signature; None: any consistent entry is taken."""
        self.damaged: set[str] = set()
        """Remote entries and objects found damaged this run: the next good build replaces them."""

    def _check_bucket(self, options: Mapping[str, object]) -> None:
        bucket = self.base.split("/", 1)[0]
        where = f" at {options['endpoint_url']}" if options.get("endpoint_url") else ""
        try:
            found = self.fs.exists(bucket)
        except PermissionError:
            found = True  # may not list or head the bucket, may still read and write keys in it
        except OSError as exc:
            raise CacheError(f"the remote cache {self.url}: cannot reach bucket {bucket!r}{where}: {exc}") from None
        if not found:
            raise UsageError(
                f"the remote cache {self.url}: bucket {bucket!r} does not exist{where}; create it first "
                "(onnxbuild never creates a bucket, so a mistyped URL cannot make a new one)"
            )

    def _entry(self, key: str) -> str:
        return f"{self.base}/entries/{key[:2]}/{key}.json"

    def _object(self, sha: str) -> str:
        return f"{self.base}/objects/{sha[:2]}/{sha}"

    def pull(self, key: str, local: Cache) -> bool:
        """Copy entry ``key`` and its objects into ``local`` (a Cache); False if the remote lacks it."""
        from onnxbuild.engine.cache import checked_entry, entry_problem, read_json

        if key in self.damaged:
            return False  # said once already; the build replaces it
        try:
            raw, signature = _unwrap(self._read(self._entry(key)))
            text = raw.decode("utf-8")
            entry = read_json(text)
        except FileNotFoundError:
            return False
        except (OSError, ValueError) as exc:
            local.warn(f"remote cache entry {key[:12]} is unreadable ({type(exc).__name__}); building instead")
            self.damaged.add(key)
            return False
        wrong = entry_problem(entry, key)
        trusted = (
            bool(wrong) or self.verifier is None or self.verifier.valid(raw, signature or self._legacy_signature(key))
        )
        if not trusted:
            local.warn(f"remote cache entry {key[:12]} is not signed by a trusted key; building instead")
            self.damaged.add(key)  # a signed build replaces it
            return False
        if wrong:
            local.warn(f"remote cache entry {key[:12]} is damaged ({wrong}); building instead")
            self.damaged.add(key)
            return False
        outputs = checked_entry(entry, key)["outputs"]
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

    def push(self, entry: EntryRecord, local: Cache) -> None:
        if self.read_only:
            return
        key = entry["key"]
        if key not in self.damaged and self._exists(self._entry(key)):
            return
        for o in entry["outputs"]:
            target = self._object(o["sha256"])
            if o["sha256"] in self.damaged or not self._exists(target):
                self._put_atomically(str(local.object_path(o["sha256"])), target, replace=o["sha256"] in self.damaged)
        data = json.dumps(entry, sort_keys=True, indent=2).encode("utf-8")
        if self.signer is not None:
            data = _envelope(data, self.signer.sign(data))
        if self.object_store:
            if not self._create(self._entry(key), data=data, replace=key in self.damaged):
                self._same_outputs(key, entry, local)
            return
        self.fs.makedirs(self._entry(key).rsplit("/", 1)[0], exist_ok=True)
        tmp = f"{self._entry(key)}.{uuid.uuid4().hex}.tmp"
        self.fs.pipe_file(tmp, data)
        self.fs.mv(tmp, self._entry(key))

    def peek(self, key: str) -> EntryRecord | None:
        """The remote entry for ``key`` if it is whole and (when signing is on) trusted; no
        object is downloaded, so ``plan`` can say "make pulls it" without pulling."""
        from onnxbuild.engine.cache import checked_entry, read_json

        if key in self.damaged:
            return None
        try:
            raw, signature = _unwrap(self._read(self._entry(key)))
            entry = checked_entry(read_json(raw.decode("utf-8")), key)
        except (OSError, ValueError):  # entry_problem's findings included
            return None
        if not all(self._exists(self._object(o["sha256"])) for o in entry["outputs"]):
            return None  # "make pulls it" only when it can: every object it names is there
        if self.verifier is not None and not self.verifier.valid(raw, signature or self._legacy_signature(key)):
            return None
        return entry

    def verify(self, local: Cache) -> tuple[int, list[str]]:
        """Re-read every remote entry and the objects it names; repair what the local cache
        holds good copies of (objects re-pushed, entries re-pushed), drop what it cannot.

        Returns (entries checked, one line per problem found and what was done). Read-only
        remotes are only checked.
        """
        from onnxbuild.engine.cache import checked_entry, entry_problem, read_json

        problems: list[str] = []
        paths = sorted(self.fs.glob(f"{self.base}/entries/*/*.json"))
        for path in paths:
            key = path.rsplit("/", 1)[1].removesuffix(".json")
            try:
                raw, _ = _unwrap(self._read(path))
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
            for o in checked_entry(entry, key)["outputs"]:
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
                    self._put_atomically(str(good), self._object(o["sha256"]), replace=True)
                    done = "re-pushed from the local cache"
                else:
                    self.fs.rm(path)
                    done = "entry removed (no good copy here; the next build pushes it again)"
                problems.append(f"object {o['sha256'][:12]} ({o['path']} of entry {key[:12]}) {why}; {done}")
                break
        return len(paths), problems

    def _repair_entry(self, key: str, mine: EntryRecord | None, local: Cache) -> str:
        if self.read_only:
            return "left as is (--cache-read-only)"
        if mine is not None:
            self.damaged.add(key)
            self.push(mine.copy(), local)
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

    def put_object(self, path: Path, sha: str | None = None) -> str:
        """Push one file as a content-addressed object; returns its sha256 (``sha``: the caller
        hashed it already)."""
        sha = sha or _sha256(path)
        target = self._object(sha)
        if not self._exists(target):
            self._put_atomically(str(path), target)
        return sha

    def _read(self, path: str) -> bytes:
        """The bytes at key ``path``: on S3 one GET (s3fs first asks for the size, a HEAD and on a
        missing key a listing, to split a large read; entries and signatures are small)."""
        data: bytes = self.fs.cat_file(path, max_concurrency=1) if self.object_store else self.fs.cat_file(path)
        return data

    def _legacy_signature(self, key: str) -> bytes:
        """The signature an earlier onnxbuild pushed beside an entry, as a second object."""
        try:
            return self._read(self._entry(key) + ".sig")
        except OSError:  # FileNotFoundError included: unsigned
            return b""

    def _exists(self, path: str) -> bool:
        """Whether the key ``path`` exists: on S3 one HEAD of that key (s3fs's ``exists`` lists
        the prefix too when the HEAD finds nothing, to find "directories")."""
        if not self.object_store:
            return bool(self.fs.exists(path))
        bucket, key = path.split("/", 1)
        try:
            self.fs.call_s3("head_object", Bucket=bucket, Key=key)
        except FileNotFoundError:
            return False
        return True

    def _create(self, target: str, *, source: str | None = None, data: bytes = b"", replace: bool = False) -> bool:
        """Write ``target`` on an object store in one request, only if it does not exist (or,
        with ``replace``, over a damaged one); False when another writer was first."""
        try:
            if source is not None:
                self.fs.put_file(source, target, mode="overwrite" if replace else "create")
            else:
                self.fs.pipe_file(target, data, mode="overwrite" if replace else "create")
        except FileExistsError:
            return False
        except OSError as exc:  # a 412 that does not say which condition failed
            if "precondition" in str(exc).lower():
                return False
            raise
        return True

    def _same_outputs(self, key: str, entry: EntryRecord, local: Cache) -> None:
        """Another runner wrote ``key`` first: the same outputs, or a step that is not deterministic."""
        from onnxbuild.engine.cache import read_json

        try:
            # another runner's onnxbuild wrote it; not checked: only its outputs are compared, and the cast
            # checks nothing, so a damaged entry of another shape fails below, as before
            theirs = cast("EntryRecord", read_json(_unwrap(self._read(self._entry(key)))[0].decode("utf-8")))
        except (OSError, ValueError):
            return
        mine = {o["path"]: o["sha256"] for o in entry["outputs"]}
        other = {o["path"]: o["sha256"] for o in theirs.get("outputs", [])}
        differ = sorted(p for p in mine.keys() | other.keys() if mine.get(p) != other.get(p))
        if differ:
            shown = "; ".join(
                f"{p}: {str(other.get(p, 'absent'))[:12]} there, {str(mine.get(p, 'absent'))[:12]} here"
                for p in differ[:3]
            )
            local.warn(
                f"non-deterministic step: the remote cache entry {key[:12]} ({entry.get('step', '')}) holds other "
                f"outputs than this build's ({shown}); the remote one is kept"
            )

    def _put_atomically(self, source: str, target: str, *, replace: bool = False) -> None:
        if self.object_store:
            self._create(target, source=source, replace=replace)
            return
        tmp = f"{target}.{uuid.uuid4().hex}.tmp"
        self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        self.fs.put_file(source, tmp)
        self.fs.mv(tmp, target)


ENVELOPE = "onnxbuild-signed-entry/1"


def _envelope(entry: bytes, signature: bytes) -> bytes:
    """A signed entry as one object: the entry's exact bytes (what was signed) and the signature."""
    doc = {"format": ENVELOPE, "entry": entry.decode("utf-8"), "signature": signature.decode("ascii")}
    return json.dumps(doc, sort_keys=True, indent=2).encode("utf-8")


def _unwrap(raw: bytes) -> tuple[bytes, bytes | None]:
    """(the entry's bytes, its signature) from a remote entry object; no signature for a plain entry."""
    from onnxbuild.engine.cache import read_json

    doc = read_json(raw.decode("utf-8"))  # ValueError for damaged bytes (too deep too), as the entry's own parse
    if not isinstance(doc, dict) or doc.get("format") != ENVELOPE:
        return raw, None
    entry, signature = doc.get("entry"), doc.get("signature")
    if not isinstance(entry, str) or not isinstance(signature, str):
        raise ValueError(f"a {ENVELOPE} object without its entry and signature strings")
    return entry.encode("utf-8"), signature.encode("ascii")


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
            # Any: a hand-edited [tool.onnxbuild] that is not a table goes to dict() below as it always has
            # (a list of pairs is taken, anything else raises), which object could not express without changing it
            data: Any = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CacheError(f"{path}: cannot read it as TOML ({exc})") from None
        for part in table or ():
            data = data.get(part, {}) if isinstance(data, dict) else {}
        if data:
            return dict(data)
    return {}


OPTIONS_ENV = "ONNXBUILD_CACHE_OPTIONS"
CREDENTIALS = frozenset(
    {
        "key",
        "secret",
        "token",
        "password",
        "session_token",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        "access_key",
        "secret_key",
    }
)


def options_from_environment() -> dict[str, object]:
    """``ONNXBUILD_CACHE_OPTIONS``: a JSON object of the store's options (may hold credentials:
    the environment is where they belong)."""
    raw = os.environ.get(OPTIONS_ENV, "").strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise UsageError(
            f'{OPTIONS_ENV}: not JSON ({exc}); give an object such as \'{{"endpoint_url": "..."}}\''
        ) from None
    if not isinstance(value, dict):
        raise UsageError(f"{OPTIONS_ENV}: must be a JSON object of the store's options, got {type(value).__name__}")
    return value


def options_from_config(config: Mapping[str, object], where: str) -> dict[str, object]:
    """``cache_options`` from a project's config (``where`` names the file): refused when it holds
    credentials, which a committed file must not."""
    options = config.get("cache_options") or {}
    if not isinstance(options, dict):
        raise UsageError(f'{where}: cache_options must be a table (e.g. cache_options = {{endpoint_url = "..."}})')

    def walk(value: object, path: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if str(k).lower() in CREDENTIALS:
                    raise UsageError(
                        f"{where}: cache_options.{path}{k}: credentials are not read from a config file (it is "
                        "committed); set them in the environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
                        f"{OPTIONS_ENV}), name a profile (cache_options.profile) or use an instance role"
                    )
                walk(v, f"{path}{k}.")

    walk(options, "")
    return dict(options)

"""Signed remote cache entries: only entries signed by a key CI holds are trusted.

Anyone who can write to a shared remote cache can add an entry and objects that are
consistent with each other (the sha256 checks cannot tell). With signing, the job that
pushes (CI on the main branch) holds an Ed25519 private key and pushes each entry with its
signature, one object (engine/remote.py's envelope; a ``<key>.json.sig`` beside a plain entry,
as earlier versions wrote, is still read); every reader configured with
the public key refuses a remote entry without a valid signature and builds the step
itself. Objects need no signature: an entry names them by sha256, checked on pull.

- ``ONNXBUILD_CACHE_SIGNING_KEY``: path of the private key (PEM) of the pushing job;
- ``ONNXBUILD_CACHE_TRUSTED_KEYS``: public keys readers accept, comma-separated
  (base64 of the 32 raw bytes), or ``cache_trusted_keys`` in ``[tool.onnxbuild]``.

``onnxbuild cache keygen FILE`` makes a key pair. Needs the ``cryptography`` package.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from onnxbuild.errors import CacheError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

SIGNING_ENV = "ONNXBUILD_CACHE_SIGNING_KEY"
TRUSTED_ENV = "ONNXBUILD_CACHE_TRUSTED_KEYS"


def _ed25519() -> ModuleType:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise CacheError(
            "signed remote cache entries need the cryptography package: pip install cryptography"
        ) from None
    return ed25519


def keygen(path: Path) -> str:
    """Write a new private key to ``path`` (mode 0600, never overwritten); returns the public key."""
    from cryptography.hazmat.primitives import serialization

    key = _ed25519().Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise CacheError(f"{path} exists; onnxbuild never overwrites a key: choose another file") from None
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    return public_text(key)


def public_text(key: Ed25519PrivateKey) -> str:
    from cryptography.hazmat.primitives import serialization

    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


class Signer:
    """Signs remote cache entries with an Ed25519 private key (ONNXBUILD_SIGNING_KEY)."""

    def __init__(self, path: Path) -> None:
        from cryptography.hazmat.primitives import serialization

        try:
            key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
        except (OSError, ValueError) as exc:
            raise CacheError(
                f"{SIGNING_ENV}: cannot read an Ed25519 private key from {path} ({exc}); "
                "make one with `onnxbuild cache keygen FILE`"
            ) from None
        if not isinstance(key, _ed25519().Ed25519PrivateKey):
            raise CacheError(
                f"{SIGNING_ENV}: {path} is not an Ed25519 key; make one with `onnxbuild cache keygen FILE`"
            )
        self.key = key

    def sign(self, data: bytes) -> bytes:
        return base64.b64encode(self.key.sign(data))


class Verifier:
    """Accepts a remote entry only when one of the trusted Ed25519 public keys signed it."""

    def __init__(self, keys: list[str]) -> None:
        ed = _ed25519()
        self.keys = []
        for text in keys:
            try:
                self.keys.append(ed.Ed25519PublicKey.from_public_bytes(base64.b64decode(text.strip(), validate=True)))
            except ValueError as exc:
                raise CacheError(
                    f"{TRUSTED_ENV}: {text.strip()[:20]!r} is not a base64 Ed25519 public key ({exc}); "
                    "`onnxbuild cache keygen` prints one"
                ) from None

    def valid(self, data: bytes, signature: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature

        try:
            raw = base64.b64decode(signature.strip(), validate=True)
        except ValueError:
            return False
        for key in self.keys:
            try:
                key.verify(raw, data)
                return True
            except InvalidSignature:
                continue
        return False


def from_environment(config: Mapping[str, object]) -> tuple[Signer | None, Verifier | None]:
    """The signer and verifier the environment (or ``[tool.onnxbuild]``) asks for, if any."""
    signing = os.environ.get(SIGNING_ENV)
    trusted = os.environ.get(TRUSTED_ENV)
    configured = [] if trusted else config.get("cache_trusted_keys", [])
    if not isinstance(configured, Iterable):
        # a TOML number, boolean or date where a list of keys belongs: the error iterating it always raised
        raise TypeError(f"'{type(configured).__name__}' object is not iterable")
    keys = [k for k in (trusted.split(",") if trusted else configured) if k.strip()]
    return (Signer(Path(signing)) if signing else None), (Verifier(keys) if keys else None)

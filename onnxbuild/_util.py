"""Small helpers shared by the engine and the steps: canonical JSON, hashing, atomic writes."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Container
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeAlias

if TYPE_CHECKING:
    from collections.abc import Iterator

    import onnx
    from numpy.typing import ArrayLike

CHUNK = 1 << 20

JsonValue: TypeAlias = bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"] | None
"""What ``json.loads`` can return: the type of a cache, lock, report or recipe document before it is checked."""


def canonical_json(data: object) -> str:
    """JSON that is identical for equal data: sorted keys, no whitespace, no NaN."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def pretty_json(data: object) -> str:
    """Stable, reviewable JSON for files people read and diff (sorted keys, trailing newline)."""
    return json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_text(text: str) -> str:
    return sha256_bytes(text.encode("utf-8"))


def sha256_file(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def atomic_write_bytes(
    path: str | os.PathLike[str], data: bytes, before_replace: Callable[[], None] | None = None
) -> None:
    """Write ``data`` so that readers see either the old file or the whole new one.

    ``before_replace`` runs once the temporary file is complete (a test hook's pause point).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # The process id in the name lets a later build delete what a killed one left (temp_owner).
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}-", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes 0600 files; manifests, reports and cache entries are for every reader
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def write_if_changed(path: str | os.PathLike[str], text: str, before_replace: Callable[[], None] | None = None) -> bool:
    """Atomically write ``text`` unless the file already holds exactly it; True if written."""
    import stat

    data = text.encode("utf-8")
    try:
        st = os.lstat(path)
        # compare only with a regular file of the same size: a FIFO or device would block or never end
        if stat.S_ISREG(st.st_mode) and st.st_size == len(data) and Path(path).read_bytes() == data:
            return False
    except OSError:
        pass
    atomic_write_bytes(path, data, before_replace)
    return True


def format_ms(ms: float | None) -> str:
    """A latency for people: microseconds below a millisecond, so 0.3 ms never prints as "0.0 ms"."""
    if ms is None:
        return "-"
    if ms < 1.0:
        us = ms * 1000.0
        return f"{us:.3g} µs" if us >= 10 else f"{us:.2f} µs"
    return f"{ms:.2f} ms" if ms < 100 else f"{ms:.0f} ms"


def brief(exc: BaseException, *, lines: int | None = 1, limit: int = 300) -> str:
    """An exception as one line of a user-facing message: its first non-blank ``lines``
    (all when None) joined by spaces, cut at ``limit``; its type's name when it says nothing."""
    text = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return " ".join(text[:lines] if lines is not None else text)[:limit] or type(exc).__name__


def format_duration(seconds: float) -> str:
    """An estimate for people: "about 40 s", "about 3 min 5 s"."""
    if seconds < 1:
        return "under a second"
    return f"about {seconds:.0f} s" if seconds < 60 else f"about {int(seconds // 60)} min {seconds % 60:.0f} s"


def read_regular_text(path: str | os.PathLike[str], *, limit: int) -> str:
    """A text file's contents, refusing what is not a regular file (a FIFO would block,
    /dev/zero never ends) and files over ``limit`` bytes: raises OSError or ValueError."""
    import stat

    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path} is not a regular file")
        if st.st_size > limit:
            raise ValueError(f"{path} is larger than {limit} bytes")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    return data.decode("utf-8")


def temp_owner(name: str) -> int | None:
    """The process that wrote a temporary file named ``.<file>.<pid>.tmp`` or
    ``.<file>.<pid>-<random>.tmp`` (see atomic_write_bytes), or None for other names."""
    if not (name.startswith(".") and name.endswith(".tmp")):
        return None
    pid = name[: -len(".tmp")].rsplit(".", 1)[-1].split("-", 1)[0]
    return int(pid) if pid.isdigit() else None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def pick(section: Any, keep: Container[str]) -> Any:
    """The keys of ``section`` named in ``keep``, as a mapping of the same type (a step's key
    holds only what the step reads; a traced recipe keeps its paths, see testhooks.track).

    Any: the result is ``section``'s own type (a TypedDict section, a Tracked mapping) with some
    keys left out, which no annotation says: a TypeVar would claim keys a total TypedDict lacks."""
    out = {k: section[k] for k in section if k in keep}
    paths = getattr(section, "paths", None)
    return out if paths is None else type(section)(out, {k: v for k, v in paths.items() if k in out})


def atol_scale_of(values: ArrayLike) -> float:
    """What ``atol`` is multiplied by for one output: the range its finite reference values
    span (largest less smallest) or their largest magnitude, whichever is larger, at least 1.

    fp32 rounding in a deep network grows with the size of the values an output is computed
    from, not with the one element being compared: a trained 30-layer LLM's logits span about
    50 (SmolLM2: -25 to +24), and a correct fp32 export differs from PyTorch by 1.6e-4 at a
    logit of 0.003 (3e-3 at one element of 98,304 in a left-padded decode step), which a fixed
    atol of 1e-4 calls a failure while perplexity and top-1 agree to five digits. The largest
    magnitude alone (24 there) left that element 20% over: the span is what the values moved
    through. Measured in units of the output's own range, the same atol holds both that model
    and a tiny random-init one (whose outputs span about 1), and a wrong weight or a fixed axis
    (differences of the order of the output itself) still fails by orders of magnitude.
    """
    import numpy as np

    if not np.size(values):
        return 1.0
    array = np.asarray(values, dtype=np.float64)
    return float(max(1.0, float(array.max() - array.min()), float(np.abs(array).max())))


MISSING: Final = object()
"""A key one side of a recipe change does not have (plan reasons and diff lines say "added" or "removed")."""


def _named(items: list[object]) -> bool:
    names = [i.get("name") for i in items if isinstance(i, dict)]
    return len(names) == len(items) and all(isinstance(n, str) for n in names) and len(set(names)) == len(names)


def json_changes(old: object, new: object, prefix: str = "") -> list[tuple[str, object, object]]:
    """Leaf-level differences between two JSON values, as (dotted path, old, new); a key only one
    side has is ``MISSING`` on the other (plan reasons and diff lines say "added" or "removed")."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[tuple[str, object, object]] = []
        for k in sorted(set(old) | set(new)):
            path = f"{prefix}.{k}" if prefix else k
            out.extend(json_changes(old.get(k, MISSING), new.get(k, MISSING), path))
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) != len(new) and _named(old) and _named(new):
        # Lists of named items (inputs, quantize variants) that grew or shrank: match by name,
        # so a reader sees "export.inputs[attention_mask] added" rather than two long lists.
        before, after = {i["name"]: i for i in old}, {i["name"]: i for i in new}
        out = []
        for name in [*before, *(n for n in after if n not in before)]:
            out.extend(json_changes(before.get(name, MISSING), after.get(name, MISSING), f"{prefix}[{name}]"))
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        out = []
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            out.extend(json_changes(a, b, f"{prefix}[{i}]"))
        return out
    if old is MISSING and new is MISSING:
        return []
    if old is MISSING or new is MISSING or old != new:
        return [(prefix, old, new)]
    return []


def every_node(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """The graph's nodes and, depth first, those of their subgraphs (an ``If``'s branches: a
    fused decoder's sliding layers hold their Attention there)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from every_node(attr.g)
            for sub in attr.graphs:
                yield from every_node(sub)

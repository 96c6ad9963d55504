"""A test hook to stop a command at a named point; standard library only, so the entry point
can use it before anything else loads. Not for users."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

if TYPE_CHECKING:
    from _collections_abc import dict_items, dict_values

TEST_PAUSE_ENV = "ONNXBUILD_TEST_PAUSE"


def pause_for_tests(point: str, detail: str) -> None:
    """Test hook: with ONNXBUILD_TEST_PAUSE="<point>:<detail>:<seconds>:<marker file>", sleep
    at that point of a write, after creating the marker file, so a test can SIGKILL a build
    exactly there (tests/test_crashes.py). An empty detail matches any. Not for users.

    Points: ``startup`` (detail: empty) in the entry point once its signal handlers are in
    place, before the command's modules load; ``exit`` (detail: the exit code) once the
    command has finished, before Python shuts down; ``cache-write`` (detail: the step) in ``Cache.commit`` once the step's first
    output is in objects/ and before its entry exists; ``materialise`` (detail: the
    artifact's path) once an artifact is linked under its temporary name, before the rename;
    ``manifest-write`` (detail: the recipe) once the new manifest is written under its
    temporary name, before the rename; ``push`` (detail: the step) in a Ray task on another
    node once the step's first output is pushed to the remote cache, before the rest.
    """  # noqa: E501
    value = os.environ.get(TEST_PAUSE_ENV)
    if not value:
        return
    want_point, want_detail, seconds, marker = [*value.split(":", 3), "", "", ""][:4]
    if want_point != point or want_detail not in ("", detail):
        return
    if marker:
        Path(marker).write_text(f"{point}:{detail}:{os.getpid()}\n", encoding="utf-8")
    time.sleep(float(seconds or 0))


# ---------------------------------------------------------------- which recipe keys a step reads

READS_ENV = "ONNXBUILD_TEST_READS"
"""A file path: while set, every step appends to it, as a JSON line, the recipe
keys (``quantize[0].validate.top1_min``) it read from its params (tests/test_key_granularity.py)."""

_reads: ContextVar[set[str] | None] = ContextVar("onnxbuild_reads", default=None)


def tracing_reads() -> bool:
    return bool(os.environ.get(READS_ENV))


_T = TypeVar("_T")


class Tracked(dict):  # type: ignore[type-arg]
    """A recipe mapping that notes, while a step runs, the recipe path of each leaf read from it.

    Plain dict for everything else (JSON, keys, equality), so a traced build plans and keys
    exactly as an untraced one. ``a | b`` keeps both sides' paths (a variant's tolerances
    over the base ``validate:``)."""

    def __init__(self, data: Mapping[str, object], paths: dict[str, str]) -> None:
        super().__init__(data)
        self.paths = paths

    def _note(self, key: str) -> None:
        seen = _reads.get()
        if seen is not None and key in self.paths:
            value = dict.get(self, key)
            if isinstance(value, (Tracked, TrackedList)) and value:
                return  # a section: its leaves note themselves when read
            seen.add(self.paths[key])

    def __getitem__(self, key: str) -> object:
        self._note(key)
        return dict.__getitem__(self, key)

    def get(self, key: str, default: object = None) -> object:
        if key in self:
            self._note(key)
        return dict.get(self, key, default)

    def __iter__(self) -> Iterator[str]:
        # overridden so that dict(x), {**x} and update(x) go through keys() and __getitem__
        return dict.__iter__(self)

    def values(self) -> dict_values[str, object]:
        for key in self:
            self._note(key)
        return dict.values(self)

    def items(self) -> dict_items[str, object]:
        for key in self:
            self._note(key)
        return dict.items(self)

    def __or__(self, other: Any) -> Tracked:  # dict.__or__ takes every key type: a narrower override is refused
        theirs = other.paths if isinstance(other, Tracked) else {}
        # a key the right side sets comes from there: its path, or none (a built-in default)
        paths = {k: v for k, v in self.paths.items() if k not in other} | theirs
        return Tracked({**dict(dict.items(self)), **dict(dict.items(other))}, paths)

    def __ror__(self, other: Any) -> Tracked:
        return Tracked({**other, **dict(dict.items(self))}, dict(self.paths))

    def __deepcopy__(self, memo: dict[int, object]) -> dict[str, object]:
        import copy

        return {k: copy.deepcopy(v, memo) for k, v in self.items()}

    def __reduce__(self) -> tuple[type[Tracked], tuple[dict[str, object], dict[str, str]]]:
        # traced in a step's own process too (the params travel pickled)
        return (Tracked, (dict(dict.items(self)), self.paths))


class TrackedList(list):  # type: ignore[type-arg]
    """A list of recipe mappings (``quantize:``, ``export.inputs``), each traced."""

    def __reduce__(self) -> tuple[type[TrackedList], tuple[list[object]]]:
        return (TrackedList, (list(self),))


def track(value: _T, path: str = "") -> _T:
    """The resolved recipe (or a part of it at ``path``) with every mapping traced: the same
    shape, each mapping a Tracked dict over the same keys."""
    return cast(_T, _tracked(value, path))


def _tracked(value: object, path: str) -> object:
    if isinstance(value, dict):
        paths = {k: f"{path}.{k}" if path else str(k) for k in value}
        return Tracked({k: _tracked(v, paths[k]) for k, v in value.items()}, paths)
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return TrackedList(_tracked(v, f"{path}[{i}]") for i, v in enumerate(value))
    return value


@contextmanager
def reading(recipe: str, step: str) -> Iterator[None]:
    """Note the recipe keys ``step`` reads while it runs, into the file READS_ENV names."""
    path = os.environ.get(READS_ENV)
    if not path:
        yield
        return
    seen: set[str] = set()
    token = _reads.set(seen)
    try:
        yield
    finally:
        _reads.reset(token)
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"recipe": recipe, "step": step, "reads": sorted(seen)}) + "\n")

"""The code in the keys: which onnxbuild modules a step's run can execute, and a digest of each.

A step's key holds, beside its params, inputs and package versions, a digest of every onnxbuild
module its run can reach: its kind's module and, transitively, every onnxbuild module that one
imports (at the top or inside a function; ``if TYPE_CHECKING:`` imports excluded). A package's
``__init__`` counts as its own file only: importing ``onnxbuild.fusion.decoder`` runs
``onnxbuild/__init__.py``, which names the whole API for lazy loading but calls none of it. A
kind may name *branches* (``StepKind.branches``): modules its run reaches only for some recipes
(export's fused writer, only for ``exporter: fused``); for the other recipes the walk stops
there.

So an edit to ``fusion/decoder.py`` reruns the steps that can execute it and nothing else, with
no hand-kept version number to forget (Bazel keys an action on its tools' digests, DVC a stage on
its code files). The digest is of the code, not the text: the module's syntax tree with
docstrings dropped (``ast.dump`` has no comments, line numbers or formatting), so an edit to a
comment, a docstring or the layout reruns nothing.

Parsing every module costs about half a second, so each module's digest and imports are kept in
a memo keyed by its path, size and modification time (``memo``): a no-op build only stats the
files.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

PACKAGE = "onnxbuild"
HOME = Path(__file__).resolve().parent.parent
"""The installed package: the code a build runs."""
DIGEST_CHARS = 16
"""Hex characters of each module's digest kept in a key (64 bits: a reviewable lock line)."""


class _Memo(TypedDict):
    stat: list[int]
    digest: str
    imports: list[str]


@dataclass(frozen=True)
class _Module:
    digest: str
    imports: tuple[str, ...]


def modules(home: Path = HOME) -> dict[str, Path]:
    """Every module of the package at ``home`` by dotted name (``onnxbuild.fusion.decoder``)."""
    out: dict[str, Path] = {}
    for folder, subfolders, files in os.walk(home):
        subfolders[:] = [d for d in subfolders if d not in ("node_modules", "__pycache__")]  # web's npm tree
        for file in files:
            if file.endswith(".py"):
                path = Path(folder, file)
                parts = (PACKAGE, *path.relative_to(home).with_suffix("").parts)
                out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return dict(sorted(out.items()))


def code_digest(source: str) -> str:
    """sha256 of the code of ``source``: its syntax tree less docstrings, so comments, docstrings
    and layout do not count."""
    tree = ast.parse(source)
    # a string statement is a docstring (a module's, a class's, a function's, an attribute's below it): not code
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list) and stmts:
                kept = [
                    s
                    for s in stmts
                    if not (
                        isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)
                    )
                ]
                setattr(node, field, kept or [ast.Pass()])
    return hashlib.sha256(ast.dump(tree, annotate_fields=False).encode()).hexdigest()


def imports_of(source: str, known: Iterable[str]) -> tuple[str, ...]:
    """The onnxbuild modules ``source`` imports anywhere but under ``if TYPE_CHECKING:``
    (``from onnxbuild.x import y`` names the module ``onnxbuild.x.y`` where there is one)."""
    names = set(known)
    tree = ast.parse(source)
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module in names:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                found.add(full if full in names else node.module)
    return tuple(sorted(found))


_PARSED: dict[tuple[str, int, int], _Module] = {}
"""Every module parsed in this process, by path, size and modification time."""


class Code:
    """The package's modules, each parsed once per change (``memo`` keeps digests and imports
    across processes, keyed by path, size and modification time)."""

    def __init__(self, home: Path = HOME, memo: Path | None = None) -> None:
        self.home = home
        self.memo_path = memo
        self.paths = modules(home)
        self._memo: dict[str, _Memo] = {}
        self._parsed: dict[str, _Module] = {}
        self._reached: dict[tuple[tuple[str, ...], frozenset[str]], dict[str, str]] = {}
        self._dirty = False
        if memo is not None:
            try:
                loaded = json.loads(memo.read_text(encoding="utf-8"))
                if isinstance(loaded, dict):
                    self._memo = loaded
            except (OSError, ValueError):
                pass  # no memo yet, or a damaged one: parsed again and rewritten

    def module(self, name: str) -> _Module:
        if name in self._parsed:
            return self._parsed[name]
        path = self.paths[name]
        st = path.stat()
        stat = [st.st_size, st.st_mtime_ns]
        rel = str(path.relative_to(self.home))
        memo = self._memo.get(rel)
        if memo is not None and memo.get("stat") == stat:
            parsed = _Module(memo["digest"], tuple(memo["imports"]))
        else:
            # parsed before in this process (another cache folder: a test's, or --cache-dir)
            seen = (str(path), st.st_size, st.st_mtime_ns)
            found = _PARSED.get(seen)
            if found is None:
                source = path.read_text(encoding="utf-8")
                found = _PARSED[seen] = _Module(code_digest(source)[:DIGEST_CHARS], imports_of(source, self.paths))
            parsed = found
            self._memo[rel] = {"stat": stat, "digest": parsed.digest, "imports": list(parsed.imports)}
            self._dirty = True
        self._parsed[name] = parsed
        return parsed

    def reach(self, entries: Iterable[str], stops: Iterable[str] = ()) -> dict[str, str]:
        """Module -> digest of every onnxbuild module the code of ``entries`` can execute: what
        they import, transitively, and each one's enclosing packages' ``__init__`` (as files
        only), less the modules in ``stops`` and what only they import."""
        asked = (tuple(entries), frozenset(stops))
        if asked in self._reached:  # validate.int8, validate.int4... reach the same code
            return dict(self._reached[asked])
        stop = set(asked[1])
        seen: dict[str, str] = {}
        todo = list(asked[0])
        while todo:
            name = todo.pop()
            if name in seen or name in stop or name not in self.paths:
                continue
            seen[name] = self.module(name).digest
            parts = name.split(".")
            for i in range(1, len(parts)):
                parent = ".".join(parts[:i])
                if parent in self.paths and parent not in seen:
                    seen[parent] = self.module(parent).digest
            todo.extend(self.module(name).imports)
        self._reached[asked] = dict(sorted(seen.items()))
        return dict(self._reached[asked])

    def save(self) -> None:
        """Write the memo where it changed (the cache calls this once its folder is its own)."""
        if not self._dirty or self.memo_path is None:
            return
        self._dirty = False
        try:
            self.memo_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.memo_path.with_name(f"{self.memo_path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self._memo, sort_keys=True), encoding="utf-8")
            os.replace(tmp, self.memo_path)
        except OSError:
            pass  # a read-only cache: the digests are computed again next time, nothing is wrong

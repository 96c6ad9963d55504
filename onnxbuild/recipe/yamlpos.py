"""Safe YAML loading that remembers where every value came from.

PyYAML's constructors drop positions, so we compose the node tree ourselves and
build plain Python data from it, recording ``path -> (line, column)`` for each
mapping key and value. Doing the construction ourselves also lets us refuse what
a recipe should never contain: duplicate keys, non-string keys, Python tags, and
alias expansions large enough to exhaust memory (the "billion laughs").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import yaml
    from yaml._yaml import Mark as _CMark

from onnxbuild._util import JsonValue
from onnxbuild.errors import Problem

MAX_VALUES = 100_000
"""More values than this after alias expansion means a hostile or broken file."""

MAX_DEPTH = 100
"""Deeper nesting than this is no recipe. libyaml composes recursively in C, so a file of
100,000 ``[`` (200 KB) would overflow the stack and kill the process; the depth is checked
on the event stream, which is flat, before anything is composed."""

MAX_INT_BITS = 64
"""A recipe's integers are sizes, seeds and versions; past 64 bits no consumer (ONNX's int64,
torch's seed) can take one, and past 4300 digits Python cannot even print it."""

_Y = "tag:yaml.org,2002:"
_TIMESTAMP = _Y + "timestamp"
_INT = _Y + "int"
_SCALAR_KINDS = {_INT: "an integer", _Y + "float": "a number", _Y + "bool": "true or false"}
_ALLOWED_TAGS = frozenset(_Y + t for t in ("map", "seq", "str", "int", "float", "bool", "null", "timestamp"))

Path_ = tuple[str | int, ...]


@dataclass
class Positions:
    """Where each path of a loaded document sits in its file (1-based line and column)."""

    values: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    keys: dict[Path_, tuple[int, int]] = field(default_factory=dict)

    def of(self, path: Path_, *, key: bool = False) -> tuple[int, int] | None:
        """Position of ``path``; the key's position if asked and known, else the nearest parent's."""
        p = tuple(path)
        while True:
            if key and p in self.keys:
                return self.keys[p]
            if p in self.values:
                return self.values[p]
            if not p:
                return None
            p = p[:-1]


def dotted(path: Path_) -> str:
    """``("export", "inputs", 0, "name")`` -> ``export.inputs[0].name``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out


class _TooBig(Exception):
    pass


_YAML_ONLY_BREAKS = ("\x85", "\u2028", "\u2029")
"""Line breaks to YAML 1.1 (and PyYAML) that editors show inside a line."""


def load_yaml(text: str, filename: str) -> tuple[JsonValue, Positions, list[Problem]]:
    """Parse one YAML document; returns data, positions and the problems found.

    Syntax errors come back as a single problem with the parser's position; the
    data is then ``None``. Positions are the editor's: PyYAML also breaks lines at
    U+0085, U+2028 and U+2029, which an editor shows within a line, so where the text
    holds one, every position after it is mapped back.
    """
    data, positions, problems = _load_yaml(text, filename)
    if not any(c in text for c in _YAML_ONLY_BREAKS):
        return data, positions, problems
    to_editor = _editor_positions(text)
    positions.values = {k: to_editor(*v) for k, v in positions.values.items()}
    positions.keys = {k: to_editor(*v) for k, v in positions.keys.items()}
    fixed = []
    for pr in problems:
        if pr.line is not None and pr.column is not None:
            line, col = to_editor(pr.line, pr.column)
            pr = replace(pr, line=line, column=col)
        fixed.append(pr)
    return data, positions, fixed


def _editor_positions(text: str) -> Callable[[int, int], tuple[int, int]]:
    """(line, column) as PyYAML counts them -> as an editor counts them (1-based)."""
    starts = [0]
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\r" and i + 1 < n and text[i + 1] == "\n":
            i += 1
        if c in "\r\n" or c in _YAML_ONLY_BREAKS:
            starts.append(i + 1)
        i += 1

    def convert(line: int, col: int) -> tuple[int, int]:
        offset = starts[min(line - 1, len(starts) - 1)] + col - 1
        return text.count("\n", 0, offset) + 1, offset - (text.rfind("\n", 0, offset) + 1) + 1

    return convert


def _load_yaml(text: str, filename: str) -> tuple[JsonValue, Positions, list[Problem]]:
    import yaml

    loader_class: type[yaml.SafeLoader | yaml.CSafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    positions = Positions()
    problems: list[Problem] = []
    try:
        deep = _too_deep_at(loader_class, text)
        if deep is not None:
            message = f"the document is nested more than {MAX_DEPTH} levels deep; a recipe is far flatter"
            problems.append(Problem(filename, deep.line + 1, deep.column + 1, "", message))
            return None, positions, problems
        loader = loader_class(text)
        try:
            node = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        col = mark.column + 1 if mark else None
        msg = exc.problem or "invalid YAML"
        lines = text.splitlines()
        bad_line = lines[mark.line] if mark and mark.line < len(lines) else ""
        start = exc.context_mark
        if "tab" in msg.lower() or "\t" in bad_line:
            msg += " (indent with spaces; YAML does not allow tabs)"
        elif (
            exc.context
            and exc.context.startswith("while ")
            and start is not None
            and mark is not None
            and start.line != mark.line
        ):
            # The parser stops where it gave up (often the end of the file); the construct
            # left open is where the mistake usually is.
            msg += f" ({exc.context} that starts at line {start.line + 1}, column {start.column + 1})"
        elif exc.context:
            msg = f"{exc.context}, {msg}"
        problems.append(Problem(filename, line, col, "", f"YAML syntax error: {msg}"))
        return None, positions, problems
    except yaml.reader.ReaderError as exc:
        # Raised for characters YAML forbids (control characters). It carries an offset, not a
        # mark, and libyaml's offset counts UTF-8 bytes; the first occurrence of the character
        # is the one the reader stopped at, so find that instead.
        char = exc.character if isinstance(exc.character, str) else chr(exc.character)
        at = text.find(char)
        at = at if at >= 0 else exc.position
        line, col = text.count("\n", 0, at) + 1, at - (text.rfind("\n", 0, at) + 1) + 1
        problems.append(
            Problem(filename, line, col, "", f"YAML does not allow the control character U+{ord(char):04X}; remove it")
        )
        return None, positions, problems
    except yaml.YAMLError as exc:
        problems.append(Problem(filename, None, None, "", f"YAML error: {exc}"))
        return None, positions, problems
    except UnicodeEncodeError as exc:
        # libyaml takes UTF-8, so a lone surrogate in a str (which no decoded file holds) fails
        # its encoding; PyYAML's pure-Python reader reports the same text as a ReaderError.
        at = exc.start
        line, col = text.count("\n", 0, at) + 1, at - (text.rfind("\n", 0, at) + 1) + 1
        problems.append(
            Problem(filename, line, col, "", f"U+{ord(text[at]):04X} is a lone surrogate, not a character; remove it")
        )
        return None, positions, problems
    if node is None:
        return None, positions, problems
    counter = [0]
    constructor = yaml.SafeLoader("")  # only its scalar constructors are used

    def build(n: yaml.Node, path: Path_) -> JsonValue:
        counter[0] += 1
        if counter[0] > MAX_VALUES:
            raise _TooBig
        positions.values.setdefault(path, (n.start_mark.line + 1, n.start_mark.column + 1))
        if n.tag not in _ALLOWED_TAGS:
            problems.append(
                _at(
                    filename,
                    n,
                    path,
                    f"tag {n.tag.replace(_Y, '!!')} is not allowed in a recipe (only plain YAML values)",
                )
            )
            return None
        if isinstance(n, yaml.MappingNode):
            out: dict[str, JsonValue] = {}
            for key_node, value_node in n.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    problems.append(
                        _at(filename, key_node, path, "merge keys (<<) are not supported; write the keys out")
                    )
                    continue
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != "tag:yaml.org,2002:str":
                    shown = repr(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "a list or mapping"
                    problems.append(_at(filename, key_node, path, f"keys must be strings (got {shown}); quote the key"))
                    continue
                key = key_node.value
                child = (*path, key)
                if key in out:
                    first = positions.keys.get(child)
                    where = f" (first at line {first[0]})" if first else ""
                    problems.append(_at(filename, key_node, child, f"duplicate key{where}; remove one of them"))
                    continue
                positions.keys[child] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
                out[key] = build(value_node, child)
            return out
        if isinstance(n, yaml.SequenceNode):
            return [build(item, (*path, i)) for i, item in enumerate(n.value)]
        if isinstance(n, yaml.ScalarNode):
            if n.tag == _TIMESTAMP:
                text_value: str = n.value  # dates stay text: a recipe has no use for datetime objects
                return text_value
            try:
                # the tags _ALLOWED_TAGS lets through construct JSON values (str, int, float, bool, None)
                value: JsonValue = constructor.construct_object(n)
            except yaml.YAMLError as exc:
                problems.append(_at(filename, n, path, f"cannot read value: {getattr(exc, 'problem', exc)}"))
                return None
            except (ValueError, LookupError):
                # PyYAML's int/float/bool constructors trust the tag: a plain `0b_` (an int by
                # YAML 1.1's pattern, yet no digits), an explicit `!!int abc` or `!!bool maybe`,
                # or more digits than Python converts raise bare Python errors.
                problems.append(_at(filename, n, path, _unreadable(constructor, n)))
                return None
            if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
                problems.append(_at(filename, n, path, _TOO_LARGE))
                return None
            return value
        raise AssertionError(f"unexpected YAML node {n!r}")  # pragma: no cover

    try:
        data = build(node, ())
    except _TooBig:
        problems.append(
            Problem(
                filename,
                1,
                1,
                "",
                f"the document expands to more than {MAX_VALUES} values (YAML aliases?); a recipe is far smaller",
            )
        )
        return None, positions, problems
    except RecursionError:
        problems.append(Problem(filename, 1, 1, "", "the document is nested too deeply (recursive YAML alias?)"))
        return None, positions, problems
    return data, positions, problems


def _too_deep_at(loader_class: type[yaml.SafeLoader | yaml.CSafeLoader], text: str) -> yaml.Mark | _CMark | None:
    """The mark of the first collection nested deeper than MAX_DEPTH, or None."""
    import yaml

    loader = loader_class(text)
    depth = 0
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    return event.start_mark
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.MarkedYAMLError as exc:
        # libyaml >= 0.2.6 (PyYAML 6.0.4 wheels) stops deep flow nesting itself, while
        # scanning ahead of the events we count: the same verdict, reached earlier.
        if "nesting depth" in str(exc.problem):
            return exc.problem_mark
        return None  # other syntax errors are reported by the real parse
    finally:
        loader.dispose()
    return None


_TOO_LARGE = f"integer too large (a recipe's integers fit in {MAX_INT_BITS} bits)"


def _unreadable(constructor: Any, node: yaml.ScalarNode) -> str:
    # Any: PyYAML's stubs leave Resolver.resolve untyped, which strict mypy refuses to call
    """Why a scalar whose tag says int, float or bool cannot be read as one."""
    digits = node.value.replace("_", "").lstrip("+-")
    if node.tag == _INT and digits.isascii() and digits.isdigit():
        return _TOO_LARGE
    kind = _SCALAR_KINDS.get(node.tag, node.tag.replace(_Y, "!!"))
    shown = json.dumps(node.value[:40] + ("..." if len(node.value) > 40 else ""), ensure_ascii=False)
    # A plain scalar (style None in PyYAML, '' in libyaml) that resolves to its tag by itself.
    implicit = not node.style and constructor.resolve(type(node), node.value, (True, False)) == node.tag
    if implicit:
        return f"YAML takes {shown} for {kind} but cannot read it as one; put it in quotes to make it text"
    tag = node.tag.replace(_Y, "!!")
    return f"cannot read {shown} as {kind} (tag {tag}); fix the value or remove the tag"


def _at(filename: str, node: yaml.Node, path: Path_, message: str) -> Problem:
    return Problem(filename, node.start_mark.line + 1, node.start_mark.column + 1, dotted(path), message)

"""Fuzzing the recipe loader: whatever the text, a RecipeError with located problems, never a traceback.

Three sources of input: arbitrary text (control characters and non-ASCII included),
YAML dumped from random nested data, and mutations of every recipe in recipes/
(structural edits of its data; line edits, tabs and truncation of its bytes). One
property runs ``onnxbuild show`` through CliRunner on the same inputs.

Runs are derandomized so CI is reproducible. For a longer, fresh search locally:
``ONNXBUILD_FUZZ_EXAMPLES=5000 python -m pytest tests/test_fuzz.py``.
"""

from __future__ import annotations

import copy
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from onnxbuild.api import parse_recipe
from onnxbuild.cli import cli
from onnxbuild.errors import RecipeError
from onnxbuild.recipe.loader import decode_recipe

# On a failure Hypothesis's pytest plugin imports libcst to print a patch, and libcst 1.0 trips
# this DeprecationWarning; under filterwarnings=error that hides the failure behind an INTERNALERROR.
pytestmark = pytest.mark.filterwarnings("ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning")

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
TEXTS = {p.name: p.read_text(encoding="utf-8") for p in sorted(RECIPES.glob("*.yaml"))}
DOCS = {name: yaml.safe_load(text) for name, text in TEXTS.items()}

_LONG_RUN = os.environ.get("ONNXBUILD_FUZZ_EXAMPLES")
FUZZ = settings(
    max_examples=int(_LONG_RUN or 250),
    deadline=None,
    derandomize=not _LONG_RUN,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _keys(node: Any) -> set[str]:
    """Every mapping key at any depth of ``node``."""
    if isinstance(node, dict):
        return set(node).union(*(_keys(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_keys(v) for v in node))
    return set()


# Every key the shipped recipes use, so random documents and renames reach past the top level.
KNOWN_KEYS = sorted(set().union(*(_keys(doc) for doc in DOCS.values())))


# ---------------------------------------------------------------- strategies

# Characters that steer YAML's scanner, plus a few it must reject or treat as line breaks.
YAML_CHARS = [*"-:?[]{},&*!|>'\"%@`#\n\t \r", "\x00", "\x07", "\x1b", "\x85", "\u2028", "\ufeff", "é", "名"]
yamlish_text = st.text(
    alphabet=st.sampled_from(YAML_CHARS) | st.characters(codec="ascii") | st.characters(), max_size=200
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(),  # nan and inf included
    st.text(max_size=20),
    st.sampled_from(
        ["", "batch", "sequence", "float32", "eighteen", "0b_", "0x_", "1:30", "2001-13-45", "~", "yes", ".inf", "<<"]
    ),
    st.sampled_from(KNOWN_KEYS),
)
keys = st.sampled_from(KNOWN_KEYS) | st.text(max_size=12)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=12,
)


def _dump(data: Any, draw: Any) -> str:
    return yaml.safe_dump(
        data,
        sort_keys=False,
        allow_unicode=draw(st.booleans()),
        default_flow_style=draw(st.sampled_from([False, None, True])),
    )


@st.composite
def yaml_documents(draw: Any) -> str:
    """YAML dumped from random data: top-level mappings biased towards a recipe's keys."""
    top = st.dictionaries(keys | st.integers(-3, 3), values, max_size=6)
    recipe_like = st.fixed_dictionaries(
        {
            "name": scalars,
            "source": st.dictionaries(st.sampled_from(["onnx", "graph", "huggingface", "pytorch"]), values, max_size=2),
        },
        optional={
            k: values for k in ("description", "export", "validate", "optimize", "quantize", "benchmark", "providers")
        },
    )
    return _dump(draw(st.one_of(values, top, recipe_like)), draw)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a mapping value or list item below ``node``."""
    out: list[tuple[Any, ...]] = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for k, v in items:
        out.append((*prefix, k))
        out.extend(_paths(v, (*prefix, k)))
    return out


def _parent(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path[:-1]:
        doc = doc[part]
    return doc


def _by_key(node: Any, out: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """Every value found under each mapping key, at any depth."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for k, v in items:
        if isinstance(k, str):
            out.setdefault(k, []).append(v)
        _by_key(v, out)
    return out


BY_KEY: dict[str, list[Any]] = {}
for _doc in DOCS.values():
    _by_key(_doc, BY_KEY)


def _value_for(key: Any) -> st.SearchStrategy[Any]:
    """Random data, or what some shipped recipe has under the same key: well-typed values
    pass the schema and reach the cross-field checks and defaults (a graph recipe given an
    export section, a node input no one defines, a huggingface source with pytorch's keys)."""
    if key not in BY_KEY:
        return values
    known = st.sampled_from(BY_KEY[key]).map(copy.deepcopy)
    return st.one_of(known, known, values)  # 2:1 for the well-typed


@st.composite
def structural_mutations(draw: Any) -> str:
    """A shipped recipe with 1-3 keys deleted, renamed, added, or values replaced at any depth."""
    doc = copy.deepcopy(DOCS[draw(st.sampled_from(sorted(DOCS)))])
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["delete", "replace", "rename", "insert"]))
        paths = _paths(doc)
        if op == "insert" or not paths:
            mappings = [()] + [p for p in paths if isinstance(_parent(doc, (*p, None)), dict)]
            target = _parent(doc, (*draw(st.sampled_from(mappings)), None))
            key = draw(keys)
            target[key] = draw(_value_for(key))
            continue
        path = draw(st.sampled_from(paths))
        parent = _parent(doc, path)
        if op == "delete":
            del parent[path[-1]]
        elif op == "replace":
            parent[path[-1]] = draw(_value_for(path[-1]))
        elif isinstance(parent, dict):  # rename (a list item has no key to rename)
            parent[draw(keys)] = parent.pop(path[-1])
    return _dump(doc, draw)


# Scalars as a YAML file spells them, unquoted: number look-alikes that YAML 1.1 resolves to
# int or float, explicit tags, and numbers around Python's 4300-digit int <-> str limit.
# yaml.safe_dump quotes all of these, so only a text-level edit brings them to the loader.
TAGS = [
    "!!int",
    "!!float",
    "!!bool",
    "!!null",
    "!!str",
    "!!binary",
    "!!timestamp",
    "!!map",
    "!!seq",
    "!!set",
    "!!python/tuple",
    "!local",
]
raw_scalars = st.one_of(
    st.from_regex(
        r"[-+]?(0b[01_]{0,3}|0x[0-9a-f_]{0,3}|0[0-7_]{0,3}|[0-9_]{1,4}|[1-9](:[0-5]?[0-9]){1,2}|\.[0-9_]{0,2}|[0-9][0-9_]*\.[0-9_]*(e[-+][0-9])?)",
        fullmatch=True,
    ),
    st.builds(
        "{} {}".format,
        st.sampled_from(TAGS),
        st.text(alphabet="0123456789abxyz._-:+ ", max_size=6) | st.sampled_from(["''", "[1]", "{a: 1}"]),
    ),
    st.builds(
        "{}{}".format,
        st.sampled_from(["", "-", "0x", "0b", "0o"]),
        (st.integers(1, 30) | st.sampled_from([4300, 4301, 6000])).map("1".__mul__),
    ),
    st.sampled_from(
        [
            "~",
            "Null",
            "yes",
            "Off",
            ".NaN",
            "-.inf",
            "2001-12-14t21:59:43.10-05:00",
            "<<",
            "*a",
            "&a x",
            "[",
            "{",
            "'",
            '"',
            "|",
            ">",
        ]
    ),
)


_ITEM = re.compile(r"\s*(- |[\w.-]+:(?= |$))")
"""The start of a line up to where its value begins: ``  key:`` or ``  - ``."""


@st.composite
def line_mutations(draw: Any) -> bytes:
    """A shipped recipe's bytes with 1-3 line edits, maybe then cut short at any byte."""
    lines = TEXTS[draw(st.sampled_from(sorted(TEXTS)))].splitlines(keepends=True)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["duplicate", "delete", "tab", "raw"]))
        items = [i for i, line in enumerate(lines) if _ITEM.match(line)]
        if not items:
            break
        if op == "raw":  # the value of a `key:` or `- ` line, spelled raw (a value, or a section)
            i = draw(st.sampled_from(items))
            start = _ITEM.match(lines[i])
            assert start is not None
            lines[i] = start.group() + " " + draw(raw_scalars) + "\n"
            continue
        i = draw(st.integers(0, len(lines) - 1))
        if op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "delete":
            del lines[i]
        else:
            j = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:j] + "\t" + lines[i][j:]
    data = "".join(lines).encode("utf-8")
    if draw(st.integers(0, 3)) == 0:
        data = data[: draw(st.integers(0, len(data)))]
    return data


# ---------------------------------------------------------------- properties


def check_text(text: str) -> None:
    """parse_recipe returns a dict or raises RecipeError whose problems are all located inside the text."""
    try:
        result = parse_recipe(text, "r.yaml")
    except RecipeError as exc:
        assert exc.problems
        # splitlines() breaks at every line break YAML knows (and a few it rejects as control characters).
        last = len(text.splitlines()) + 1
        for p in exc.problems:
            assert p.message.strip(), p
            assert p.line is None or 1 <= p.line <= last, (p, last)
            assert p.column is None or p.column >= 1, p
    else:
        assert isinstance(result, dict)


def check_bytes(data: bytes) -> None:
    """As check_text, for a file's bytes: decoding may fail too, but only with a RecipeError."""
    try:
        text = decode_recipe(data, "r.yaml")
    except RecipeError as exc:
        last = len(data.decode("utf-8", "replace").splitlines()) + 1
        assert all(p.message and (p.line is None or 1 <= p.line <= last) for p in exc.problems), exc.problems
        return
    check_text(text)


# Inputs that once crashed the loader, with the located problem each gives now. All but the
# last two raised ValueError, IndexError or KeyError from PyYAML's int/float/bool constructors;
# a 0x number that converts but runs past 4300 digits crashed printing its message, and a lone
# surrogate (a str no decoded file holds) crashed libyaml's UTF-8 encoding.
TOO_LARGE = "integer too large (a recipe's integers fit in 64 bits)"
CRASHES = [
    (
        "name: x\nseed: 0b_\n",
        'r.yaml:2:7: seed: YAML takes "0b_" for an integer but cannot read it as one; put it in quotes to make it text',
    ),
    (
        "name: x\nseed: 0x_\n",
        'r.yaml:2:7: seed: YAML takes "0x_" for an integer but cannot read it as one; put it in quotes to make it text',
    ),
    (
        "name: x\nseed: !!int \n",
        'r.yaml:2:7: seed: cannot read "" as an integer (tag !!int); fix the value or remove the tag',
    ),
    (
        "name: x\nseed: !!int abc\n",
        'r.yaml:2:7: seed: cannot read "abc" as an integer (tag !!int); fix the value or remove the tag',
    ),
    (
        "name: x\natol: !!float ''\n",
        'r.yaml:2:7: atol: cannot read "" as a number (tag !!float); fix the value or remove the tag',
    ),
    (
        "name: x\natol: !!float abc\n",
        'r.yaml:2:7: atol: cannot read "abc" as a number (tag !!float); fix the value or remove the tag',
    ),
    (
        "name: x\nexport: {dynamo: !!bool maybe}\n",
        'r.yaml:2:18: export.dynamo: cannot read "maybe" as true or false (tag !!bool); fix the value or remove '
        "the tag",
    ),
    ("name: x\nseed: " + "1" * 4301 + "\n", f"r.yaml:2:7: seed: {TOO_LARGE}"),
    ("name: x\nseed: 18446744073709551616\n", f"r.yaml:2:7: seed: {TOO_LARGE}"),  # 2**64: the bound, not a crash
    ("name: 0x" + "f" * 4000 + "\n", f"r.yaml:1:7: name: {TOO_LARGE}"),  # quoted in "must be a name (got ...)"
    ("name: x\nseed: \ud800\n", "r.yaml:2:7: U+D800 is a lone surrogate, not a character; remove it"),
]


@pytest.mark.parametrize(("text", "problem"), CRASHES, ids=range(len(CRASHES)))
def test_former_crashes_are_located_problems(text: str, problem: str) -> None:
    with pytest.raises(RecipeError) as exc:
        parse_recipe(text, "r.yaml")
    assert problem in [str(p) for p in exc.value.problems]


def _with_crashes(test: Any) -> Any:
    for text, _ in CRASHES:
        test = example(text)(test)
    return test


@FUZZ
@_with_crashes
@given(st.text(max_size=300))
def test_arbitrary_text(text: str) -> None:
    check_text(text)


@FUZZ
@given(yamlish_text)
def test_yaml_punctuation(text: str) -> None:
    check_text(text)


@FUZZ
@given(yaml_documents())
def test_random_yaml_documents(text: str) -> None:
    check_text(text)


@FUZZ
@given(structural_mutations())
def test_recipe_structure_mutations(text: str) -> None:
    check_text(text)


@FUZZ
@given(line_mutations())
def test_recipe_line_mutations(data: bytes) -> None:
    check_bytes(data)


def test_shipped_recipes_load() -> None:
    """The mutation strategies start from valid recipes (else they only fuzz one error path)."""
    for name, text in TEXTS.items():
        assert isinstance(parse_recipe(text, name), dict)


@settings(FUZZ, max_examples=FUZZ.max_examples // 6)  # 41 by default: CliRunner is slower
@given(st.one_of(st.text(max_size=200).map(str.encode), line_mutations(), structural_mutations().map(str.encode)))
def test_cli_show_never_crashes(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "r.yaml"
        path.write_bytes(data)
        result = CliRunner().invoke(cli, ["show", str(path)])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code in (0, 2), result.output
    assert "Traceback" not in result.output

"""Load a recipe file: safe YAML with positions, JSON Schema, cross-field checks, defaults.

Every problem is collected and reported at once as ``file:line:col: path: message``,
so a user fixes a recipe in one pass instead of one error per run.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, cast

from onnxbuild._util import JsonValue, sha256_bytes
from onnxbuild.errors import Problem, RecipeError
from onnxbuild.recipe.checks import semantic_problems
from onnxbuild.recipe.model import Recipe
from onnxbuild.recipe.resolve import deref, resolve, schema, schema_text
from onnxbuild.recipe.sections import Resolved
from onnxbuild.recipe.yamlpos import Path_, Positions, dotted
from onnxbuild.spec import StepKind

if TYPE_CHECKING:
    from jsonschema import ValidationError

MAX_RECIPE_BYTES = 1 << 20
"""A recipe is a page of YAML; anything over 1 MiB is a mistake (or an attack) and is refused unread."""

__all__ = [
    "MAX_RECIPE_BYTES",
    "KindsOf",
    "decode_recipe",
    "load_recipe",
    "parse_recipe",
    "read_recipe_bytes",
    "remember",
    "resolve",
    "schema",
    "schema_text",
]


def read_recipe_bytes(path: str | Path) -> bytes:
    """Read a recipe file, turning every way it can be unreadable into a RecipeError."""
    shown = str(path)
    p = Path(path)
    try:
        if p.is_dir():
            raise RecipeError(
                [Problem(shown, None, None, "", "is a directory, not a recipe file (name a .yaml file inside it)")]
            )
        import stat

        st = p.stat()
        if not stat.S_ISREG(st.st_mode):
            raise RecipeError(
                [Problem(shown, None, None, "", "is not a regular file (a device, FIFO or socket); name a .yaml file")]
            )
        size = st.st_size
        if size > MAX_RECIPE_BYTES:
            raise RecipeError(
                [
                    Problem(
                        shown,
                        None,
                        None,
                        "",
                        f"is {size} bytes; a recipe must be at most {MAX_RECIPE_BYTES} bytes (1 MiB)",
                    )
                ]
            )
        return p.read_bytes()
    except FileNotFoundError:
        raise RecipeError(
            [Problem(shown, None, None, "", "no such file (check the path; recipes usually live in recipes/)")]
        ) from None
    except PermissionError:
        raise RecipeError([Problem(shown, None, None, "", "cannot be read (permission denied)")]) from None
    except OSError as exc:
        raise RecipeError([Problem(shown, None, None, "", f"cannot be read ({exc.strerror or exc})")]) from None


def decode_recipe(data: bytes, shown: str) -> str:
    if b"\x00" in data:
        raise RecipeError([Problem(shown, None, None, "", "is a binary file, not YAML text")])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        # Columns count characters, as in every other message, not bytes.
        col = len(data[data.rfind(b"\n", 0, exc.start) + 1 : exc.start].decode("utf-8", "replace")) + 1
        raise RecipeError([Problem(shown, line, col, "", "is not valid UTF-8 text (save the file as UTF-8)")]) from None
    return text.removeprefix("\ufeff")


KindsOf = Callable[[], Sequence[StepKind]]
"""The step kinds whose checks a recipe must pass (``onnxbuild.steps.kinds``, passed in from
above: this layer knows no kind), asked only when a recipe is parsed rather than remembered."""


def load_recipe(path: str | Path, kinds: KindsOf, memo_dir: Path | None = None, *, write_memo: bool = True) -> Recipe:
    """Load, validate and resolve the recipe at ``path``, checked by every kind ``kinds`` gives.

    With ``memo_dir``, a recipe whose bytes were resolved before (by this version of
    onnxbuild and this schema) is read back from there instead of being parsed and
    validated again: that keeps YAML and jsonschema off the path of a no-op build.

    Raises:
        RecipeError: listing every problem found, each with file, line and column.
    """
    shown = str(path)
    data = read_recipe_bytes(path)
    digest = sha256_bytes(data)
    memo = _memo_path(memo_dir, digest) if memo_dir is not None else None
    resolved = _read_memo(memo)
    if resolved is None:
        text = decode_recipe(data, shown)
        resolved = parse_recipe(text, shown, kinds())
        if memo is not None and write_memo:
            _write_memo(memo, resolved)
    return Recipe(
        name=resolved["name"],
        path=shown,
        directory=Path(path).resolve().parent,
        digest=digest,
        resolved=resolved,
    )


def remember(recipe: Recipe, memo_dir: Path) -> None:
    """Store a loaded recipe's resolved form so the next load of the same bytes skips parsing."""
    memo = _memo_path(memo_dir, recipe.digest)
    if not memo.exists():
        _write_memo(memo, recipe.resolved)


def _memo_path(memo_dir: Path, digest: str) -> Path:
    return memo_dir / f"{digest}-{_code_salt()}.json"


@cache
def _code_salt() -> str:
    """The resolved form depends on this code as much as on the schema: salt with the recipe
    package, the source kinds and the step kinds (their checks and defaults), so an edited rule
    never serves a stale memo (some 500 KB read once per process, no parsing)."""
    from onnxbuild._version import __version__

    here = Path(__file__).parent
    files = [
        here / "schema.json",
        *sorted(here.glob("*.py")),
        *sorted((here.parent / "sources").glob("*.py")),
        *sorted((here.parent / "steps").rglob("*.py")),
    ]
    code = b"".join(f.read_bytes() for f in files)
    return sha256_bytes(__version__.encode() + b"\0" + code)[:16]


def _read_memo(memo: Path | None) -> Resolved | None:
    if memo is None:
        return None
    try:
        data = json.loads(memo.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    # what _write_memo wrote, salted with this code: a resolved recipe as this version makes one
    return cast("Resolved", data) if isinstance(data, dict) else None


def _write_memo(memo: Path, resolved: Mapping[str, object]) -> None:
    from onnxbuild._util import atomic_write_text, canonical_json

    try:
        atomic_write_text(memo, canonical_json(resolved))
    except OSError:
        pass  # only a speed-up


def parse_recipe(text: str, shown: str, kinds: Sequence[StepKind]) -> Resolved:
    """Validate recipe text and return it resolved (every default explicit)."""
    from onnxbuild.recipe.yamlpos import load_yaml

    doc, positions, problems = load_yaml(text, shown)
    if problems:
        raise RecipeError(problems)
    if doc is None:
        raise RecipeError(
            [
                Problem(
                    shown,
                    1,
                    1,
                    "",
                    "the recipe is empty; it needs at least `name:` and `source:` (see recipes/ for examples)",
                )
            ]
        )
    if not isinstance(doc, dict):
        raise RecipeError(
            [Problem(shown, 1, 1, "", f"a recipe is a mapping of keys (name, source, ...), not a {_kind(doc)}")]
        )
    problems = list(_non_finite(doc, positions, shown, ())) + list(_schema_problems(doc, positions, shown))
    if not problems:
        problems = list(semantic_problems(doc, positions, shown, kinds))
    if problems:
        problems.sort(key=lambda p: (p.line or 0, p.column or 0, p.path))
        raise RecipeError(problems)
    return resolve(doc, kinds)


def _non_finite(value: object, positions: Positions, shown: str, path: Path_) -> Iterable[Problem]:
    """YAML's .nan and .inf: the schema's bounds cannot catch NaN (it compares false with
    everything), and no recipe number means either."""
    if isinstance(value, float) and not math.isfinite(value):
        pos = positions.of(path)
        written = ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
        yield Problem(
            shown,
            pos[0] if pos else None,
            pos[1] if pos else None,
            dotted(path),
            f"must be a finite number (got {written})",
        )
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _non_finite(v, positions, shown, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _non_finite(v, positions, shown, (*path, i))


# ---------------------------------------------------------------- schema


def _schema_problems(doc: Mapping[str, object], positions: Positions, shown: str) -> Iterable[Problem]:
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(schema())
    seen: set[tuple[str, str]] = set()
    for error in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
        for path, message, at_key in _explain(error):
            pos = positions.of(path, key=at_key)
            problem = Problem(shown, pos[0] if pos else None, pos[1] if pos else None, dotted(path), message)
            if (problem.path, message) not in seen:
                seen.add((problem.path, message))
                yield problem


def _explain(error: ValidationError) -> Iterable[tuple[Path_, str, bool]]:
    """Turn one jsonschema error into (path, message, point-at-key) items in our words."""
    path: Path_ = tuple(error.absolute_path)
    sch = error.schema
    kind = error.validator
    instance = error.instance
    if kind == "additionalProperties" and isinstance(instance, dict):
        known = sorted(sch.get("properties", {}))
        for key in sorted(set(instance) - set(known)):
            if "properties" not in sch:
                continue
            hint = difflib.get_close_matches(key, known, n=1)
            suggestion = f"did you mean {hint[0]!r}? " if hint else ""
            yield (*path, key), f"unknown key ({suggestion}expected one of: {', '.join(known)})", True
        if "properties" not in sch:
            yield path, f"must be {_describe(sch)} (got {_shown(instance)})", False
        return
    if kind == "required":
        missing = [k for k in sch.get("required", []) if k not in instance]
        for key in missing:
            what = _describe(sch.get("properties", {}).get(key, {}))
            yield path, f"missing required key {key!r} ({what})", True
        return
    if kind in ("minProperties", "maxProperties") and "x-expected" in sch:
        yield path, f"must name {sch['x-expected']} (got {', '.join(instance) or 'nothing'})", True
        return
    if kind == "minItems":
        yield path, f"must have at least {sch['minItems']} item{'s' if sch['minItems'] != 1 else ''}", False
        return
    if kind == "minLength":
        yield path, "must not be empty", False
        return
    if "propertyNames" in error.relative_schema_path:
        # jsonschema reports a bad key as the key's own (pattern) error, located at the mapping.
        yield (*path, instance), "not a dimension name; use an identifier such as batch or sequence", True
        return
    if kind in ("anyOf", "oneOf") and isinstance(instance, (dict, list)):
        # "must be a mapping or null (got a mapping)" helps no one: when exactly one branch
        # accepts a value of this type, explain what is wrong inside that branch instead.
        branches = _branches_of_right_type(error)
        if len(branches) == 1:
            for sub in branches[0]:
                yield from _explain(sub)
            return
    if kind == "type" and sch.get("type") == "object" and not str(sch.get("x-expected", "a ")).startswith("a "):
        # source's x-expected ("exactly one of: onnx, ...") names its keys, not a kind of
        # value: "must be exactly one of: onnx, ... (got "onnx")" would read as a contradiction.
        yield path, f"must be a mapping naming {sch['x-expected']} (got {_shown(instance)})", False
        return
    quote = ""
    if _wants_string(sch) and isinstance(instance, (bool, int, float)):
        quote = (
            "; YAML read this as a "
            + ("boolean" if isinstance(instance, bool) else "number")
            + ", put the value in quotes to make it text"
        )
    yield path, f"must be {_describe(sch)} (got {_shown(instance)}{quote})", False


def _branches_of_right_type(error: ValidationError) -> list[list[ValidationError]]:
    """The anyOf/oneOf branches whose errors lie inside the value, not in its type."""
    by_branch: dict[str | int, list[ValidationError]] = {}
    for sub in error.context:
        by_branch.setdefault(sub.relative_schema_path[0], []).append(sub)
    root = tuple(error.absolute_path)
    return [
        subs
        for subs in by_branch.values()
        if not any(s.validator == "type" and tuple(s.absolute_path) == root for s in subs)
    ]


def _wants_string(sch: Mapping[str, JsonValue]) -> bool:
    if isinstance(ref := sch.get("$ref"), str):
        return _wants_string(deref(ref))
    return sch.get("type") == "string"


def _describe(sch: Mapping[str, JsonValue]) -> str:
    """A short phrase for what a schema accepts: 'an integer from 7 to 23'."""
    if "x-expected" in sch:
        return str(sch["x-expected"])
    # the schema is our own file, checked against its meta-schema by the tests: $ref is a string,
    # enum a list, anyOf a list of schemas (the isinstance tests only narrow the JSON value's type)
    if isinstance(ref := sch.get("$ref"), str):
        return _describe(deref(ref))
    if isinstance(enum := sch.get("enum"), list):
        return "one of: " + ", ".join(str(v) for v in enum)
    if isinstance(branches := sch.get("anyOf"), list):
        return " or ".join(_describe(s) for s in branches if isinstance(s, dict))
    types = sch.get("type")
    if isinstance(types, list):
        return " or ".join(_describe({**sch, "type": t}) for t in types)
    lo = sch.get("minimum", sch.get("exclusiveMinimum"))
    hi = sch.get("maximum")
    lo_word = ">" if "exclusiveMinimum" in sch else ">="
    if types in ("integer", "number"):
        noun = "an integer" if types == "integer" else "a number"
        if lo is not None and hi is not None:
            return f"{noun} from {lo} to {hi}"
        if lo is not None:
            return f"{noun} {lo_word} {lo}"
        if hi is not None:
            return f"{noun} <= {hi}"
        return noun
    if types == "string":
        return f"a string matching {sch['pattern']}" if "pattern" in sch else "a string"
    if types == "boolean":
        return "true or false"
    if types == "object":
        return "a mapping"
    if types == "array":
        return "a list"
    if types == "null":
        return "null"
    return "valid"


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, dict):
        return "mapping"
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    return type(value).__name__


def _shown(value: object) -> str:
    if isinstance(value, str):
        return json.dumps(value[:60] + ("..." if len(value) > 60 else ""))
    if isinstance(value, (dict, list)):
        return f"a {_kind(value)}"
    if value is None:
        return "null"
    return json.dumps(value)

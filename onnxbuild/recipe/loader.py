"""Load a recipe file: safe YAML with positions, JSON Schema, cross-field checks, defaults.

Every problem is collected and reported at once as ``file:line:col: path: message``,
so a user fixes a recipe in one pass instead of one error per run.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

from onnxbuild._util import sha256_bytes
from onnxbuild.errors import Problem, RecipeError
from onnxbuild.recipe.model import Recipe, is_torch_source
from onnxbuild.recipe.tasks import DERIVED_DIMS, TASKS, WITH_PAST_INPUTS
from onnxbuild.recipe.yamlpos import Path_, Positions, dotted

MAX_RECIPE_BYTES = 1 << 20
"""A recipe is a page of YAML; anything over 1 MiB is a mistake (or an attack) and is refused unread."""

DEFAULT_SAMPLE = {"batch": 2, "sequence": 16, "past_sequence": 4}
DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-3
DEFAULT_TOP1_MIN = 0.99
DEFAULT_COSINE_MIN = 0.99
"""validate.cosine_min when validate.sentences is given: float32 exports of sentence encoders measure above 0.9999."""


@cache
def schema_text() -> str:
    return (Path(__file__).parent / "schema.json").read_text(encoding="utf-8")


@cache
def schema() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(schema_text())
    return data


def read_recipe_bytes(path: str | Path) -> bytes:
    """Read a recipe file, turning every way it can be unreadable into a RecipeError."""
    shown = str(path)
    p = Path(path)
    try:
        if p.is_dir():
            raise RecipeError([Problem(shown, None, None, "", "is a directory, not a recipe file (name a .yaml file inside it)")])
        import stat

        st = p.stat()
        if not stat.S_ISREG(st.st_mode):
            raise RecipeError([Problem(shown, None, None, "", "is not a regular file (a device, FIFO or socket); name a .yaml file")])
        size = st.st_size
        if size > MAX_RECIPE_BYTES:
            raise RecipeError([Problem(shown, None, None, "", f"is {size} bytes; a recipe must be at most {MAX_RECIPE_BYTES} bytes (1 MiB)")])
        return p.read_bytes()
    except FileNotFoundError:
        raise RecipeError([Problem(shown, None, None, "", "no such file (check the path; recipes usually live in recipes/)")]) from None
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


def load_recipe(path: str | Path, memo_dir: Path | None = None, *, write_memo: bool = True) -> Recipe:
    """Load, validate and resolve the recipe at ``path``.

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
        resolved = parse_recipe(text, shown)
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
    from onnxbuild._version import __version__

    # The resolved form depends on this code as much as on the schema: salt with both,
    # so an edited default never serves a stale memo (a few KB read, no parsing).
    here = Path(__file__).parent
    code = b"".join((here / name).read_bytes() for name in ("loader.py", "tasks.py", "schema.json"))
    salt = sha256_bytes(__version__.encode() + b"\0" + code)[:16]
    return memo_dir / f"{digest}-{salt}.json"


def _read_memo(memo: Path | None) -> dict[str, Any] | None:
    if memo is None:
        return None
    try:
        data: dict[str, Any] = json.loads(memo.read_text(encoding="utf-8"))
        return data
    except (OSError, ValueError):
        return None


def _write_memo(memo: Path, resolved: dict[str, Any]) -> None:
    from onnxbuild._util import atomic_write_text, canonical_json

    try:
        atomic_write_text(memo, canonical_json(resolved))
    except OSError:
        pass  # only a speed-up


def parse_recipe(text: str, shown: str) -> dict[str, Any]:
    """Validate recipe text and return it resolved (every default explicit)."""
    from onnxbuild.recipe.yamlpos import load_yaml

    doc, positions, problems = load_yaml(text, shown)
    if problems:
        raise RecipeError(problems)
    if doc is None:
        raise RecipeError([Problem(shown, 1, 1, "", "the recipe is empty; it needs at least `name:` and `source:` (see recipes/ for examples)")])
    if not isinstance(doc, dict):
        raise RecipeError([Problem(shown, 1, 1, "", f"a recipe is a mapping of keys (name, source, ...), not a {_kind(doc)}")])
    problems = list(_non_finite(doc, positions, shown, ())) + list(_schema_problems(doc, positions, shown))
    if not problems:
        problems = list(_semantic_problems(doc, positions, shown))
    if problems:
        problems.sort(key=lambda p: (p.line or 0, p.column or 0, p.path))
        raise RecipeError(problems)
    return resolve(doc)


def _non_finite(value: Any, positions: Positions, shown: str, path: Path_) -> Iterable[Problem]:
    """YAML's .nan and .inf: the schema's bounds cannot catch NaN (it compares false with
    everything), and no recipe number means either."""
    if isinstance(value, float) and not math.isfinite(value):
        pos = positions.of(path)
        written = ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
        yield Problem(shown, pos[0] if pos else None, pos[1] if pos else None, dotted(path), f"must be a finite number (got {written})")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _non_finite(v, positions, shown, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _non_finite(v, positions, shown, (*path, i))


# ---------------------------------------------------------------- schema


def _schema_problems(doc: dict[str, Any], positions: Positions, shown: str) -> Iterable[Problem]:
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


def _explain(error: Any) -> Iterable[tuple[Path_, str, bool]]:
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
        quote = "; YAML read this as a " + ("boolean" if isinstance(instance, bool) else "number") + ", put the value in quotes to make it text"
    yield path, f"must be {_describe(sch)} (got {_shown(instance)}{quote})", False


def _branches_of_right_type(error: Any) -> list[list[Any]]:
    """The anyOf/oneOf branches whose errors lie inside the value, not in its type."""
    by_branch: dict[Any, list[Any]] = {}
    for sub in error.context:
        by_branch.setdefault(sub.relative_schema_path[0], []).append(sub)
    root = tuple(error.absolute_path)
    return [subs for subs in by_branch.values() if not any(s.validator == "type" and tuple(s.absolute_path) == root for s in subs)]


def _wants_string(sch: dict[str, Any]) -> bool:
    if "$ref" in sch:
        return _wants_string(_deref(sch["$ref"]))
    return sch.get("type") == "string"


def _describe(sch: dict[str, Any]) -> str:
    """A short phrase for what a schema accepts: 'an integer from 7 to 23'."""
    if "x-expected" in sch:
        return str(sch["x-expected"])
    if "$ref" in sch:
        return _describe(_deref(sch["$ref"]))
    if "enum" in sch:
        return "one of: " + ", ".join(str(v) for v in sch["enum"])
    if "anyOf" in sch:
        return " or ".join(_describe(s) for s in sch["anyOf"])
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


def _deref(ref: str) -> dict[str, Any]:
    node: Any = schema()
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    result: dict[str, Any] = node
    return result


def _kind(value: Any) -> str:
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


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value[:60] + ("..." if len(value) > 60 else ""))
    if isinstance(value, (dict, list)):
        return f"a {_kind(value)}"
    if value is None:
        return "null"
    return json.dumps(value)


# ---------------------------------------------------------------- cross-field checks


def _semantic_problems(doc: dict[str, Any], positions: Positions, shown: str) -> Iterable[Problem]:
    def problem(path: Path_, message: str, key: bool = False) -> Problem:
        pos = positions.of(path, key=key)
        return Problem(shown, pos[0] if pos else None, pos[1] if pos else None, dotted(path), message)

    kind = next(iter(doc["source"]))
    src = doc["source"][kind]
    torch_source = is_torch_source(doc["source"])
    if not torch_source:
        what = "an ONNX file, huggingface.file" if kind == "huggingface" else kind
        for section in ("export", "validate"):
            if section in doc:
                yield problem((section,), f"applies only to huggingface, pytorch and tensorflow sources (this recipe's source is {what}); remove it", key=True)
    if kind == "huggingface" and (src.get("model") is not None) == (src.get("package") is not None):
        got = "it has both" if src.get("model") is not None else "it has neither"
        yield problem(("source", "huggingface"), f"give exactly one of `model` (Hub id or folder) and `package` (a folder inside an installed package); {got}", key=True)
    if kind in ("pytorch", "tensorflow") and "inputs" not in doc.get("export", {}):
        what = "its input signature: " if kind == "tensorflow" else ""
        yield problem(("export",) if "export" in doc else ("source", kind), f"a {kind} source needs export.inputs ({what}name, dtype and shape of each model input)", key=True)
    if kind == "tensorflow" and ("factory" in src) == ("keras" in src):
        got = "it has both" if "factory" in src else "it has neither"
        yield problem(("source", "tensorflow"), f"give exactly one of `factory` (file.py:function) and `keras` (a .keras file); {got}", key=True)
    from onnxbuild.usercode import ref_problem

    refs = [(("source", kind, "factory"), src.get("factory")) if kind in ("pytorch", "tensorflow") else ((), None)]
    accuracy = (doc.get("validate") or {}).get("accuracy")
    if isinstance(accuracy, dict):
        refs.append((("validate", "accuracy", "dataset"), accuracy.get("dataset")))
    for path, ref in refs:
        wrong = ref_problem(ref) if isinstance(ref, str) else None
        if wrong:
            yield problem(path, wrong)
    if kind == "tensorflow" and doc.get("export", {}).get("exporter", "torchscript") != "torchscript":
        yield problem(("export", "exporter"), "a tensorflow source is converted with tf2onnx; remove export.exporter")
    if kind == "graph":
        yield from _graph_problems(src, problem)

    export = doc.get("export", {})
    with_past = bool(export.get("with_past"))
    if with_past and not (kind == "huggingface" and src.get("task") == "text-generation"):
        what = f"task {src.get('task')}" if kind == "huggingface" else f"a {kind} source"
        yield problem(("export", "with_past"), f"applies to huggingface text-generation models (this recipe has {what}); remove it")
        with_past = False
    if "generate" in doc and doc["generate"] is not None:
        gen = doc["generate"]
        if not with_past:
            yield problem(("generate",), "generates through the KV cache; add export.with_past: true (a huggingface text-generation model)", key=True)
        if gen.get("prompt") is not None and gen.get("prompt_ids") is not None:
            yield problem(("generate", "prompt_ids"), "give either prompt (text) or prompt_ids (token ids), not both", key=True)
    if torch_source:
        default_inputs = WITH_PAST_INPUTS if with_past else TASKS[src["task"]]["inputs"] if kind == "huggingface" else []
        inputs = export.get("inputs") or default_inputs
        export_dims = _symbolic_dims(inputs)
        dims = validation_dims(kind, inputs)
        optional = {"past_sequence"} if with_past else set()
        sample = export.get("sample", {d: DEFAULT_SAMPLE[d] for d in export_dims if d in DEFAULT_SAMPLE})
        for d in export_dims:
            if d not in sample:
                yield problem(("export", "sample") if "sample" in export else ("export",), f"give a sample size for dimension {d!r} (e.g. sample: {{{d}: 2}})", key=True)
        for i, shape in enumerate(doc.get("validate", {}).get("shapes", [])):
            for d in dims:
                if d not in shape:
                    yield problem(("validate", "shapes", i), f"missing a size for dimension {d!r} (the inputs use: {', '.join(dims)})")
            for d in shape:
                if d not in dims and d not in optional:
                    yield problem(("validate", "shapes", i, d), f"unknown dimension (the inputs use: {', '.join([*dims, *optional]) or 'no symbolic dimensions'})", key=True)
        config = src.get("config") if kind == "huggingface" and isinstance(src.get("config"), dict) else {}
        max_positions = next((config[k] for k in ("n_positions", "max_position_embeddings") if isinstance(config.get(k), int)), None)
        if max_positions:
            for section in ("validate", "benchmark"):
                block = doc.get(section) or {}
                for i, shape in enumerate(block.get("shapes", []) if isinstance(block, dict) else []):
                    total = sum(v for d, v in shape.items() if d in ("sequence", "past_sequence") and isinstance(v, int))
                    if total > max_positions:
                        yield problem((section, "shapes", i), f"sequence + past_sequence is {total}, beyond the model's {max_positions} positions (source.huggingface.config); use at most {max_positions}")
        bench = doc.get("benchmark") or {}
        for i, shape in enumerate(bench.get("shapes", []) if isinstance(bench, dict) else []):
            for d in dims:
                if d not in shape and d not in optional:
                    yield problem(("benchmark", "shapes", i), f"missing a size for dimension {d!r} (the inputs use: {', '.join(dims)})")
            for d in shape:
                if d not in dims and d not in optional:
                    yield problem(("benchmark", "shapes", i, d), f"unknown dimension (the inputs use: {', '.join([*dims, *optional]) or 'no symbolic dimensions'})", key=True)
        names = [t["name"] for t in inputs]
        for i, name in enumerate(names):
            if name in names[:i]:
                yield problem(("export", "inputs", i, "name"), f"input {name!r} is listed twice (first as export.inputs[{names.index(name)}])")
        validate = doc.get("validate", {})
        if validate.get("sentences") is not None and kind != "huggingface":
            yield problem(("validate", "sentences"), f"needs a huggingface source, whose tokenizer turns the sentences into inputs (this recipe's source is {kind})", key=True)
        if validate.get("cosine_min") is not None and validate.get("sentences") is None:
            yield problem(("validate", "cosine_min"), "compares sentence embeddings; add validate.sentences (the text to embed)", key=True)
    variant_names = ["model", *(["optimized"] if doc.get("optimize") else []), *(q.get("name") for q in doc.get("quantize", []))]
    for i, prov in enumerate(doc.get("providers", [])):
        wanted = (prov.get("options") or {}).get("variants") if prov.get("name") == "web" else None
        if wanted is None:
            continue
        if not isinstance(wanted, list) or not all(isinstance(w, str) for w in wanted):
            yield problem(("providers", i, "options", "variants"), f"must be a list of variant names (this recipe has: {', '.join(variant_names)})")
            continue
        for j, w in enumerate(wanted):
            if w not in variant_names:
                yield problem(("providers", i, "options", "variants", j), f"no variant {w!r} (this recipe has: {', '.join(variant_names)})")
    kinds = {"source", "export", "check", "validate", "optimize", "quantize", "report", "generate", "benchmark"}
    named = {f"quantize.{q['name']}" for q in doc.get("quantize", [])} | {f"validate.{q['name']}" for q in doc.get("quantize", [])} | {"validate.optimized"}
    for step in (doc.get("limits") or {}).get("steps", {}):
        if step not in kinds and step not in named:
            yield problem(("limits", "steps", step), f"no such step or step kind (kinds: {', '.join(sorted(kinds))}; steps such as {', '.join(sorted(named)) or 'validate.int8'})", key=True)
    decoder = (doc.get("optimize") or {}).get("decoder")
    if decoder == "fused":
        from onnxbuild.recipe.families import FUSED_DECODERS

        hf = (doc.get("source") or {}).get("huggingface")
        model_type = ((hf or {}).get("config") or {}).get("model_type")
        if not hf or hf.get("task") != "text-generation" or not with_past:
            yield problem(("optimize", "decoder"), "fused graphs are for text-generation models exported with export.with_past: true; use decoder: auto or export")
        elif model_type is not None and model_type not in FUSED_DECODERS:
            yield problem(("optimize", "decoder"), f"no fused graph for model_type {model_type!r} (there is one for {', '.join(FUSED_DECODERS)}); use decoder: auto or export")
    for i, q in enumerate(doc.get("quantize", [])):
        earlier = [p["name"] for p in doc["quantize"][:i]]
        if with_past and q.get("method") == "static":
            yield problem(("quantize", i, "method"), "static calibration of a with-past decoder is not supported; use method: dynamic (or int4)")
        if q["name"] in ("model", "optimized"):
            yield problem(("quantize", i, "name"), f"{q['name']!r} names a built-in variant; choose another name (e.g. int8)")
        if q["name"] in earlier:
            yield problem(("quantize", i, "name"), f"variant name {q['name']!r} is used twice; names must be unique")
        if q.get("from") == "optimized" and not doc.get("optimize"):
            yield problem(("quantize", i, "from"), "quantizes the optimized variant, but the recipe has no optimize section")


def _graph_problems(src: dict[str, Any], problem: Any) -> Iterable[Problem]:
    defined: set[str] = set()
    for value in src["inputs"]:
        defined.add(value["name"])
    for i, init in enumerate(src.get("initializers", [])):
        has_values, has_random = "values" in init, "random" in init
        if has_values == has_random:
            got = "it has both" if has_values else "it has neither"
            yield problem(("source", "graph", "initializers", i), f"give exactly one of `values` (the numbers) and `random` (a seed); {got}", key=True)
        if has_values:
            count = _count_leaves(init["values"])
            want = 1
            for d in init["shape"]:
                want *= d
            if count != want:
                yield problem(("source", "graph", "initializers", i, "values"), f"has {count} values but shape {init['shape']} needs {want}")
        defined.add(init["name"])
    for i, node in enumerate(src["nodes"]):
        for j, name in enumerate(node["inputs"]):
            if name and name not in defined:
                yield problem(("source", "graph", "nodes", i, "inputs", j), f"{name!r} is not a graph input, an initializer or the output of an earlier node")
        defined.update(node["outputs"])
    for i, value in enumerate(src["outputs"]):
        if value["name"] not in defined:
            yield problem(("source", "graph", "outputs", i, "name"), f"{value['name']!r} is not produced by any node")


def _count_leaves(values: Any) -> int:
    if isinstance(values, list):
        return sum(_count_leaves(v) for v in values)
    return 1


def validation_dims(kind: str, inputs: list[dict[str, Any]]) -> list[str]:
    """The dimensions validation varies: the export's symbolic ones, plus, for a transformers
    model, batch and sequence whatever the export declared, so an axis fixed by mistake
    in export.inputs is caught instead of validated at its one fixed size."""
    dims = _symbolic_dims(inputs)
    if kind == "huggingface":
        dims = ["batch", "sequence"] + [d for d in dims if d not in ("batch", "sequence")]
    return dims


def _symbolic_dims(inputs: list[dict[str, Any]]) -> list[str]:
    dims: list[str] = []
    for t in inputs:
        for d in t.get("shape", []):
            if isinstance(d, str) and d not in dims and d not in DERIVED_DIMS:
                dims.append(d)
    return dims


# ---------------------------------------------------------------- defaults


def resolve(doc: dict[str, Any]) -> dict[str, Any]:
    """Fill every default so the result says everything the build depends on."""
    kind = next(iter(doc["source"]))
    out: dict[str, Any] = {
        "name": doc["name"],
        "description": doc.get("description", ""),
        "source": {kind: _with_defaults(doc["source"][kind], _deref(f"#/$defs/{kind}_source"))},
    }
    src = out["source"][kind]
    if kind == "huggingface":
        src.setdefault("model", None)
        src.setdefault("package", None)
        src.setdefault("config", None)
        src.setdefault("tokenizer", None)
    if kind == "graph":
        src["initializers"] = [_with_defaults(i, _deref("#/$defs/initializer")) for i in src["initializers"]]
        for init in src["initializers"]:
            if "random" in init:
                init["random"] = _with_defaults(init["random"], _deref("#/$defs/initializer")["properties"]["random"])
        src["nodes"] = [_with_defaults(n, _deref("#/$defs/node")) for n in src["nodes"]]
    if is_torch_source(out["source"]):
        task = TASKS[src["task"]] if kind == "huggingface" else None
        export = _with_defaults(doc.get("export", {}), _deref("#/$defs/export"))
        default_inputs = WITH_PAST_INPUTS if export["with_past"] else task["inputs"] if task else []
        export.setdefault("inputs", [dict(t) for t in default_inputs])
        export["inputs"] = [{"dtype": "float32", "shape": [], **t} for t in export["inputs"]]
        export.setdefault("outputs", list(task["outputs"]) if task else ["output"])
        if "sample" not in export:  # not setdefault: its default names only the usual dimensions
            export["sample"] = {d: DEFAULT_SAMPLE[d] for d in _symbolic_dims(export["inputs"])}
        if export["with_past"]:
            export["sample"] = {**export["sample"], "past_sequence": export["sample"].get("past_sequence", DEFAULT_SAMPLE["past_sequence"])}
        out["export"] = export
        sample = {**DEFAULT_SAMPLE, **export["sample"]}
        validate = _with_defaults(doc.get("validate", {}), _deref("#/$defs/validate"))
        validate.setdefault("shapes", _default_shapes(validation_dims(kind, export["inputs"]), sample))
        validate.setdefault("atol", DEFAULT_ATOL)
        validate.setdefault("rtol", DEFAULT_RTOL)
        validate.setdefault("top1_min", DEFAULT_TOP1_MIN if task and task["language_model"] else None)
        validate.setdefault("cosine_min", DEFAULT_COSINE_MIN if validate["sentences"] else None)
        if validate["accuracy"] is not None:
            validate["accuracy"] = _with_defaults(validate["accuracy"], _deref("#/$defs/validate")["properties"]["accuracy"])
        out["validate"] = validate
    opt = doc.get("optimize")
    out["optimize"] = None if opt is None else _with_defaults(opt, _deref("#/$defs/optimize"))
    if out["optimize"] is not None:
        props = _deref("#/$defs/optimize")["properties"]
        for key in ("transformer", "float16"):
            value = out["optimize"].get(key)
            out["optimize"][key] = None if value is None else _with_defaults(value, props[key]["anyOf"][1])
        out["optimize"].setdefault("validate", {})
    out["quantize"] = [_with_defaults(q, _deref("#/$defs/quantize")) for q in doc.get("quantize", [])]
    for q in out["quantize"]:
        q.setdefault("validate", {})
        q.setdefault("op_types", None)
        q["calibration"] = _with_defaults(q.get("calibration", {}), _deref("#/$defs/quantize")["properties"]["calibration"])
    limits = doc.get("limits") or {}
    out["limits"] = {"memory_mb": limits.get("memory_mb"), "seconds": limits.get("seconds"), "steps": dict(limits.get("steps", {}))}
    gen = doc.get("generate")
    out["generate"] = None if gen is None else _with_defaults(gen, _deref("#/$defs/generate"))
    if out["generate"] is not None and out["generate"]["sampling"] is not None:
        out["generate"]["sampling"] = _with_defaults(out["generate"]["sampling"], _deref("#/$defs/generate")["properties"]["sampling"]["anyOf"][1])
    bench = doc.get("benchmark")
    out["benchmark"] = None if bench is None else _with_defaults(bench, _deref("#/$defs/benchmark"))
    if out["benchmark"] is not None and "shapes" not in out["benchmark"]:
        out["benchmark"]["shapes"] = _default_benchmark_shapes(out)
    out["providers"] = [_with_defaults(p, _deref("#/$defs/provider")) for p in doc.get("providers", [{"name": "CPUExecutionProvider"}])]
    return out


def _default_benchmark_shapes(resolved: dict[str, Any]) -> list[dict[str, int]]:
    """Batch 1 at sequence 128 for token models (the figure people quote), else the export sample."""
    export = resolved.get("export")
    if export is None:
        kind, src = next(iter(resolved["source"].items()))
        dims = _symbolic_dims(src.get("inputs", [])) if kind == "graph" else []
        return [{d: 1 for d in dims}]
    dims = _symbolic_dims(export["inputs"])
    if set(dims) == {"batch", "sequence"}:
        return [{"batch": 1, "sequence": 128}]
    return [{d: export["sample"][d] for d in dims}]


def _default_shapes(dims: list[str], sample: dict[str, int]) -> list[dict[str, int]]:
    """Three shapes: all ones, the export sample, and one larger than the sample in every dimension.

    Two of them differ from the sample, so an axis the export fixed by mistake fails validation.
    """
    if not dims:
        return [{}]
    return [{d: 1 for d in dims}, {d: sample[d] for d in dims}, {d: sample[d] * 2 + 1 for d in dims}]


def _with_defaults(section: dict[str, Any], sch: dict[str, Any]) -> dict[str, Any]:
    out = dict(section)
    for key, prop in sch.get("properties", {}).items():
        if key not in out and "default" in prop:
            default = prop["default"]
            out[key] = json.loads(json.dumps(default))
    return out

"""Cross-field checks of a recipe that passed its schema: what JSON Schema cannot say
(a dimension the inputs do not use, a step named in limits that does not exist, a
source that cannot carry an option), each a Problem at the key's position."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import cast

from onnxbuild._util import JsonValue
from onnxbuild.errors import Problem
from onnxbuild.recipe.model import is_torch_source
from onnxbuild.recipe.resolve import schema
from onnxbuild.recipe.sections import TARGETS
from onnxbuild.recipe.yamlpos import Path_, Positions, dotted
from onnxbuild.sources import is_decoder, source_kind, traced_kinds
from onnxbuild.spec import STEP_KINDS, Checking, Found, StepKind

# A recipe reaches these checks only after it passed recipe.schema.json: each cast below names
# a shape the schema requires of it.


def checking(doc: dict[str, JsonValue], kinds: Sequence[StepKind]) -> Checking:
    """What every kind's check reads, found once."""
    sources = cast("dict[str, dict[str, object]]", doc["source"])  # one source kind's mapping
    kind = next(iter(sources))
    src = sources[kind]
    traced = is_torch_source(sources)
    described = source_kind(kind)
    *others, last = traced_kinds()
    config = given if isinstance(given := src.get("config"), dict) else {}
    entries = tuple(variant_entries(doc))
    found = Checking(
        doc=doc,
        source=kind,
        src=src,
        task=task if isinstance(task := src.get("task"), str) else None,
        traced=traced,
        untraced_what=f"an ONNX file, {kind}.file" if "file" in src else kind,
        traced_kinds=f"{', '.join(others)} and {last}" if others else last,
        decoder=is_decoder(sources),
        two_files=described.seq2seq(src),
        three_files=described.vlm(src),
        max_positions=next(
            (config[k] for k in ("n_positions", "max_position_embeddings") if isinstance(config.get(k), int)), None
        ),
        variants=(
            "model",
            *_built_in(doc, kinds),
            # str() only narrows: variant_entries keeps the entries whose name is a string
            *(str(e["name"]) for _, _, e in entries),
        ),
        entries=entries,
    )
    for kind_of_step in kinds:
        found = kind_of_step.finds(found)
    return found


def _built_in(doc: Mapping[str, object], kinds: Sequence[StepKind]) -> list[str]:
    return [name for k in kinds if doc.get(k.name) for name in k.makes]


def semantic_problems(
    doc: dict[str, JsonValue], positions: Positions, shown: str, kinds: Sequence[StepKind]
) -> Iterable[Problem]:
    def problem(path: Path_, message: str, key: bool = False) -> Problem:
        pos = positions.of(path, key=key)
        return Problem(shown, pos[0] if pos else None, pos[1] if pos else None, dotted(path), message)

    c = checking(doc, kinds)
    built_in = list(c.variants[: len(c.variants) - len(c.entries)])
    for path, message, at_key in source_kind(c.source).check(c.src, doc):
        yield problem(path, message, key=at_key)
    for kind in kinds:
        for path, message, at_key in kind.check(c):
            yield problem(path, message, key=at_key)
    variant_names = list(c.variants)
    entries = list(c.entries)
    yield from (problem(path, message, key=at_key) for path, message, at_key in _variant_refs(doc, entries, built_in))
    for i, prov in enumerate(cast("list[dict[str, object]]", doc.get("providers", []))):  # {name, options} each
        unknown = _unknown_provider(prov.get("name"))
        if unknown:
            yield problem(("providers", i, "name"), unknown)
        options = cast("dict[str, object]", prov.get("options") or {})  # a provider's options: a mapping
        if prov.get("name") == "openvino":
            yield from (
                problem(("providers", i, "options", *path), message, key=at_key)
                for path, message, at_key in _openvino_options(options, c.traced)
            )
        wanted = options.get("variants") if prov.get("name") in TARGETS else None
        if wanted is None:
            continue
        if not isinstance(wanted, list) or not all(isinstance(w, str) for w in wanted):
            yield problem(
                ("providers", i, "options", "variants"),
                f"must be a list of variant names (this recipe has: {', '.join(variant_names)})",
            )
            continue
        for j, w in enumerate(wanted):
            if w not in variant_names:
                yield problem(
                    ("providers", i, "options", "variants", j),
                    f"no variant {w!r} (this recipe has: {', '.join(variant_names)})",
                )
    makers = {name: k.name for k in kinds for name in k.makes}
    per_variant = [k.name for k in kinds if k.each_variant]
    named = {f"{kind}.{e['name']}" for section, _, e in entries for kind in (section, *per_variant)} | {
        f"{kind}.{name}" for kind in per_variant for name in makers
    }
    limits = cast("dict[str, dict[str, object]]", doc.get("limits") or {})  # limits.steps: a mapping
    for step in limits.get("steps", {}):
        if step not in STEP_KINDS and step not in named:
            yield problem(
                ("limits", "steps", step),
                f"no such step or step kind (kinds: {', '.join(sorted(STEP_KINDS))}; "
                f"steps such as {', '.join(sorted(named)) or 'validate.int8'})",
                key=True,
            )
    for n, (section, i, e) in enumerate(entries):
        earlier = [p["name"] for _, _, p in entries[:n]]
        if e["name"] == "model" or e["name"] in makers:
            yield problem(
                (section, i, "name"), f"{e['name']!r} names a built-in variant; choose another name (e.g. int8)"
            )
        if e["name"] in earlier:
            yield problem((section, i, "name"), f"variant name {e['name']!r} is used twice; names must be unique")
        made_by = makers.get(made_from) if isinstance(made_from := e.get("from", ""), str) else None
        if made_by and e["from"] not in built_in:
            yield problem(
                (section, i, "from"), f"{section}s the {e['from']} variant, but the recipe has no {made_by} section"
            )


def traced_only(c: Checking, section: str) -> Iterable[Found]:
    """A section that applies only when the source is exported through torch."""
    if not c.traced and section in c.doc:
        yield (
            (section,),
            f"applies only to {c.traced_kinds} sources (this recipe's source is {c.untraced_what}); remove it",
            True,
        )


THREE_FILES = "not yet for image-text-to-text (three files)"
"""How a kind that has no way with a vision-language model's three files yet says so."""


def refuse_three_files(c: Checking, section: str) -> Iterable[Found]:
    """A section a vision-language model's three files cannot take yet, refused at its key."""
    if c.three_files and c.doc.get(section) not in (None, []):  # benchmark: {} asks for the defaults
        yield (section,), f"{THREE_FILES}; remove {section}", True


def shape_problems(c: Checking, section: str, need: Sequence[str], *, optional_needed: bool = True) -> Iterable[Found]:
    """``<section>.shapes``: each gives a size for every dimension in ``need`` (and for an optional
    one too unless ``optional_needed`` is false), and for no dimension the inputs do not vary."""
    block = c.doc.get(section) or {}
    shapes = block.get("shapes", []) if isinstance(block, dict) else []
    for i, shape in enumerate(shapes):
        for d in need:
            if d not in shape and (optional_needed or d not in c.optional):
                yield (
                    (section, "shapes", i),
                    f"missing a size for dimension {d!r} (the inputs use: {', '.join(need)})",
                    False,
                )
        for d in shape:
            if d not in c.dims and d not in c.optional:
                fixed = d in ("height", "width") and c.traced and source_kind(c.source).fixed_image_size(c.src)
                config = c.src.get("config")
                kind = config.get("model_type") if isinstance(config, Mapping) else None
                yield (
                    (section, "shapes", i, d),
                    f"a {kind} model takes images of its config.image_size "
                    f"only (its export fixes them); remove {d}, only the batch varies"
                    if fixed
                    else "unknown dimension (the inputs use: "
                    f"{', '.join([*need, *sorted(c.optional)]) or 'no symbolic dimensions'})",
                    True,
                )
        total = sum(v for d, v in shape.items() if d in ("sequence", "past_sequence") and isinstance(v, int))
        if c.max_positions and total > c.max_positions:
            yield (
                (section, "shapes", i),
                f"sequence + past_sequence is {total}, beyond the model's {c.max_positions} positions "
                f"(source.{c.source}.config); use at most {c.max_positions}",
                False,
            )


def variant_entries(doc: Mapping[str, object]) -> Iterable[tuple[str, int, dict[str, object]]]:
    """(section, index, entry) for every entry of a section the schema marks ``x-variants``
    (quantize, convert, ...): a list whose entries are variants named by ``name``, made from
    the variant ``from`` names by step ``<section>.<name>``, with their own ``validate:``."""
    for section, prop in schema()["properties"].items():
        value = doc.get(section)
        if prop.get("x-variants") and isinstance(value, list):
            yield from (
                (section, i, e) for i, e in enumerate(value) if isinstance(e, dict) and isinstance(e.get("name"), str)
            )


def _variant_refs(
    doc: Mapping[str, object], entries: list[tuple[str, int, dict[str, object]]], built_in: list[str]
) -> Iterable[Found]:
    """Keys the schema marks ``x-variant-ref`` (a variant section's entry naming other variants,
    as serve's ``decode`` and ``prefill``) must name a variant an earlier section makes, and two
    of them in one entry differ; a section's ``x-requires`` (a dotted key) must be set."""
    properties = schema()["properties"]
    defs = schema()["$defs"]
    earlier = list(built_in)
    for section in properties:
        in_section = [(i, e) for s, i, e in entries if s == section]
        ref = properties[section].get("items", {}).get("$ref", "")
        fields = defs.get(ref.rsplit("/", 1)[-1], {}).get("properties", {}) if ref else {}
        refs = [k for k, prop in fields.items() if prop.get("x-variant-ref")]
        requires = properties[section].get("x-requires")
        if in_section and requires:
            value: object = doc
            for part in requires["key"].split("."):
                value = value.get(part) if isinstance(value, dict) else None
            if not value:
                yield (section,), requires["message"], True
        for i, e in in_section:
            named = [(k, e[k]) for k in refs if isinstance(e.get(k), str)]
            for k, v in named:
                if v not in earlier:
                    yield (
                        (section, i, k),
                        f"no variant {v!r} to pair here (variants made before {section}: {', '.join(earlier)})",
                        False,
                    )
            if len(named) == 2 and named[0][1] == named[1][1]:
                yield (section, i, named[1][0]), f"names {named[1][1]!r} as {named[0][0]} too; pair two variants", False
        earlier += [str(e["name"]) for _, e in in_section]  # a string: variant_entries keeps no other


OPENVINO_OPTIONS = {
    "variants": "a list of variant names",
    "precision": "one of auto, f32, bf16, f16",
    "atol": "a number >= 0",
    "rtol": "a number >= 0",
    "top1_min": "a number from 0 to 1",
}


def _openvino_options(options: Mapping[str, object], torch_source: bool) -> Iterable[Found]:
    """The openvino target's options (the schema leaves provider options free-form)."""
    for key, value in options.items():
        if key not in OPENVINO_OPTIONS:
            yield (key,), f"unknown option for the openvino target (it takes: {', '.join(OPENVINO_OPTIONS)})", True
        elif (key == "precision" and value not in ("auto", "f32", "bf16", "f16")) or (
            key in ("atol", "rtol", "top1_min")
            and (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or value < 0
                or (key == "top1_min" and value > 1)
            )
        ):
            yield (key,), f"expected {OPENVINO_OPTIONS[key]}, got {value!r}", False
    if not torch_source and any(k in options for k in ("atol", "rtol", "top1_min")):
        yield (
            (),
            "tolerances need a source model to validate against (this recipe's source is an ONNX file or graph: "
            "the openvino target is only benchmarked)",
            True,
        )


KNOWN_PROVIDERS = (
    "CPUExecutionProvider",
    "CUDAExecutionProvider",
    "TensorrtExecutionProvider",
    "NvTensorRTRTXExecutionProvider",
    "MIGraphXExecutionProvider",
    "OpenVINOExecutionProvider",
    "DnnlExecutionProvider",
    "VitisAIExecutionProvider",
    "QNNExecutionProvider",
    "NnapiExecutionProvider",
    "VSINPUExecutionProvider",
    "JsExecutionProvider",
    "CoreMLExecutionProvider",
    "ACLExecutionProvider",
    "DmlExecutionProvider",
    "RknpuExecutionProvider",
    "WebNNExecutionProvider",
    "WebGpuExecutionProvider",
    "XnnpackExecutionProvider",
    "CANNExecutionProvider",
    "AzureExecutionProvider",
    "ROCMExecutionProvider",
    "ArmNNExecutionProvider",
    "SNPEExecutionProvider",
)
"""Every provider name onnxruntime knows (``onnxruntime.get_all_providers()`` of 1.31, and older
ones still in use), whether or not this machine's build has it: a typo is a recipe error, a
provider missing here is the benchmark's "not in this onnxruntime build"."""


def _unknown_provider(name: object) -> str | None:
    """Why ``name`` is no execution provider, or None. The schema checks the shape
    (``...ExecutionProvider``); a name outside :data:`KNOWN_PROVIDERS` is looked up in the
    installed onnxruntime (only then imported: a newer one may know more) before it is refused."""
    if not isinstance(name, str) or not name.endswith("ExecutionProvider") or name in KNOWN_PROVIDERS:
        return None
    known = list(KNOWN_PROVIDERS)
    try:
        import onnxruntime

        known += [p for p in onnxruntime.get_all_providers() if p not in known]
    except Exception:  # no onnxruntime here: the static list decides
        pass
    if name in known:
        return None
    import difflib

    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}? " if close else ""
    return (
        f"unknown execution provider {name!r}; {hint}onnxruntime knows: {', '.join(sorted(known))} (or web, openvino)"
    )

"""Cross-field checks of a recipe that passed its schema: what JSON Schema cannot say
(a dimension the inputs do not use, a step named in limits that does not exist, a
source that cannot carry an option), each a Problem at the key's position."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from onnxbuild.errors import Problem
from onnxbuild.recipe.model import is_torch_source
from onnxbuild.recipe.resolve import default_sample, schema, symbolic_dims, validation_dims
from onnxbuild.recipe.sections import TARGETS
from onnxbuild.recipe.tasks import WITH_PAST_INPUTS
from onnxbuild.recipe.variants import TEXT_GATES
from onnxbuild.recipe.yamlpos import Path_, Positions, dotted
from onnxbuild.sources import is_decoder, source_kind, traced_kinds
from onnxbuild.spec import STEP_KINDS


def semantic_problems(doc: dict[str, Any], positions: Positions, shown: str) -> Iterable[Problem]:
    def problem(path: Path_, message: str, key: bool = False) -> Problem:
        pos = positions.of(path, key=key)
        return Problem(shown, pos[0] if pos else None, pos[1] if pos else None, dotted(path), message)

    kind = next(iter(doc["source"]))
    src = doc["source"][kind]
    torch_source = is_torch_source(doc["source"])
    described = source_kind(kind)
    if not torch_source:
        what = "an ONNX file, huggingface.file" if "file" in src else kind
        *others, last = traced_kinds()
        traced = f"{', '.join(others)} and {last}" if others else last
        for section in ("export", "validate"):
            if section in doc:
                yield problem(
                    (section,),
                    f"applies only to {traced} sources (this recipe's source is {what}); remove it",
                    key=True,
                )
    for path, message, at_key in described.check(src, doc):
        yield problem(path, message, key=at_key)
    from onnxbuild.sources.usercode import ref_problem

    accuracy = (doc.get("validate") or {}).get("accuracy")
    if isinstance(accuracy, dict) and isinstance(accuracy.get("dataset"), str):
        wrong = ref_problem(accuracy["dataset"])
        if wrong:
            yield problem(("validate", "accuracy", "dataset"), wrong)

    export = doc.get("export", {})
    with_past = bool(export.get("with_past"))
    two_files = described.seq2seq(src)  # its own check speaks of with_past
    if with_past and not is_decoder(doc["source"]) and not two_files:
        what = f"task {src.get('task')}" if kind == "huggingface" else f"a {kind} source"
        yield problem(
            ("export", "with_past"),
            f"applies to huggingface text-generation models (this recipe has {what}); remove it",
        )
    if with_past and not is_decoder(doc["source"]):
        with_past = False
    if "generate" in doc and doc["generate"] is not None:
        gen = doc["generate"]
        if not with_past and not two_files:
            yield problem(
                ("generate",),
                "generates through the KV cache; add export.with_past: true (a huggingface text-generation model)",
                key=True,
            )
        if gen.get("prompt") is not None and gen.get("prompt_ids") is not None:
            yield problem(
                ("generate", "prompt_ids"), "give either prompt (text) or prompt_ids (token ids), not both", key=True
            )
    if torch_source:
        default_inputs = WITH_PAST_INPUTS if with_past else described.default_io(src)[0] if described.default_io else []
        inputs = export.get("inputs") or default_inputs
        export_dims = symbolic_dims(inputs)
        dims = validation_dims(kind, src, inputs)
        optional = {"past_sequence"} if with_past else set()
        defaults = default_sample(kind, src) if isinstance(src, dict) else {}
        sample = export.get("sample", {d: defaults[d] for d in export_dims if d in defaults})
        missing = [d for d in export_dims if d not in sample]
        where = ("export", "sample") if "sample" in export else ("export",) if "export" in doc else ("source", kind)
        fixed = described.fixed_image_size(src)  # its own check asks for config.image_size
        images = (
            {"height", "width"}
            if any(isinstance(t, dict) and t.get("name") == "pixel_values" for t in inputs)
            else set()
        )
        if images & set(missing) and not fixed:
            yield problem(
                where,
                "an image model is exported at one sample size: "
                "give export.sample: {batch: 2, height: 224, width: 224} (or config.image_size)",
                key=True,
            )
        for d in missing:
            if d not in images:
                yield problem(where, f"give a sample size for dimension {d!r} (e.g. sample: {{{d}: 2}})", key=True)
        for i, shape in enumerate(doc.get("validate", {}).get("shapes", [])):
            for d in dims:
                if d not in shape:
                    yield problem(
                        ("validate", "shapes", i),
                        f"missing a size for dimension {d!r} (the inputs use: {', '.join(dims)})",
                    )
            for d in shape:
                if d not in dims and d not in optional:
                    yield problem(
                        ("validate", "shapes", i, d),
                        "unknown dimension (the inputs use: "
                        f"{', '.join([*dims, *optional]) or 'no symbolic dimensions'})",
                        key=True,
                    )
        config = src.get("config") if kind == "huggingface" and isinstance(src.get("config"), dict) else {}
        max_positions = next(
            (config[k] for k in ("n_positions", "max_position_embeddings") if isinstance(config.get(k), int)), None
        )
        if max_positions:
            for section in ("validate", "benchmark"):
                block = doc.get(section) or {}
                for i, shape in enumerate(block.get("shapes", []) if isinstance(block, dict) else []):
                    total = sum(
                        v for d, v in shape.items() if d in ("sequence", "past_sequence") and isinstance(v, int)
                    )
                    if total > max_positions:
                        yield problem(
                            (section, "shapes", i),
                            f"sequence + past_sequence is {total}, beyond the model's {max_positions} positions "
                            f"(source.huggingface.config); use at most {max_positions}",
                        )
        bench = doc.get("benchmark") or {}
        for i, shape in enumerate(bench.get("shapes", []) if isinstance(bench, dict) else []):
            for d in export_dims:  # what the inputs need (validation's decoder_sequence is not one)
                if d not in shape and d not in optional:
                    yield problem(
                        ("benchmark", "shapes", i),
                        f"missing a size for dimension {d!r} (the inputs use: {', '.join(export_dims)})",
                    )
            for d in shape:
                if d not in dims and d not in optional:
                    yield problem(
                        ("benchmark", "shapes", i, d),
                        "unknown dimension (the inputs use: "
                        f"{', '.join([*export_dims, *optional]) or 'no symbolic dimensions'})",
                        key=True,
                    )
        names = [t["name"] for t in inputs]
        for i, name in enumerate(names):
            if name in names[:i]:
                yield problem(
                    ("export", "inputs", i, "name"),
                    f"input {name!r} is listed twice (first as export.inputs[{names.index(name)}])",
                )
        validate = doc.get("validate", {})
        if validate.get("sentences") is not None and kind != "huggingface":
            yield problem(
                ("validate", "sentences"),
                "needs a huggingface source, whose tokenizer turns the sentences into inputs "
                f"(this recipe's source is {kind})",
                key=True,
            )
        if validate.get("cosine_min") is not None and validate.get("sentences") is None:
            yield problem(
                ("validate", "cosine_min"),
                "compares sentence embeddings; add validate.sentences (the text to embed)",
                key=True,
            )
        text = validate.get("text")
        if isinstance(text, dict):
            given = [k for k in ("file", "package", "inline") if text.get(k) is not None]
            if not is_decoder(doc["source"]):
                yield problem(
                    ("validate", "text"),
                    "measures perplexity of a text-generation model (task: text-generation); "
                    "for an encoder use validate.sentences",
                    key=True,
                )
            elif len(given) != 1:
                got = f"it has {' and '.join(given)}" if given else "it has none"
                yield problem(
                    ("validate", "text"),
                    "give exactly one of file (beside the recipe), package (pkg/file.txt) and inline "
                    f"(the text itself); {got}",
                    key=True,
                )
        for i, q in enumerate(doc.get("quantize") or []):
            if (
                isinstance(q, dict)
                and q.get("method") == "gguf"
                and not (
                    kind == "huggingface"
                    and str(src.get("package") or src.get("model") or "").lower().endswith(".gguf")
                )
            ):
                yield problem(
                    ("quantize", i, "method"),
                    "gguf carries a GGUF file's own blocks: the source must name a .gguf file "
                    "(source.huggingface.model or package)",
                )
            elif isinstance(q, dict) and q.get("method") == "gguf" and q.get("from", "model") != "optimized":
                yield problem(
                    ("quantize", i, "method"),
                    "gguf writes the blocks into the fused decoder graph: add from: optimized "
                    "(with optimize.decoder: fused)",
                )
            plan = q.get("budget") if isinstance(q, dict) else None
            if isinstance(plan, dict) and plan.get("ppl_increase_max") is None and plan.get("kld_max") is None:
                yield problem(
                    ("quantize", i, "budget"),
                    "give ppl_increase_max and/or kld_max: "
                    "the figures the plan keeps the file within (e.g. {ppl_increase_max: 0.05})",
                    key=True,
                )
            elif isinstance(plan, dict) and q.get("method") not in ("int4", "weight_only"):
                yield problem(
                    ("quantize", i, "budget"),
                    "plans weight-only precision per layer: method int4 or weight_only "
                    f"(this entry's is {q.get('method')})",
                    key=True,
                )
            elif isinstance(plan, dict) and not is_decoder(doc["source"]):
                yield problem(
                    ("quantize", i, "budget"),
                    "measures perplexity on text: it applies to text-generation models",
                    key=True,
                )
        gates = [g for g in TEXT_GATES if validate.get(g) is not None]
        own = [(path, g) for path, section in _variant_validates(doc) for g in TEXT_GATES if g in section]
        if text is None and (gates or own):
            where, gate = (("validate", gates[0]), gates[0]) if gates else (own[0][0] + (own[0][1],), own[0][1])
            yield problem(
                where, f"{gate} gates quality on real text; add validate.text (the text to measure on)", key=True
            )
    entries = list(variant_entries(doc))
    optimize = doc.get("optimize")
    variant_names: list[str] = [
        "model",
        *(["optimized"] if optimize else []),
        *(e["name"] for _, _, e in entries),
    ]
    built_in = variant_names[: len(variant_names) - len(entries)]
    yield from (problem(path, message, key=at_key) for path, message, at_key in _variant_refs(doc, entries, built_in))
    for i, prov in enumerate(doc.get("providers", [])):
        unknown = _unknown_provider(prov.get("name"))
        if unknown:
            yield problem(("providers", i, "name"), unknown)
        if prov.get("name") == "openvino":
            yield from (
                problem(("providers", i, "options", *path), message, key=at_key)
                for path, message, at_key in _openvino_options(prov.get("options") or {}, torch_source)
            )
        wanted = (prov.get("options") or {}).get("variants") if prov.get("name") in TARGETS else None
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
    for variant in doc.get("expect") or {}:
        if variant != "all" and variant not in variant_names:
            yield problem(
                ("expect", variant),
                f"no variant {variant!r} (this recipe has: {', '.join(variant_names)}; `all` for every one)",
                key=True,
            )
    kinds = set(STEP_KINDS)
    named = {f"{kind}.{e['name']}" for section, _, e in entries for kind in (section, "validate", "expect")} | {
        "validate.optimized",
        "expect.optimized",
    }
    for step in (doc.get("limits") or {}).get("steps", {}):
        if step not in kinds and step not in named:
            yield problem(
                ("limits", "steps", step),
                f"no such step or step kind (kinds: {', '.join(sorted(kinds))}; "
                f"steps such as {', '.join(sorted(named)) or 'validate.int8'})",
                key=True,
            )
    decoder = (optimize or {}).get("decoder")
    if decoder == "fused":
        from onnxbuild.recipe.families import FUSED_DECODERS

        hf = (doc.get("source") or {}).get("huggingface")
        model_type = ((hf or {}).get("config") or {}).get("model_type")
        if not hf or hf.get("task") != "text-generation" or not with_past:
            yield problem(
                ("optimize", "decoder"),
                "fused graphs are for text-generation models exported with export.with_past: true; "
                "use decoder: auto or export",
            )
        elif model_type is not None and model_type not in FUSED_DECODERS:
            yield problem(
                ("optimize", "decoder"),
                f"no fused graph for model_type {model_type!r} (there is one for {', '.join(FUSED_DECODERS)}); "
                "use decoder: auto or export",
            )
    for n, (section, i, e) in enumerate(entries):
        earlier = [p["name"] for _, _, p in entries[:n]]
        if e["name"] in ("model", "optimized"):
            yield problem(
                (section, i, "name"), f"{e['name']!r} names a built-in variant; choose another name (e.g. int8)"
            )
        if e["name"] in earlier:
            yield problem((section, i, "name"), f"variant name {e['name']!r} is used twice; names must be unique")
        if e.get("from") == "optimized" and not optimize:
            yield problem(
                (section, i, "from"), f"{section}s the optimized variant, but the recipe has no optimize section"
            )


def variant_entries(doc: dict[str, Any]) -> Iterable[tuple[str, int, dict[str, Any]]]:
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
    doc: dict[str, Any], entries: list[tuple[str, int, dict[str, Any]]], built_in: list[str]
) -> Iterable[tuple[tuple[Any, ...], str, bool]]:
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
            value: Any = doc
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
        earlier += [e["name"] for _, e in in_section]


OPENVINO_OPTIONS = {
    "variants": "a list of variant names",
    "precision": "one of auto, f32, bf16, f16",
    "atol": "a number >= 0",
    "rtol": "a number >= 0",
    "top1_min": "a number from 0 to 1",
}


def _openvino_options(options: dict[str, Any], torch_source: bool) -> Iterable[tuple[tuple[Any, ...], str, bool]]:
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


def _variant_validates(doc: dict[str, Any]) -> Iterable[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Each variant's own ``validate:`` section, with where it is."""
    opt = doc.get("optimize")
    if isinstance(opt, dict) and isinstance(opt.get("validate"), dict):
        yield ("optimize", "validate"), opt["validate"]
    for section, i, e in variant_entries(doc):
        if isinstance(e.get("validate"), dict):
            yield (section, i, "validate"), e["validate"]


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


def _unknown_provider(name: Any) -> str | None:
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

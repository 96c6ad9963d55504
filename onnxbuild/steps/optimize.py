"""The ``optimize`` step: ONNX Runtime's transformer optimizer and offline graph optimization.

Order: transformer fusions first (they match the exporter's patterns), then ORT's own
graph optimizations saved offline. Levels ``extended`` and above fuse into kernels of
a particular provider and CPU, so the key of this step includes the target provider and
a fingerprint of the CPU's features, and the report says so.

One module (~470 lines): planning, the passes one file goes through (a fused decoder graph,
ONNX Runtime's transformer fusions, float16, the SkipLayerNormalization split, the graph
level), an encoder-decoder's files one by one and the report over all of them share the
step's params and staging folder; the fused decoder graphs themselves are in fusion/.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, cast

from onnxbuild import environment
from onnxbuild._util import every_node, pick, pretty_json
from onnxbuild.errors import StepError
from onnxbuild.recipe.checks import refuse_three_files
from onnxbuild.recipe.families import no_fused_graph
from onnxbuild.recipe.model import Recipe
from onnxbuild.recipe.sections import TARGETS, OptimizeSection, Provider
from onnxbuild.recipe.tasks import DECODER_FILE
from onnxbuild.recipe.variants import MODEL, SOURCE_RECORD, variant
from onnxbuild.sources import is_decoder, section_for, source_kind
from onnxbuild.spec import Checking, Found, Planning, StepInput, StepKind, Variant
from onnxbuild.steps.base import StepContext, StepResult, StepSpec, genai_beside, read_source_record
from onnxbuild.steps.exporting import section as export_kind
from onnxbuild.steps.validating import rules

if TYPE_CHECKING:
    import onnx

    from onnxbuild.fusion.decoder import Built
    from onnxbuild.fusion.passes import Applied

OWN_KEYS = ("level", "decoder", "transformer", "float16")
"""What of ``optimize:`` this step reads: its ``validate:`` block is the validate.optimized step's;
``skip_layer_norm`` enters resolved against the providers, as the ``skip_layer_norm`` param."""

PACKAGES = ("onnxruntime", "onnx", "torch", "transformers")

FUSED_OPS = (
    "Attention",
    "MultiHeadAttention",
    "GroupQueryAttention",
    "EmbedLayerNormalization",
    "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "LayerNormalization",
    "SimplifiedLayerNormalization",
    "BiasGelu",
    "FastGelu",
    "Gelu",
    "BiasSkipLayerNormalization",
    "GemmFastGelu",
    "RotaryEmbedding",
)

LEVELS = {
    "none": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "layout": "ORT_ENABLE_LAYOUT",
    "all": "ORT_ENABLE_ALL",
}
HARDWARE_BOUND = frozenset({"extended", "layout", "all"})
EXTERNAL_ABOVE = 1_800_000_000
"""A fused graph's weights above this many bytes are written as external data, as the export's
(``export.external_data: auto``): protobuf caps one file at 2 GB."""


MEMORY = (1.7, 1000)
"""Peak as (x the fp32 weights, MB more), measured on a Llama-3.2-1B shape (4.94 GB): 7.4 GB in
76 s, the torch model and ONNX Runtime's pass over the fused graph, whose weights go to external
data as they are written (was past 21 GB before, holding and serializing every weight)."""


def variants(recipe: Recipe, earlier: tuple[Variant, ...]) -> list[Variant]:
    """``optimized``, from the exported model, where the recipe has an optimize section."""
    opt = recipe.resolved.get("optimize")
    if not opt:
        return []
    return [
        variant(
            recipe,
            "optimized",
            "optimize",
            "optimized/",
            "fp16" if opt["float16"] else "fp32",
            "model",
            rules.own(opt),
        )
    ]


def plan(p: Planning) -> list[StepSpec]:
    """The ``optimized`` variant: ONNX Runtime's graph optimizations (keyed by this CPU at the
    hardware-bound levels), or a fused decoder written from the weights."""
    r = p.recipe.resolved
    opt = r.get("optimize")
    if not opt:
        return []
    # The first ONNX Runtime provider (web is onnxruntime-web, not a provider of this ORT).
    provider = next((q["name"] for q in r["providers"] if q["name"] not in TARGETS), "CPUExecutionProvider")
    hardware = opt["level"] in HARDWARE_BOUND
    # A decoder with a KV cache may get its graph written from the weights (fusion/decoder.py):
    # then the step reads the model as the source step recorded it.
    traced = export_kind.section(r)
    fuse = (
        is_decoder(r["source"])
        and bool(traced and traced["with_past"] and traced["exporter"] != "fused")  # fused: the export already is
        and opt["decoder"] != "export"
    )
    model_step = p.model_step
    files = p.variants[0].files  # an encoder-decoder's two files, each optimized alike
    return [
        StepSpec(
            name="optimize",
            kind="optimize",
            params={
                "optimize": pick(opt, OWN_KEYS if fuse else set(OWN_KEYS) - {"decoder"}),
                "source": section_for(r["source"], drop=("tokenizer",), unset=("package",))
                if source_kind(p.recipe.source_kind).transformers
                else None,
                "input": MODEL,
                "provider": provider if hardware else None,
                "skip_layer_norm": skip_layer_norm(opt["skip_layer_norm"], r["providers"]),
                **({"fuse_decoder": True, "external_data": traced["external_data"]} if fuse and traced else {}),
                **({"files": list(files)} if files else {}),
            },
            deps=(model_step, "source") if fuse else (model_step,),
            inputs=(StepInput(model_step, MODEL), StepInput("source", SOURCE_RECORD))
            if fuse
            else tuple(StepInput(model_step, f) for f in files or (MODEL,)),
            outputs=(*(f"optimized/{f}" for f in files or (MODEL,)), "reports/optimize.json"),
            identity={"cpu": environment.cpu_fingerprint()} if hardware else {},
        )
    ]


CPU_ONLY = frozenset({"CPUExecutionProvider", *TARGETS})
"""Providers whose kernels run on the CPU: onnxruntime's CPU provider, onnxruntime-web (its
CPU kernels compiled to wasm) and OpenVINO's CPU plugin."""


def skip_layer_norm(asked: str, providers: list[Provider]) -> str:
    """``auto`` resolved: ``sum`` when every provider runs on the CPU, else ``fused``. The
    resolved value is a param of its own: a providers change that flips it reruns optimize."""
    if asked != "auto":
        return asked
    return "sum" if all(q["name"] in CPU_ONLY for q in providers) else "fused"


def measured(params: Mapping[str, object]) -> str:
    """Why this step's output differs by machine ("" when it does not): levels from extended up."""
    level = cast(OptimizeSection, params["optimize"])["level"]  # the section plan() put in the params
    return f"optimize level {level} is fused for this CPU and provider" if level in HARDWARE_BOUND else ""


def model_dims(source: dict[str, dict[str, object]] | None, recipe_dir: Path, file: str = MODEL) -> tuple[int, int]:
    """(num_heads, hidden_size) from the transformers config, when the source has one: an
    encoder-decoder's decoder file (``file``) has its decoder's heads (BART's family names
    them apart from the encoder's; T5's are the same)."""
    if not source:
        return 0, 0
    ((kind, src),) = source.items()
    config = source_kind(kind).config(src, recipe_dir)
    first = ("decoder_attention_heads",) if file == DECODER_FILE else ()
    heads = next(
        (
            config[k]
            for k in (*first, "num_attention_heads", "n_head", "num_heads", "encoder_attention_heads")
            if k in config
        ),
        0,
    )  # T5, BART/Whisper
    hidden = next((config[k] for k in ("hidden_size", "n_embd", "d_model") if k in config), 0)
    return int(heads or 0), int(hidden or 0)


def model_type_for(source: dict[str, dict[str, object]] | None, recipe_dir: Path) -> str:
    """onnxruntime's transformer optimizer's model type for a transformers source's config
    (the recipe's, or the one the source names: a Hub id's)."""
    if not source:
        return "bert"
    ((kind, src),) = source.items()
    if not source_kind(kind).transformers:
        return "bert"
    model_type = str(source_kind(kind).config(src, recipe_dir).get("model_type") or "")
    if model_type in ("gpt2", "bert", "bart", "t5", "gpt_neox", "phi", "clip", "vit", "swin"):
        return model_type
    if model_type in ("whisper", "marian", "mbart"):
        return "bart"  # the same attention blocks; ONNX Runtime optimizes Whisper as bart
    return "gpt2" if src["task"] == "text-generation" else "bert"


def run(ctx: StepContext, spec: StepSpec) -> StepResult:
    opt = cast(OptimizeSection, spec.params["optimize"])
    if spec.params.get("files"):
        return _each_file(ctx, spec, opt)
    report, before = _optimize(ctx, spec, opt, ctx.input(spec.params["input"]), ctx.output("optimized/model.onnx"))
    return _finish(ctx, spec, opt, report, before, [ctx.output("optimized/model.onnx")])


def _each_file(ctx: StepContext, spec: StepSpec, opt: OptimizeSection) -> StepResult:
    """An encoder-decoder: each file through the same passes; the report sums their nodes and
    gives each file's fused ops."""
    import onnx

    before: Counter[str] = Counter()
    outs = []
    files: dict[str, dict[str, object]] = {}
    report: dict[str, object] = {}
    for name in spec.params["files"]:
        out = ctx.output(f"optimized/{name}")
        report, one = _optimize(ctx, spec, opt, ctx.input(name), out, name)
        before.update(one)
        outs.append(out)
        after = _histogram(onnx.load_model(str(out), load_external_data=False))
        files[name] = {
            "transformer": report["transformer"],
            "fused_ops": {op: after[op] for op in FUSED_OPS if op in after},
            "attention_rewritten": report.pop("attention_fusion", 0),
        }
    report["files"] = files
    return _finish(ctx, spec, opt, report, dict(before), outs)


def _optimize(
    ctx: StepContext, spec: StepSpec, opt: OptimizeSection, src_path: Path, out: Path, file: str = MODEL
) -> tuple[dict[str, object], dict[str, int]]:
    """One file through the fused decoder (a decoder's), ORT's transformer fusions, fp16 and the graph level."""
    import onnx
    import onnxruntime as ort

    source = spec.params.get("source")
    report: dict[str, object] = {"level": opt["level"], "transformer": None, "float16": None}
    current = src_path
    exported = onnx.load_model(str(src_path), load_external_data=False)
    before = _histogram(exported)
    staged = ctx.output_dir / "stage-fused.onnx"
    fused_graph = _fused_decoder(ctx, spec, exported, staged) if spec.params.get("fuse_decoder") else None
    external = any(ctx.output_dir.glob("stage-fused.onnx.data"))
    if fused_graph is not None:
        onnx.save_model(fused_graph.model, str(staged))
        current = staged
        report["decoder"] = {"graph": "fused", "family": fused_graph.family, "fused_ops": fused_graph.fused_ops}
    elif spec.params.get("fuse_decoder"):
        report["decoder"] = {"graph": "export", "why": "no fused graph for this architecture (optimize.decoder: auto)"}
    if opt["transformer"] is not None and fused_graph is None:
        from onnxruntime.transformers.fusion_options import FusionOptions
        from onnxruntime.transformers.optimizer import optimize_model

        t = opt["transformer"]
        heads, hidden = model_dims(source, ctx.recipe_dir, file)
        heads = t["num_heads"] or heads
        hidden = t["hidden_size"] or hidden
        model_type = t.get("model_type") or model_type_for(source, ctx.recipe_dir)
        options = FusionOptions(model_type)
        if model_type == "bart":
            # Cross attention (keys and values from the encoder file) and a decoder's self
            # attention over its cache fuse only as MultiHeadAttention; the recipe may say otherwise.
            options.use_multi_head_attention = True
        for key, value in t["fusion_options"].items():
            if not hasattr(options, key):
                raise StepError(
                    f"optimize.transformer.fusion_options.{key}: not a fusion option of onnxruntime (known: "
                    f"{', '.join(sorted(vars(options)))})"
                )
            setattr(options, key, value)
        try:
            optimized = optimize_model(
                str(current),
                model_type=model_type,
                num_heads=heads,
                hidden_size=hidden,
                optimization_options=options,
                opt_level=t["opt_level"],
                only_onnxruntime=t["only_onnxruntime"],
                use_gpu=False,
            )
        except Exception as exc:
            hint = ""
            if isinstance(exc, IndexError):
                # Measured: ORT's fusions index bias inputs that onnxscript drops from dynamo graphs.
                hint = (
                    "; this is how it fails on graphs from the dynamo exporter: use export.exporter: torchscript, "
                    "or optimize.transformer: null"
                )
            raise StepError(
                f"onnxruntime's transformer optimizer failed ({model_type}, heads {heads}, hidden {hidden}): "
                f"{type(exc).__name__}: {exc}{hint}"
            ) from None
        staged = ctx.output_dir / "stage-transformer.onnx"
        optimized.save_model_to_file(str(staged))
        current = staged
        report["transformer"] = {
            "model_type": model_type,
            "num_heads": heads,
            "hidden_size": hidden,
            "opt_level": t["opt_level"],
        }
    if opt["transformer"] is not None and fused_graph is None and file != MODEL:
        current = _fuse_attention(ctx, current, report)
    if opt["float16"] is not None:
        from onnxruntime.transformers.onnx_model import OnnxModel

        model = OnnxModel(onnx.load_model(str(current)))
        model.convert_float_to_float16(keep_io_types=opt["float16"]["keep_io_types"])
        staged = ctx.output_dir / "stage-fp16.onnx"
        model.save_model_to_file(str(staged))
        current = staged
        report["float16"] = {"keep_io_types": opt["float16"]["keep_io_types"]}
    if spec.params.get("skip_layer_norm") == "sum":
        current = _split_skip_layer_norm(ctx, current, report)
    if opt["level"] != "none":
        options = ort.SessionOptions()
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[opt["level"]])
        options.optimized_model_filepath = str(out)
        options.log_severity_level = 3
        if external:  # ONNX Runtime writes the weights beside the file, as the fused graph had them
            options.add_session_config_entry(
                "session.optimized_model_external_initializers_file_name", f"{out.name}.data"
            )
            options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        try:
            ort.InferenceSession(str(current), options, providers=[spec.params["provider"]])
        except Exception as exc:
            raise StepError(f"ONNX Runtime could not optimize the model at level {opt['level']}: {exc}") from None
    else:
        import shutil

        shutil.copyfile(current, out)  # the export itself may be the input: never move it
        if external:
            shutil.copyfile(f"{current}.data", f"{out}.data")
    for staged in ctx.output_dir.glob("stage-*"):
        staged.unlink()
    if fused_graph is not None:
        report["fused_summary"] = f"fused {fused_graph.family} graph from the weights; "
    return report, before


def _fuse_attention(ctx: StepContext, current: Path, report: dict[str, object]) -> Path:
    """An encoder-decoder's files: the eager attention ORT's patterns missed (T5's, BART's) as
    ONNX's Attention (fusion/attention.py); the count goes in optimize.json."""
    import onnx

    from onnxbuild.fusion import attention

    rewritten, count = attention.fuse(onnx.load_model(str(current)))
    report["attention_fusion"] = count
    _ran(report, attention.PASS.ran(count))
    if not count:
        return current
    staged = ctx.output_dir / "stage-attention.onnx"
    onnx.save_model(rewritten, str(staged))
    return staged


def _ran(report: dict[str, object], applied: Applied) -> None:
    """A pass's run in optimize.json's ``passes`` (fusion/passes.py): its name and its rewrites,
    0 where it left the model unchanged."""
    runs = report.setdefault("passes", [])
    assert isinstance(runs, list)
    runs.append(applied)


def _split_skip_layer_norm(ctx: StepContext, current: Path, report: dict[str, object]) -> Path:
    """SkipLayerNormalization -> Sum + LayerNormalization (fusion/layernorm.py says why);
    the count goes in optimize.json. A file with external weights is left fused (said so):
    rewriting it here would break the weights' relative paths."""
    import onnx

    from onnxbuild.fusion.layernorm import MIN_OPSET, PASS, default_opset, split_skip_layer_norm

    model = onnx.load_model(str(current), load_external_data=False)
    if not any(n.op_type == "SkipLayerNormalization" for n in model.graph.node):
        return current
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        report["skip_layer_norm"] = {
            "mode": "fused",
            "why": "weights stored outside the file: left as SkipLayerNormalization",
        }
        return current
    if default_opset(model) < MIN_OPSET:
        report["skip_layer_norm"] = {
            "mode": "fused",
            "why": f"opset {default_opset(model)} has no LayerNormalization (needs {MIN_OPSET}): "
            "left as SkipLayerNormalization",
        }
        return current
    count = split_skip_layer_norm(model)
    _ran(report, PASS.ran(count))
    staged = ctx.output_dir / "stage-sum.onnx"
    onnx.save_model(model, str(staged))
    report["skip_layer_norm"] = {
        "mode": "sum",
        "split": count,
        "why": "every provider runs on the CPU, "
        "where ONNX Runtime's SkipLayerNormalization kernel is slower than Sum + LayerNormalization",
    }
    return staged


def _finish(
    ctx: StepContext,
    spec: StepSpec,
    opt: OptimizeSection,
    report: dict[str, object],
    before: dict[str, int],
    outs: list[Path],
) -> StepResult:
    """reports/optimize.json and the step's summary, over every file written."""
    import onnx

    how = report.pop("fused_summary", "")
    after: Counter[str] = Counter()
    for out in outs:
        after.update(_histogram(onnx.load_model(str(out), load_external_data=False)))
    fused = {op: after.get(op, 0) for op in FUSED_OPS if after.get(op, 0) or before.get(op, 0)}
    report.update(
        provider=spec.params["provider"],
        hardware_bound=opt["level"] in HARDWARE_BOUND,
        cpu_fingerprint=spec.identity.get("cpu") if opt["level"] in HARDWARE_BOUND else None,
        fused_ops=fused,
        nodes_before=sum(before.values()),
        nodes_after=sum(after.values()),
        op_types=dict(sorted(after.items(), key=lambda kv: (-kv[1], kv[0]))),
    )
    if report["hardware_bound"]:
        report["note"] = (
            f"level {opt['level']} ties the model to {spec.params['provider']} on this CPU "
            f"(fingerprint {report['cpu_fingerprint']}); rebuilt elsewhere it may differ"
        )
    ctx.output("reports/optimize.json").write_text(pretty_json(report), encoding="utf-8")
    fused_text = ", ".join(f"{k} {v}" for k, v in fused.items()) or "no fused ops"
    extra = genai_beside(ctx, "model.onnx", "optimized") if not spec.params.get("files") else ()
    extra += tuple(f"optimized/{o.name}.data" for o in outs if o.with_name(f"{o.name}.data").is_file())
    return StepResult(
        summary=f"{how}{report['nodes_before']} -> {report['nodes_after']} nodes; {fused_text}",
        data={"fused_ops": fused},
        extra_outputs=extra,
    )


def _fused_decoder(ctx: StepContext, spec: StepSpec, exported: onnx.ModelProto, staged: Path) -> Built | None:
    """The decoder's fused graph from its weights, or None when ``auto`` finds no fused graph
    for its architecture (``fused`` then is an error naming the supported ones). Weights of
    more than EXTERNAL_ABOVE bytes, or any where ``export.external_data`` is ``always``, go to
    ``<staged>.data`` as they are written (fusion/decoder.Graph)."""
    from onnxbuild.fusion import decoder
    from onnxbuild.sources.torchmodel import lazy_source_model, load_source_model

    source = spec.params["source"]
    record = read_source_record(ctx)
    # from the checkpoint's files, one tensor at a time, where there are any; else transformers' model
    lazy = lazy_source_model(source, record, ctx.recipe_dir)
    if lazy is not None:
        model, weights = lazy
        kind = str(model._config.model_type)
    else:
        model = load_source_model(source, record, ctx.recipe_dir).float().eval()
        weights, kind = 4 * sum(p.numel() for p in model.parameters()), str(model.config.model_type)
    if spec.params["optimize"]["decoder"] == "auto" and not decoder.supported(kind):
        return None
    mode = spec.params.get("external_data", "auto")
    if mode == "always" or (mode == "auto" and weights > EXTERNAL_ABOVE):
        location = f"{staged.name}.data"
        with open(staged.parent / location, "wb") as data:
            return decoder.build(model, exported, data, location)
    return decoder.build(model, exported)


def _histogram(model: onnx.ModelProto) -> dict[str, int]:
    return dict(Counter(n.op_type for n in every_node(model.graph)))


def check(c: Checking) -> Iterable[Found]:
    """A fused decoder graph exists for the model's architecture and needs its KV cache."""
    yield from refuse_three_files(c, "optimize")
    if ((c.doc.get("optimize") or {}).get("decoder")) != "fused":
        return
    traced = export_kind.section(c.doc)
    if traced is not None and traced.get("exporter") == "fused":
        yield (
            ("optimize", "decoder"),
            "export.exporter: fused already writes the fused graph: remove optimize.decoder "
            "(or the optimize section; quantize from: model)",
            False,
        )
        return
    if not c.with_past:
        yield (
            ("optimize", "decoder"),
            "fused graphs are for text-generation models exported with export.with_past: true; "
            "use decoder: auto or export",
            False,
        )
    elif missing := no_fused_graph(c.src.get("config")):
        yield ("optimize", "decoder"), f"{missing}; use decoder: auto or export", False


KIND = StepKind(
    name="optimize",
    packages=PACKAGES,
    plan=plan,
    run=run,
    memory=MEMORY,
    measured=measured,
    variants=variants,
    imports=("onnxruntime",),
    loads_model=True,
    check=check,
    makes=("optimized",),
)
"""What this kind says of itself (onnxbuild.spec.StepKind)."""

"""What a step is: a spec the planner builds, a context the runner gives it, a result it returns.

Plain data at the bottom of the layers: the engine plans and runs these without knowing
any step kind (a spec carries its kind's version, packages and entry point), and the
kinds (onnxbuild.steps) read their params from them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from onnxbuild.recipe.model import Recipe

STEP_KINDS: tuple[str, ...] = (
    "source",
    "export",
    "check",
    "optimize",
    "quantize",
    "convert",
    "serve",
    "expect",
    "validate",
    "report",
    "generate",
    "machine",
    "benchmark",
)
"""Every step kind, in pipeline order, one module each at ``onnxbuild.steps.<kind>``: the
registry. ``pipeline.steps_for`` asks each in this order for its steps, the loader checks
``limits.steps`` against it."""


@dataclass(frozen=True)
class StepInput:
    """One file a step reads: ``path`` as produced by step ``step``. A ``.onnx`` file, or one
    marked ``companions``, brings the other files its step wrote (external data, the weights a
    record names) beside it."""

    step: str
    path: str
    companions: bool = False


@dataclass(frozen=True)
class Resources:
    """What one step needs from the machine it runs on: where it may run, never in its key."""

    cpus: float = 1.0
    memory_mb: int = 1024
    gpus: int = 0
    why_gpu: str = ""
    memory_basis: str = ""
    """How ``memory_mb`` was estimated, in words, for a refusal to say."""


@dataclass(frozen=True)
class Limits:
    """Guards a recipe sets on a step (``limits:``): stopped and failed beyond them."""

    memory_mb: int | None = None
    seconds: float | None = None


@dataclass(frozen=True)
class StepSpec:
    """Everything the planner knows about one step of one recipe.

    ``params`` holds the resolved recipe sections the step reads, keyed as in the
    recipe (so a change reads ``export.opset changed 17 -> 18``). ``files`` names
    local files or folders whose content is part of the step's identity, keyed by a
    label that carries no absolute path (so keys are equal across checkouts).
    """

    name: str
    kind: str
    params: dict[str, Any]
    deps: tuple[str, ...] = ()
    inputs: tuple[StepInput, ...] = ()
    outputs: tuple[str, ...] = ()
    files: dict[str, Path] = field(default_factory=dict)
    identity: dict[str, object] = field(default_factory=dict)
    """Extra ingredients computed at plan time (e.g. which revision a Hub id resolves to)."""
    unkeyed: tuple[str, ...] = ()
    """Dotted params paths the step reads but its key leaves out, because one of its inputs
    carries their whole effect (``source.huggingface.model`` reaches it as the source record)."""
    resources: Resources = field(default_factory=Resources)
    limits: Limits = field(default_factory=Limits)
    code_also: tuple[str, ...] = ()
    """Modules its run reaches by name rather than by import (the recipe's source kind, through
    ``sources.source_kind``): counted in the key's code like ``entry``."""
    code_stops: tuple[str, ...] = ()
    """Its kind's branches this recipe does not take (``StepKind.branches``): the key's code
    (``onnxbuild.engine.codekeys``) is every onnxbuild module ``entry`` can reach, less these."""
    packages: tuple[str, ...] = ()
    """Packages whose versions are part of the key: its kind's PACKAGES less those only branches
    it does not take import."""
    imports: tuple[str, ...] = ()
    """Heavy modules its run imports first (torch, transformers...): a step with any forks from the
    build's warm process, which imported every planned step's once. Not part of the key."""
    exclusive: bool = False
    """Runs alone even with -j N (a benchmark must not share its cores)."""
    entry: str = ""
    """The importable module whose ``run(ctx, spec) -> StepResult`` does the work."""
    measured: str = ""
    """Why the outputs differ run to run or machine to machine by design ("" when they do not):
    locks list such outputs without digests, verify reports them as hardware-bound."""


@dataclass(frozen=True)
class StepContext:
    """What a running step may touch: its inputs (read-only) and its output folder."""

    recipe_name: str
    recipe_path: str
    recipe_dir: Path
    input_dir: Path
    output_dir: Path
    digests: dict[str, str] = field(default_factory=dict)
    """sha256 of each of the spec's ``files`` (label -> digest), as the planner saw them."""
    versions: dict[str, str] = field(default_factory=dict)
    """The versions of the kind's packages that the step's key holds (the planner's)."""
    code: dict[str, str] = field(default_factory=dict)
    """The digest of each onnxbuild module the step's key holds (the planner's code)."""
    log: Callable[[str], None] = print

    def input(self, rel: str) -> Path:
        return self.input_dir / rel

    def output(self, rel: str) -> Path:
        path = self.output_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        return path


@dataclass(frozen=True)
class StepResult:
    """What a step reports back.

    ``extra_outputs`` lists files written beyond the declared ones (for example an
    external-data file). ``data`` is small JSON kept in the cache entry and the
    manifest (weights provenance, validation verdicts). ``summary`` is one line for
    the terminal.
    """

    summary: str = ""
    data: dict[str, object] = field(default_factory=dict)
    extra_outputs: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    keep: bool = True
    """False: this build uses the outputs, but the cache keeps no entry for them (nor pushes
    one), so the next build runs the step again; for figures a step knows to be untrustworthy,
    such as machine limits measured while another job ran."""


class _VariantNamed(TypedDict):
    name: str
    path: str
    precision: str


class VariantParam(_VariantNamed, total=False):
    """How :meth:`Variant.as_param` names a variant in a step's params (generate, benchmark)."""

    files: list[str]
    prefill: str


@dataclass(frozen=True)
class Variant:
    """One ONNX model the build produces: its name, the step that writes it and its path.

    A step kind that makes variants says so with ``variants=`` in its :class:`StepKind`
    (``pipeline.variants`` asks every kind in the registry's order);
    everything after it (validate, expect, generate, benchmark, report) reads them from
    :class:`Planning` and names no kind."""

    name: str
    step: str
    path: str
    precision: str
    """Which default tolerances hold it (``recipe.variants.VARIANT_TOLERANCES``): fp32, fp16, int8, int4."""
    files: tuple[str, ...] = ()
    """Every ONNX file of the variant when it is more than one (an encoder-decoder's
    encoder_model.onnx and decoder_model.onnx); ``path`` is then the decoder's."""
    base: str | None = None
    """The variant it was made from (None for the exported model): a failed validation looks
    for the first node where the two part."""
    own: dict[str, object] = field(default_factory=dict, hash=False)
    """Its recipe entry's own ``validate:`` tolerances, over its precision's defaults."""
    prefill: str | None = None
    """A decoder served by two files: the one that processes the prompt (an empty past), where
    ``path`` then decodes each token after it (onnxbuild.steps.serve)."""

    @property
    def paths(self) -> tuple[str, ...]:
        """Every file of it: an encoder-decoder's files, or the decoder and its prefill file."""
        return self.files or ((self.prefill, self.path) if self.prefill else (self.path,))

    @property
    def validate_step(self) -> str:
        """The step that validates it: ``validate`` for the exported model, ``validate.<name>`` else."""
        return "validate" if self.name == "model" else f"validate.{self.name}"

    def as_param(self) -> VariantParam:
        """How a step's params name it (generate, benchmark)."""
        param: VariantParam = {"name": self.name, "path": self.path, "precision": self.precision}
        if self.files:
            param["files"] = list(self.files)
        if self.prefill:
            param["prefill"] = self.prefill
        return param


@dataclass(frozen=True)
class Planning:
    """What a step kind's ``plan(p) -> list[StepSpec]`` reads: the recipe, the variants it
    builds and which step writes model.onnx (``export`` for a traced source, else ``source``)."""

    recipe: Recipe
    variants: tuple[Variant, ...]
    model_step: str


Found = tuple[tuple[str | int, ...], str, bool]
"""A cross-field problem a kind finds in a recipe: (key path, message, whether it is at the key
rather than its value). The loader turns it into an error at the key's line and column."""


@dataclass(frozen=True)
class Checking:
    """What a step kind's ``check`` reads: a recipe that passed its schema (defaults not yet
    filled in) and what the recipe layer found in it once for every kind."""

    doc: dict[str, Any]
    source: str
    """The source kind's name (the one key under ``source``)."""
    src: dict[str, object]
    """Its section, ``source.<kind>``."""
    task: str | None
    """The source's task, where it names one (``text-generation``)."""
    traced: bool
    """Exported through torch: export and validation apply."""
    untraced_what: str
    """How a message names an untraced source ("an ONNX file, ...")."""
    traced_kinds: str
    """The traced source kinds, for messages ("huggingface, pytorch and tensorflow")."""
    decoder: bool
    """A text decoder (``export.with_past`` and the fused graphs apply)."""
    two_files: bool
    """Its variants are an encoder and a decoder file."""
    three_files: bool
    """Its variants are a vision, an embedding and a decoder file (image-text-to-text): the kinds
    that have no way with them yet refuse the recipe (``refuse_three_files``)."""
    max_positions: int | None
    """How many positions the model has, where its config says."""
    variants: tuple[str, ...]
    """Every variant's name, the exported model's first."""
    entries: tuple[tuple[str, int, dict[str, Any]], ...]
    """(section, index, entry) of every entry of a variant section."""
    with_past: bool = False
    """Whether the model takes a KV cache (``export.with_past`` where it applies)."""
    inputs: tuple[Mapping[str, object], ...] = ()
    """The model's inputs, the recipe's or its source's defaults."""
    export_dims: tuple[str, ...] = ()
    """The inputs' symbolic dimensions."""
    dims: tuple[str, ...] = ()
    """The dimensions validation varies (the inputs' and those its source always varies)."""
    optional: frozenset[str] = frozenset()
    """Dimensions a shape may give though no input names them (past_sequence with a KV cache)."""


def _no_problems(checking: Checking) -> list[Found]:
    return []


def _finds_nothing(checking: Checking) -> Checking:
    return checking


def _nothing_to_resolve(doc: dict[str, Any], resolved: dict[str, Any]) -> None:
    return None


def _not_measured(params: Mapping[str, object]) -> str:
    return ""


def _no_variants(recipe: Recipe, earlier: tuple[Variant, ...]) -> list[Variant]:
    return []


def _fp32(recipe: Recipe) -> str:
    return "fp32"


def _not_the_model(recipe: Recipe) -> bool:
    return False


def _one_cpu(recipe: Recipe) -> tuple[float, int, str]:
    return 1.0, 0, ""


@dataclass(frozen=True)
class Branch:
    """Part of a kind's run that only some recipes reach (export's fused writer, OpenVINO in
    validate): ``module`` (an onnxbuild module, with what only it imports) and ``packages`` count
    in a step's key only where ``taken(params)`` holds for the step's params."""

    taken: Callable[[Mapping[str, object]], bool]
    module: str = ""
    packages: tuple[str, ...] = ()


@dataclass(frozen=True)
class StepKind:
    """What a step kind says of itself. Each module under ``onnxbuild/steps/`` exports one as
    ``KIND``; the registry (``onnxbuild.steps.step_kind``) hands it to the pipeline, which asks
    every kind for its variants and steps, and ``describe`` copies what the engine needs into
    each StepSpec, so the engine runs specs without reading a kind.

    Every key of the kind holds the digest of the onnxbuild code its run can reach
    (``onnxbuild.engine.codekeys``: its module and what that imports, less the ``branches`` a recipe
    does not take) and the versions of ``packages``: no hand-kept version number."""

    name: str
    packages: tuple[str, ...]
    plan: Callable[[Planning], list[StepSpec]]
    """Its steps for a recipe, given the variants every kind makes (empty when it has none)."""
    run: Callable[[StepContext, StepSpec], StepResult]
    """Runs one of its steps (the engine calls it by the module's name, in a step process)."""
    memory: tuple[float, int] = (2, 500)
    """Peak memory as (a multiple of the model's weights, MB more): where a cluster may place it."""
    memory_for: Callable[[Recipe], tuple[float, int]] | None = None
    """``memory`` where it depends on the recipe (export: a trace or the fused writer)."""
    exclusive: bool = False
    """Runs alone (the runner starts nothing else meanwhile): it times or measures."""
    measured: Callable[[Mapping[str, object]], str] = _not_measured
    """Why its outputs differ by machine or run ("" when they do not): such a step's key holds
    the machine, and a result measured under load is not kept."""
    variants: Callable[[Recipe, tuple[Variant, ...]], list[Variant]] = _no_variants
    """The variants it makes, given those made before it (``pipeline.variants`` asks every kind
    in the registry's order, the exported model first)."""
    writes_model: Callable[[Recipe], bool] = _not_the_model
    model_precision: Callable[[Recipe], str] = _fp32
    """The precision of the model it writes, where it writes it (``fp32`` but for a quantized export)."""
    """Its step writes the recipe's model.onnx, the ``model`` variant (one kind does per recipe:
    export for a traced source, source for an ONNX file or graph)."""
    placement: Callable[[Recipe], tuple[float, int, str]] = _one_cpu
    """(CPUs, GPUs, why a GPU) a step of it needs."""
    imports: tuple[str, ...] = ()
    """Heavy modules its run imports whatever the source (StepSpec.imports)."""
    loads_model: bool = False
    """Its steps load the source's model, so they import what the source kind's ``imports`` names too."""
    finds: Callable[[Checking], Checking] = _finds_nothing
    """Adds what its section says of the model to what every kind's check reads (export: the
    inputs, their dimensions, whether there is a KV cache), in the registry's order."""
    check: Callable[[Checking], Iterable[Found]] = _no_problems
    """Cross-field problems of its section (and of what it reads of others) in a recipe that passed
    its schema: what JSON Schema cannot say. The loader asks every kind (``api.load_recipes``)."""
    resolve: Callable[[dict[str, Any], dict[str, Any]], None] = _nothing_to_resolve
    """Fills the defaults of its section that the schema cannot give because they depend on other
    keys (``resolve(doc, resolved)``, in the registry's order, after the schema's defaults)."""
    makes: tuple[str, ...] = ()
    """Variants it makes by fixed names (``optimized``) whenever its section is given: names no
    variant entry may take."""
    each_variant: bool = False
    """It has a step per variant, ``<kind>.<variant>`` (the exported model's is ``<kind>``):
    names ``limits.steps`` may use."""
    branches: tuple[Branch, ...] = ()
    """Code and packages its run reaches only for some recipes: left out of the others' keys."""

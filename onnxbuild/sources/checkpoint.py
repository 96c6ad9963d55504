"""Safetensors checkpoints read one tensor at a time, and seeded random-init weights written the same way.

A 1B model's weights are 4.9 GB in fp32 and an 8B model's 16 GB in bf16: a step that holds them
all, or holds them twice (transformers' model and a copy in a graph), does not fit a 24 GB
machine. Here a tensor is read with a plain ``readinto`` (not a memory map, whose touched pages
would stay resident until the file is closed and count in the step's RSS) when it is used, and
converted to float32 then (bf16 exactly: its bits are float32's top half).

:class:`Lazy` gives the fused decoder writer (fusion/decoder.py) the module tree it reads,
``model.model.layers[i].self_attn.q_proj.weight``, with every weight read from the checkpoint as
it is touched, so the graph is written with one tensor in memory at a time.

:func:`write_random_init` writes a model's seeded random weights tensor by tensor into one
safetensors file, so an architecture that does not fit in memory in fp32 can still be built
offline. Its values are not ``from_config``'s (that needs the whole model in memory), so the
source step uses it only from :data:`STREAM_ABOVE` parameters up, and every step then reads the
same file.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    import numpy as np
    import torch
    from numpy.typing import NDArray
    from transformers import PretrainedConfig, PreTrainedModel

STREAM_ABOVE = 400_000_000
"""Random-init models with this many parameters or more get their weights streamed into a
safetensors file by the source step (all later steps read it); smaller ones are built in memory
by transformers' ``from_config``, as before, so their cache keys and values stay as they were.
Llama-3.2-1B's shape (1.24B) is streamed; SmolLM2-135M's is not."""

GENERATOR = 1
"""The random-init writer's version: its values are in the source step's key through it."""

WEIGHTS = "weights/model.safetensors"
WEIGHTS_CONFIG = "weights/config.json"

_REPLACED: WeakKeyDictionary[torch.nn.Module, dict[str, Callable[[torch.Tensor], torch.Tensor]]] = WeakKeyDictionary()
"""A streamed model's replaced layer weights, applied by the hook that reads each layer."""

_NUMPY = {"F32": "float32", "F16": "float16", "F64": "float64", "I64": "int64", "I32": "int32", "U8": "uint8"}
_CHUNK = 1 << 24
"""Elements generated or converted at once (64 MB in float32)."""


@dataclass(frozen=True)
class Entry:
    """Where one tensor lies in a safetensors file."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


class Checkpoint:
    """The tensors of one or more safetensors files, by name, each read when asked for."""

    def __init__(self, files: list[Path]) -> None:
        self.entries: dict[str, Entry] = {}
        for file in files:
            with open(file, "rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                header: dict[str, dict[str, list[int]]] = json.loads(f.read(size))
            base = 8 + size
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                a, b = info["data_offsets"]
                shape = tuple(int(d) for d in info["shape"])
                self.entries[name] = Entry(file, str(info["dtype"]), shape, base + a, base + b)

    @classmethod
    def of_folder(cls, folder: Path) -> Checkpoint | None:
        """The checkpoint in a save_pretrained folder, or None where it has no safetensors files."""
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            mapping: Mapping[str, str] = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            return cls([folder / f for f in sorted(set(mapping.values()))])
        files = sorted(folder.glob("*.safetensors"))
        return cls(files) if files else None

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def parameters(self) -> int:
        count = 0
        for e in self.entries.values():
            n = 1
            for d in e.shape:
                n *= d
            count += n
        return count

    def array(self, name: str) -> NDArray[np.generic]:
        """The tensor as numpy: float32 for bf16, else its own dtype."""
        import numpy as np

        e = self.entries[name]
        raw = np.empty(e.end - e.start, dtype=np.uint8)
        with open(e.file, "rb") as f:
            f.seek(e.start)
            f.readinto(raw.data)
        if e.dtype == "BF16":
            bits = raw.view(np.uint16)
            out = np.empty(bits.size, dtype=np.float32)
            wide = out.view(np.uint32)
            for i in range(0, bits.size, _CHUNK):  # float32's top 16 bits, chunked to bound the temporary
                wide[i : i + _CHUNK] = bits[i : i + _CHUNK].astype(np.uint32) << 16
            return out.reshape(e.shape)
        if e.dtype not in _NUMPY:
            raise ValueError(f"{e.file.name}: tensor {name} has dtype {e.dtype}, which onnxbuild does not read")
        return raw.view(np.dtype(_NUMPY[e.dtype])).reshape(e.shape)

    def tensor(self, name: str) -> torch.Tensor:
        import torch

        return torch.from_numpy(self.array(name))


class Lazy:
    """A module of a model built on the meta device (shapes, config and attributes, no
    weights), whose parameters are read from ``checkpoint`` when touched. A module with
    buffers and no parameters (a rotary embedding's frequencies) is built again on the CPU
    from the config, as transformers builds it."""

    def __init__(
        self,
        module: torch.nn.Module,
        prefix: str,
        checkpoint: Checkpoint,
        aliases: Mapping[str, str],
        config: PretrainedConfig,
    ) -> None:
        self._module, self._prefix, self._checkpoint = module, prefix, checkpoint
        self._aliases, self._config = aliases, config

    def _child(self, module: torch.nn.Module, name: str) -> Lazy | torch.nn.Module:
        if any(True for _ in module.parameters()):
            return Lazy(module, f"{self._prefix}{name}.", self._checkpoint, self._aliases, self._config)
        if any(True for _ in module.buffers()):
            return _rebuilt(module, self._config)
        return module

    def __getattr__(self, name: str) -> object:
        module = self._module
        if name in module._parameters:
            return self._checkpoint.tensor(_stored(f"{self._prefix}{name}", self._checkpoint, self._aliases))
        child = module._modules.get(name)
        if child is not None:
            return self._child(child, name)
        return getattr(module, name)

    def __getitem__(self, i: int) -> Lazy | torch.nn.Module:
        return self._child(self._layers()[i], str(i))

    def _layers(self) -> torch.nn.ModuleList:
        layers: torch.nn.ModuleList = self._module  # type: ignore[assignment]  # a Lazy indexed is a ModuleList
        return layers

    def __iter__(self) -> Iterator[Lazy | torch.nn.Module]:
        return (self[i] for i in range(len(self._layers())))

    def __len__(self) -> int:
        return len(self._layers())


def _rebuilt(module: torch.nn.Module, config: PretrainedConfig) -> torch.nn.Module:
    import torch

    with torch.device("cpu"):
        return type(module)(config=config)  # type: ignore[call-arg]  # transformers' modules take their config


def _stored(name: str, checkpoint: Checkpoint, aliases: Mapping[str, str]) -> str:
    """The checkpoint's name for a parameter: its own, a tied twin's (lm_head -> embed_tokens),
    or either without the base model's prefix (a checkpoint saved from the base model)."""
    for candidate in (name, aliases.get(name, name)):
        if candidate in checkpoint:
            return candidate
        short = candidate.split(".", 1)[-1]
        if short in checkpoint:
            return short
    raise KeyError(f"the checkpoint has no tensor {name}")


def meta_model(auto: object, config: PretrainedConfig, **kwargs: object) -> PreTrainedModel:
    """The model's module tree on the meta device: no memory for its weights."""
    import torch

    with torch.device("meta"):
        # an Auto class picks the architecture from the config; a model class is the architecture
        made: PreTrainedModel = (
            auto.from_config(config, **kwargs) if hasattr(auto, "from_config") else auto(config, **kwargs)  # type: ignore[operator]
        )
        return made


def aliases(model: torch.nn.Module) -> dict[str, str]:
    """Each tied parameter's name -> the first name it is held under (lm_head.weight ->
    model.embed_tokens.weight where the embedding is tied)."""
    first: dict[int, str] = {}
    out: dict[str, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        out[name] = first.setdefault(id(p), name)
    return out


def lazy_model(auto: object, config: PretrainedConfig, checkpoint: Checkpoint) -> Lazy:
    """The model's module tree with its weights read from ``checkpoint`` as they are touched."""
    model = meta_model(auto, config)
    return Lazy(model, "", checkpoint, aliases(model), model.config)


def write_random_init(auto: object, config: PretrainedConfig, seed: int, path: Path, dtype: str = "float32") -> int:
    """Seeded random weights for ``config``'s model, written tensor by tensor into the
    safetensors file ``path``; returns the parameter count. Each tensor is drawn from its own
    generators (seed, its index, the chunk's), so a tensor's values do not depend on the
    others' sizes nor on which thread draws them.
    As transformers initialises: matrices and tables from N(0, initializer_range), norm scales
    at one (zero for Gemma's, which adds one), biases at zero. A tied parameter is written once."""
    import numpy as np

    model = meta_model(auto, config)
    std = float(getattr(config, "initializer_range", 0.02) or 0.02)
    gemma = str(getattr(config, "model_type", "")).startswith("gemma")
    seen: set[int] = set()
    tensors: list[tuple[str, tuple[int, ...]]] = []
    for name, p in model.named_parameters():
        if id(p) not in seen:
            seen.add(id(p))
            tensors.append((name, tuple(p.shape)))
    width = {"float32": 4, "bfloat16": 2}[dtype]
    header: dict[str, object] = {"__metadata__": {"format": "pt", "onnxbuild": f"random-init {GENERATOR} seed {seed}"}}
    offset = 0
    for name, shape in tensors:
        size = width * int(np.prod(shape, dtype=np.int64))
        header[name] = {
            "dtype": "F32" if width == 4 else "BF16",
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    chunks = [
        (index, i, min(_CHUNK, n - i), len(shape), name.rsplit(".", 1)[-1])
        for index, (name, shape) in enumerate(tensors)
        for n in (int(np.prod(shape, dtype=np.int64)),)
        for i in range(0, n, _CHUNK)
    ]

    def drawn(chunk: tuple[int, int, int, int, str]) -> bytes:
        index, start, m, rank, leaf = chunk
        if rank >= 2:
            # each chunk its own generator: the same values whichever thread draws it
            rng = np.random.default_rng([seed, index, start // _CHUNK])
            values = rng.standard_normal(m, dtype=np.float32) * np.float32(std)
        elif leaf == "bias" or gemma:
            values = np.zeros(m, dtype=np.float32)
        else:
            values = np.ones(m, dtype=np.float32)
        if width == 2:  # bf16 by rounding to nearest even, as torch rounds
            bits = values.view(np.uint32)
            half: bytes = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16).tobytes()
            return half
        whole: bytes = values.tobytes()
        return whole

    from concurrent.futures import ThreadPoolExecutor

    # numpy draws without the GIL: one thread per core (a 1B model: 21 s on one core of 2)
    with open(path, "wb") as f, ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as pool:
        f.write(struct.pack("<Q", len(text)) + text)
        for i in range(0, len(chunks), 8):  # in order, at most 8 chunks (512 MB) drawn ahead
            for block in pool.map(drawn, chunks[i : i + 8]):
                f.write(block)
    return sum(c[2] for c in chunks)


def streamed_model(
    auto: object, config: PretrainedConfig, checkpoint: Checkpoint, dtype: torch.dtype, **kwargs: object
) -> PreTrainedModel | None:
    """transformers' model whose decoder layers hold their weights only while they run: each is
    read from ``checkpoint`` by a hook before its forward and dropped (back to the meta device)
    after it. The rest (embeddings, final norm, head, rotary tables) is loaded once. It runs
    transformers' own forward, masks, cache and generate, so it is the reference, computed in
    ``dtype`` as a loaded model is, in the memory of one layer plus the embeddings: a
    Llama-3.2-1B shape's 4.94 GB model ran validation in 2.0 GB. None where the model has no
    ``model.layers`` to stream."""
    import torch

    model = meta_model(auto, config, **kwargs)
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or any(True for _ in layers.buffers()):
        return None
    names = aliases(model)
    streamed = {id(p) for p in layers.parameters()}

    def fill(module: torch.nn.Module, prefix: str, skip: frozenset[int] = frozenset()) -> None:
        for name, p in list(module.named_parameters(recurse=True)):
            key = f"{prefix}{name}"
            if id(p) in skip or names.get(key, key) != key:  # a layer's, or a tied twin (tie_weights)
                continue
            *path, leaf = name.split(".")
            owner = module.get_submodule(".".join(path)) if path else module
            value = checkpoint.tensor(_stored(key, checkpoint, names)).to(dtype)
            new = replaced.get(key)
            owner._parameters[leaf] = torch.nn.Parameter(value if new is None else new(value), requires_grad=False)

    # everything but the layers, once; a module with buffers and no weights (the rotary
    # embedding) built again on the CPU, as its buffers are computed, not stored
    replaced: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}
    _REPLACED[model] = replaced
    fill(model, "", frozenset(streamed))
    for name, module in list(model.named_modules()):
        if name and not any(True for _ in module.parameters()) and any(True for _ in module.buffers(recurse=False)):
            parent, _, leaf = name.rpartition(".")
            model.get_submodule(parent).register_module(leaf, _rebuilt(module, model.config))
    tie = getattr(model, "tie_weights", None)
    if callable(tie) and getattr(model.config, "tie_word_embeddings", False):
        tie()

    def drop(module: torch.nn.Module, args: object, out: object) -> None:
        module.to("meta")

    for i, layer in enumerate(layers):
        layer.register_forward_pre_hook(lambda module, args, i=i: fill(module, f"model.layers.{i}."))
        layer.register_forward_hook(drop)
    return model


def replace_weights(
    model: torch.nn.Module, new: Mapping[str, Callable[[torch.Tensor], torch.Tensor]], restorable: bool = True
) -> Callable[[], None]:
    """Each named parameter of ``model`` made from its value by ``new[name]``, as a parameter of
    its own (a tied twin is untied: a quantized head beside a float embedding). A streamed
    model's layer weights are replaced as each layer is read, the others at once. Returns what
    puts the old parameters back (a model later checks need as it was, not loaded twice); not
    ``restorable``, the old ones are let go at once (an 8B model's untied 2.1 GB head)."""
    import torch

    later = _REPLACED.get(model)
    kept: list[tuple[torch.nn.Module, str, torch.nn.Parameter]] = []
    for name, make in new.items():
        if later is not None and name.startswith("model.layers."):
            later[name] = make
            continue
        *path, leaf = name.split(".")
        owner = model.get_submodule(".".join(path))
        old = owner._parameters[leaf]
        assert old is not None
        if restorable:
            kept.append((owner, leaf, old))
        owner._parameters[leaf] = torch.nn.Parameter(make(old.detach()), requires_grad=False)
        del old

    def restore() -> None:
        if later is not None:
            later.clear()
        for owner, leaf, old in kept:
            owner._parameters[leaf] = old
        kept.clear()

    return restore

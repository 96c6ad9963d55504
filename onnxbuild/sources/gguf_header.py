"""What a GGUF file holds, read from its header without loading the weights.

The huggingface source reads a GGUF file through transformers (``from_pretrained(folder,
gguf_file=...)``), which dequantizes every tensor to float. Before that, the source step checks
the file here, so a wrong path, a file that is not GGUF, or an architecture transformers has no
reader for fails with the key and the fix instead of deep inside transformers; and it records
each tensor's GGUF type (Q4_1, Q8_0, F32, ...) in reports/source.json, so a review sees which
weights were stored at which precision, and the ``gguf`` quantize method knows which it can
carry over exactly.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from onnxbuild.errors import StepError

MAGIC = b"GGUF"


@dataclass(frozen=True)
class Tensor:
    name: str
    type: str
    shape: tuple[int, ...]
    """GGUF's order (ne0 first): a linear weight is [in_features, out_features]."""


@dataclass(frozen=True)
class Header:
    architecture: str
    name: str
    tensors: tuple[Tensor, ...]

    def type_counts(self) -> dict[str, int]:
        return dict(sorted(Counter(t.type for t in self.tensors).items()))


def read_header(path: Path, key: str, shown: str) -> Header:
    """The header of the GGUF file at ``path``; ``key`` and ``shown`` name it in errors."""
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except FileNotFoundError:
        raise StepError(f"{key}: {shown}: no such file ({path}); paths are relative to the recipe's folder") from None
    except OSError as exc:
        raise StepError(f"{key}: {shown}: cannot read it ({exc.strerror})") from None
    if magic != MAGIC:
        raise StepError(
            f"{key}: {shown} is not a GGUF file (it starts with {magic!r}, a GGUF file with b'GGUF'); "
            "name a .gguf file written by llama.cpp's converters"
        )
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # a truncated or corrupt file
        raise StepError(
            f"{key}: {shown}: the GGUF file cannot be read ({type(exc).__name__}: {str(exc)[:200]}); is it complete?"
        ) from None
    arch = _field(reader, "general.architecture")
    supported = _transformers_architectures()
    if arch not in supported and arch.replace("-", "_") not in supported:
        raise StepError(
            f"{key}: {shown} holds a {arch!r} model, which transformers cannot read from GGUF "
            f"(it reads: {', '.join(sorted(supported))}); "
            "convert the model to a save_pretrained folder and name that under `model:`"
        )
    tensors = tuple(Tensor(t.name, t.tensor_type.name, tuple(int(d) for d in t.shape)) for t in reader.tensors)
    return Header(arch, _field(reader, "general.name"), tensors)


def _field(reader: object, name: str) -> str:
    field = reader.fields.get(name)  # type: ignore[attr-defined]
    if field is None:
        return ""
    return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")


def _transformers_architectures() -> set[str]:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    # the mapping's "general" and "tokenizer" sections are not architectures
    return set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"}

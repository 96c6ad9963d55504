"""The checks on real data (top-1 accuracy on a labelled set, sentence embeddings' cosine), and
the first-divergence search a failed case points to."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from onnxbuild._util import brief
from onnxbuild.errors import StepError
from onnxbuild.recipe.sections import (
    AccuracyCheck,
    ExportSection,
    ValidateSection,
)
from onnxbuild.report.validation import (
    AccuracyResult,
    EmbeddingResult,
    ShapeResult,
)
from onnxbuild.runtimes.sessions import Session
from onnxbuild.sources.torchmodel import (
    labelled_inputs,
)
from onnxbuild.steps.base import StepContext, StepSpec
from onnxbuild.steps.validating.cases import again, fixed_axis_hint
from onnxbuild.steps.validating.compare import cosine_rows, mean_pool

if TYPE_CHECKING:
    import numpy as np
    import torch
    from numpy.typing import NDArray

    Wrapped = Callable[..., Sequence[torch.Tensor]]
    """The source model as validation calls it: torch tensors in by position, a tuple of them out
    (``sources.torchmodel.wrap``'s module, or a Keras model's adapter)."""


def accuracy_check(
    cfg: AccuracyCheck, wrapped: Wrapped, session: Session, export: ExportSection, recipe_dir: Path
) -> AccuracyResult:
    """Top-1 accuracy of the first output through PyTorch and ONNX Runtime, in batches."""
    import numpy as np

    key = "validate.accuracy.dataset"
    from onnxbuild.sources.usercode import load_function

    fn = load_function(cfg["dataset"], recipe_dir, key)
    try:
        got = fn()
    except Exception as exc:
        raise StepError(f"{key}: {cfg['dataset']} raised {type(exc).__name__}: {str(exc)[:300]}") from None
    feeds, labels = labelled_inputs(got, export["inputs"], key)
    if labels.shape[0] == 0:
        raise StepError(f"{key}: {cfg['dataset']} returned no samples")
    names = [t["name"] for t in export["inputs"]]
    first = export["outputs"][0]
    size = int(cfg["batch_size"])
    torch_pred, ort_pred = [], []
    for start in range(0, labels.shape[0], size):
        batch = {n: feeds[n][start : start + size] for n in names}
        ref, out = _first_output_both(
            wrapped, session, export, batch, f"{key}: ONNX Runtime refused the dataset's inputs"
        )
        want = labels[start : start + size]
        if ref.shape[:-1] != want.shape:
            raise StepError(
                f"{key}: labels must be shaped like output {first} without its last (class) axis: "
                f"{list(ref.shape[:-1])} for samples {start}..{start + len(want) - 1}, got {list(want.shape)}"
            )
        torch_pred.append(ref.argmax(-1))
        ort_pred.append(out.argmax(-1))
    t, o = np.concatenate(torch_pred), np.concatenate(ort_pred)
    pytorch, onnxruntime = float((t == labels).mean()), float((o == labels).mean())
    max_drop, floor = float(cfg["max_drop"]), cfg.get("min")
    passed = pytorch - onnxruntime <= max_drop + 1e-9 and (floor is None or onnxruntime >= float(floor))
    return {
        "dataset": cfg["dataset"],
        "samples": int(labels.shape[0]),
        "pytorch": pytorch,
        "onnxruntime": onnxruntime,
        "agreement": float((t == o).mean()),
        "max_drop": max_drop,
        "min": None if floor is None else float(floor),
        "passed": bool(passed),
    }


def _first_output_both(
    wrapped: Wrapped,
    session: Session,
    export: ExportSection,
    feeds: Mapping[str, NDArray[np.generic]],
    refused: str,
) -> tuple[NDArray[np.float32], NDArray[np.generic]]:
    """The first output from PyTorch and from ONNX Runtime on the same inputs (numpy arrays)."""
    import numpy as np
    import torch

    names = [t["name"] for t in export["inputs"]]
    with torch.no_grad():
        ref = wrapped(*(torch.from_numpy(feeds[n]) for n in names))[0].detach().float().cpu().numpy()
    try:
        got = np.asarray(session.run([export["outputs"][0]], feeds)[0])
    except Exception as exc:
        raise StepError(f"{refused}: {brief(exc, lines=None, limit=500)}{fixed_axis_hint(export, feeds)}") from None
    return ref, got


def embedding_check(
    feeds: Mapping[str, NDArray[np.generic]],
    mask: NDArray[np.generic],
    cosine_min: float | None,
    wrapped: Wrapped,
    session: Session,
    export: ExportSection,
) -> EmbeddingResult:
    """Sentence embeddings from the first output, ONNX Runtime against PyTorch by cosine similarity."""
    import numpy as np

    first = export["outputs"][0]
    ref, got = _first_output_both(
        wrapped, session, export, feeds, "validate.sentences: ONNX Runtime refused the tokenized sentences"
    )
    if got.shape != ref.shape:
        raise StepError(
            f"validate.sentences: output {first} has shape {list(got.shape)} from ONNX Runtime but {list(ref.shape)} "
            "from PyTorch"
        )
    pooling: Literal["mean", "none"]
    if ref.ndim == 3 and ref.shape[:2] == mask.shape:
        pooling, a, b = "mean", mean_pool(ref, mask), mean_pool(got, mask)
    elif ref.ndim == 2:
        pooling, a, b = "none", ref.astype(np.float64), got.astype(np.float64)
    else:
        raise StepError(
            f"validate.sentences: output {first} has shape {list(ref.shape)}; "
            "sentence embeddings need [batch, sequence, width] (mean-pooled) or [batch, width]"
        )
    cos = cosine_rows(a, b)
    threshold = None if cosine_min is None else float(cosine_min)
    return {
        "sentences": int(mask.shape[0]),
        "sequence": int(mask.shape[1]),
        "pooling": pooling,
        "min": float(np.min(cos)),
        "mean": float(np.mean(cos)),
        "worst_sentence": int(np.argmin(np.nan_to_num(cos, nan=-np.inf))),
        "max_abs_diff": float(np.abs(a - b).max()),
        "cosine_min": threshold,
        "passed": threshold is None or bool(np.all(cos >= threshold)),
    }


def divergence_check(
    ctx: StepContext,
    spec: StepSpec,
    results: list[ShapeResult],
    validate: ValidateSection,
    feeds: dict[str, NDArray[np.generic]],
) -> str:
    """Where the failing variant first parts from the file it was made from, at the first
    failing shape (onnxbuild/review/divergence.py), as a sentence for the failure; its subgraph and
    inputs go to the failed step's divergence/ folder. ``feeds``: that shape's own inputs."""
    from onnxbuild.steps.validating.divergence import DIVERGENCE, first_divergence

    base = spec.params["base"]
    variant = spec.params["variant"]
    shape = next(r["shape"] for r in results if not r["passed"] and not r["error"])
    where = f"artifacts/{ctx.recipe_name}/failed/{spec.name}/{DIVERGENCE}/"
    try:
        candidate = ctx.input(spec.params["model_path"])
        found = first_divergence(
            ctx.input(base["path"]),
            candidate,
            feeds,
            float(validate["rtol"]),
            float(validate["atol"]),
            ctx.output_dir / DIVERGENCE,
        )
    except Exception as exc:  # the search is help for a failure, never a second failure
        return f" (The search for the first diverging node failed: {type(exc).__name__}: {brief(exc)}.)"
    d = found.divergence
    if d is None:
        return (
            f" Every tensor it shares with {base['variant']} agrees within these tolerances "
            f"({found.compared} compared); the difference is in what it computes anew."
        )
    module = f", from {d.module}" if d.module else ""
    return (
        f" First node where it parts from {base['variant']}: {d.node} ({d.op_type}{module}), output {d.output}, "
        f"max abs diff {d.max_abs_diff:.3g}"
        f" after {d.compared - 1} agreeing tensors; that node's subgraph and inputs: {where}"
        f" (onnxbuild explain-mismatch {ctx.recipe_path} --variant {variant}{again(validate, shape)} to search again)."
    )

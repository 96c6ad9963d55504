"""reports/generation.md: generated tokens of each variant against PyTorch's, as a table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

from onnxbuild.recipe.sections import Sampling


class Comparison(TypedDict):
    """Two generations of one prompt compared (:func:`compare_runs`)."""

    identical: bool
    agreement: float
    first_divergence: int | None
    logits_max_abs_diff: float
    logits_max_abs_diff_per_step: list[float]
    tokens: list[int]


class _VariantMeasured(TypedDict):
    precision: str
    greedy: Comparison
    teacher_forced_agreement: float


class VariantGeneration(_VariantMeasured, total=False):
    """One variant's entry in reports/generation.json; :func:`_judge` adds its verdict."""

    sampling: Comparison
    passed: bool
    rule: str
    text: str | list[str]


class PytorchGeneration(TypedDict):
    greedy_tokens: list[int]
    text: str | list[str] | None
    sampling_tokens: list[int] | None


class SamplingNote(Sampling):
    seed: int


class GenerationReport(TypedDict):
    """reports/generation.json, as the generate step writes it."""

    passed: bool
    weights: object
    prompt_ids: list[int]
    prompt: str | None
    max_new_tokens: int
    pytorch: PytorchGeneration
    sampling: SamplingNote | None
    variants: Mapping[str, VariantGeneration]


def markdown(report: GenerationReport, recipe: str) -> str:
    lines = [f"# {recipe}: generation against PyTorch", ""]
    if report["weights"] == "random-init":
        lines += ["> weights: **random-init**: generations repeat tokens; the logits columns carry the comparison", ""]
    lines += [
        f"Prompt: {len(report['prompt_ids'])} tokens; {report['max_new_tokens']} new tokens, greedy"
        + (
            f" and seeded sampling (seed {report['sampling']['seed']}, "
            f"temperature {report['sampling']['temperature']}, top-k {report['sampling']['top_k']})"
            if report["sampling"]
            else ""
        )
        + ". PyTorch: transformers generate() (greedy), the same loop with the same draws (sampling).",
        "",
        f"Overall: **{'passed' if report['passed'] else 'FAILED'}**",
        "",
        "| variant | greedy identical | first divergence | token agreement | teacher-forced agreement "
        "| logits max abs diff | sampling identical | rule | result |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in report["variants"].items():
        g = r["greedy"]
        s = r.get("sampling")
        lines.append(
            f"| {name} | {'yes' if g['identical'] else 'no'} | "
            f"{g['first_divergence'] if g['first_divergence'] is not None else '-'} | "
            f"{g['agreement']:.3f} | {r['teacher_forced_agreement']:.3f} | {g['logits_max_abs_diff']:.2e} | "
            f"{('yes' if s['identical'] else 'no') if s else '-'} | {r['rule']} | {'pass' if r['passed'] else 'FAIL'} |"
        )
    if report["pytorch"]["text"] is not None:
        lines += ["", "PyTorch: " + repr(report["pytorch"]["text"])] + [
            f"{name}: {r.get('text')!r}" for name, r in report["variants"].items()
        ]
    return "\n".join(lines) + "\n"

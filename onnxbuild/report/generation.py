"""reports/generation.md: generated tokens of each variant against PyTorch's, as a table."""

from __future__ import annotations

from typing import Any


def markdown(report: dict[str, Any], recipe: str) -> str:
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

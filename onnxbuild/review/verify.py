"""``onnxbuild verify``: rebuild every step from scratch and compare digests with the manifest.

The rebuild runs in a throwaway cache and artifacts folder, so nothing the user has is
touched. Steps whose outputs depend on the machine are known in advance and reported
as such rather than as failures: benchmarks (timings), and ``optimize`` at levels
extended/layout/all (fused for this CPU and provider).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from onnxbuild.engine.artifacts import read_manifest, rehash
from onnxbuild.errors import UsageError


@dataclass
class StepVerdict:
    """One step's outputs re-checked against the lock: matches, differs (measured or not), or missing."""

    step: str
    verdict: str  # identical | differs | hardware-dependent | missing
    detail: str = ""


@dataclass
class RecipeVerdict:
    """A recipe's verdicts, and whether the artifact folder can be trusted."""

    recipe: str
    steps: list[StepVerdict] = field(default_factory=list)

    @property
    def reproducible(self) -> bool:
        return all(s.verdict in ("identical", "hardware-dependent") for s in self.steps)


def verify(paths: list[str], artifacts_dir: Path, jobs: int = 1) -> list[RecipeVerdict]:
    import onnxbuild

    recipes = onnxbuild.load_recipes(paths)
    verdicts: list[RecipeVerdict] = []
    for recipe in recipes:
        manifest_path = artifacts_dir / recipe.name / "manifest.json"
        manifest = read_manifest(artifacts_dir / recipe.name)
        if manifest is None:
            raise UsageError(f"{manifest_path} is missing or unreadable; build first: onnxbuild make {recipe.path}")
        if manifest["recipe"].get("resolved") != recipe.resolved:  # a comment-only edit changes nothing that is built
            raise UsageError(f"{recipe.path} changed since {manifest_path} was written; build it first, then verify")
        in_folder = rehash(artifacts_dir / recipe.name)
        with tempfile.TemporaryDirectory(prefix="onnxbuild-verify-") as tmp:
            settings = onnxbuild.Settings(cache_dir=Path(tmp) / "cache", artifacts_dir=Path(tmp) / "artifacts")
            report = onnxbuild.build([recipe.path], settings, jobs=jobs)
            rebuilt = {s["name"]: s for r in report.recipes for s in r.steps}
        verdict = RecipeVerdict(recipe.name)
        from onnxbuild.pipeline import steps_for

        measured = {s.name: s.measured for s in steps_for(recipe)}
        if in_folder:
            verdict.steps.append(StepVerdict("artifacts", "differs", "; ".join(in_folder)))
        for step in manifest["steps"]:
            if not isinstance(step, dict) or not isinstance(step.get("outputs"), list):
                continue
            again = rebuilt.get(step["name"])
            if again is None or again["status"] not in ("built", "cached"):
                verdict.steps.append(
                    StepVerdict(
                        step["name"],
                        "missing",
                        f"the rebuild did not produce it ({again['reason'] if again else 'no such step'})",
                    )
                )
                continue
            before = {o["path"]: o["sha256"] for o in step["outputs"]}
            after = {o["path"]: o["sha256"] for o in again["outputs"]}
            differing = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
            why = measured.get(step["name"], "")
            if not differing:
                verdict.steps.append(StepVerdict(step["name"], "identical"))
            elif why:
                verdict.steps.append(
                    StepVerdict(step["name"], "hardware-dependent", f"{', '.join(differing)} differ ({why})")
                )
            else:
                verdict.steps.append(
                    StepVerdict(step["name"], "differs", f"{', '.join(differing)} differ from the manifest")
                )
        verdicts.append(verdict)
    return verdicts

"""Planning: recipe steps -> keys -> a decision per step, with the reason in words.

Planning reads the cache and hashes local files but changes nothing. The runner
executes a plan and re-derives each key once the step's inputs exist, because a
step whose inputs are rebuilt identical is still a cache hit (like Bazel, unlike make).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, TypedDict

from onnxbuild._util import MISSING, json_changes
from onnxbuild.engine.cache import Cache, EntryRecord, step_key
from onnxbuild.errors import Problem, RecipeError, UsageError
from onnxbuild.recipe.model import Recipe
from onnxbuild.spec import StepSpec

Action = Literal["run", "cached", "outside"]
"""``outside``: a step beyond ``--target`` whose inputs are still to be rebuilt: taken from the
cache if they come out identical, else left out of this build (never run)."""


class Ingredients(TypedDict):
    """What goes into a step's key (``ingredients``); the cache entry and the lock keep it as JSON."""

    kind: str
    code: dict[str, str]
    """Digest of every onnxbuild module its run can reach (``onnxbuild.engine.codekeys``), by module."""
    params: dict[str, object]
    outputs: list[str]
    inputs: dict[str, str]
    files: dict[str, str]
    identity: dict[str, object]
    packages: dict[str, str]


LastBuild = Mapping[str, object]
"""A step's record in the cache's last/<recipe>.json (its key, ingredients, seconds) or in a lock:
JSON read back, every field checked before use."""

FORCED = "forced (--force)"
OUTSIDE = "outside --target: kept if its inputs are rebuilt identical, else left out"
DEPENDS = "only if its input from"
"""How a dependent of a step that will run is planned: it runs only if that input's bytes change."""


@dataclass(frozen=True)
class PlannedStep:
    """A step of the plan: what it is, whether it runs (and why) or comes from the cache."""

    recipe: Recipe
    spec: StepSpec
    action: Action
    reasons: tuple[str, ...]
    key: str | None
    """None while an input is still to be built: the key is known only after it is."""
    ingredients: Ingredients | None
    entry: EntryRecord | None

    @property
    def label(self) -> str:
        return f"{self.recipe.name}:{self.spec.name}"

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)

    @property
    def forced(self) -> bool:
        return self.reasons == (FORCED,)


@dataclass(frozen=True)
class Plan:
    """Every planned step of every recipe, in dependency order, with its decision and reason."""

    steps: tuple[PlannedStep, ...]
    recipes: tuple[Recipe, ...]
    out_of_step: tuple[str, ...] = ()
    """Files of current steps missing or altered in the artifact folders (filled in by ``api.plan``)."""

    @property
    def would_run(self) -> tuple[PlannedStep, ...]:
        return tuple(s for s in self.steps if s.action == "run")

    @property
    def up_to_date(self) -> bool:
        return not self.would_run and not self.out_of_step

    estimate_s: float | None = None
    """Seconds the steps that would run took when last built here (None: some never were)."""


def ingredients(spec: StepSpec, input_digests: dict[str, str], cache: Cache) -> Ingredients:
    """Everything that can change a step's outputs, and nothing that cannot (no paths, no times)."""
    return {
        "kind": spec.kind,
        "code": cache.code((spec.entry, *spec.code_also), spec.code_stops) if spec.entry else {},
        "params": _without(spec.params, spec.unkeyed),
        # Two steps alike in all else but the files they declare must not share an entry:
        # the entry records output paths, and the second would get the first's.
        "outputs": list(spec.outputs),
        "inputs": input_digests,
        "files": {label: file_identity(path, cache) for label, path in sorted(spec.files.items())},
        "identity": spec.identity,
        "packages": {name: cache.versions.get(name) for name in spec.packages},
    }


def _without(params: dict[str, object], paths: tuple[str, ...]) -> dict[str, object]:
    """``params`` less the dotted ``paths`` (a copy: the spec's own params stay whole)."""
    if not paths:
        return params
    drop = {tuple(p.split(".")) for p in paths}

    def walk(node: object, at: tuple[str, ...]) -> object:
        if isinstance(node, dict):
            return {k: walk(v, (*at, k)) for k, v in node.items() if (*at, k) not in drop}
        return node

    return {k: walk(v, (k,)) for k, v in params.items() if (k,) not in drop}


def file_identity(path: str | os.PathLike[str], cache: Cache) -> str:
    from pathlib import Path

    p = Path(path)
    try:
        if p.is_dir():
            return "tree:" + cache.tree_digest(p)
        if p.is_file():
            return cache.file_digest(p)
    except OSError:  # a name the OS refuses (too long, say): the step that reads it says so
        return "missing"
    return "missing"


def select(steps: list[StepSpec], target: str | None, recipe: Recipe) -> list[StepSpec]:
    """The steps needed for ``target`` (it and everything it depends on), or all."""
    if target is None:
        return steps
    by_name = {s.name: s for s in steps}
    if target not in by_name:
        raise UsageError(f"{recipe.path}: no step named {target!r} (this recipe's steps: {', '.join(by_name)})")
    needed: set[str] = set()
    todo = [target]
    while todo:
        name = todo.pop()
        if name not in needed:
            needed.add(name)
            todo.extend(by_name[name].deps)
    return [s for s in steps if s.name in needed]


def plan(
    recipes: list[Recipe],
    cache: Cache,
    steps_of: Callable[[Recipe], list[StepSpec]],
    *,
    force: bool = False,
    target: str | None = None,
    single: bool = False,
) -> Plan:
    """Decide, for every step of every recipe, whether it runs or comes from the cache, and why.

    ``steps_of`` turns a recipe into its step specs (``onnxbuild.pipeline.steps_for``): the
    planner knows no step kind, only what each spec says of itself.

    With ``target``, the steps it needs are planned as usual; every other step whose outputs
    are current comes from the cache too, so the artifact folder keeps them (a targeted build
    never empties it). ``force`` reruns every needed step, or, with ``single``, the target alone.
    """
    if single and target is None:
        raise UsageError("--single forces just the --target step; name one with --target STEP")
    names: dict[str, str] = {}
    for recipe in recipes:
        if recipe.name in names and names[recipe.name] != recipe.path:
            raise RecipeError(
                [
                    Problem(
                        recipe.path,
                        None,
                        None,
                        "name",
                        f"{recipe.name!r} is also the name of {names[recipe.name]}; artifact folders would collide",
                    )
                ]
            )
        names[recipe.name] = recipe.path
    planned: list[PlannedStep] = []
    for recipe in recipes:
        last = cache.last_build(recipe.name)
        done: dict[str, PlannedStep] = {}
        every = steps_of(recipe)
        needed = {s.name for s in select(every, target, recipe)}
        left_out: set[str] = set()
        for spec in every:
            if spec.name in needed:
                step = plan_step(
                    recipe, spec, done, cache, last.get(spec.name), force=force and (not single or spec.name == target)
                )
            elif any(d in left_out for d in spec.deps):
                left_out.add(spec.name)
                continue
            else:
                step = plan_step(recipe, spec, done, cache, last.get(spec.name), force=False)
                if step.action == "run":
                    if step.key is not None:  # out of date and not asked for: not this build's business
                        left_out.add(spec.name)
                        continue
                    step = PlannedStep(recipe, spec, "outside", (OUTSIDE,), None, None, None)
            done[spec.name] = step
            planned.append(step)
    return Plan(tuple(planned), tuple(recipes), estimate_s=_estimate(planned, cache))


def _estimate(planned: list[PlannedStep], cache: Cache) -> float | None:
    """The last build's seconds of every step that would run, summed; None when one has none."""
    total = 0.0
    lasts: dict[str, dict[str, LastBuild]] = {}
    for step in planned:
        if step.action != "run":
            continue
        last = lasts.setdefault(step.recipe.name, cache.last_build(step.recipe.name)).get(step.spec.name, {})
        seconds = last.get("seconds")
        if not isinstance(seconds, (int, float)):
            return None
        total += seconds
    return total


def plan_step(
    recipe: Recipe,
    spec: StepSpec,
    done: dict[str, PlannedStep],
    cache: Cache,
    last: LastBuild | None,
    *,
    force: bool,
) -> PlannedStep:
    pending = [d for d in spec.deps if done[d].entry is None]
    if pending:
        # --force reruns every selected step, not only the first: a dependent whose
        # rebuilt input comes out identical must not be taken from the cache.
        if force:
            return PlannedStep(recipe, spec, "run", (FORCED,), None, None, None)
        if not last or not isinstance(last.get("ingredients"), dict):
            return PlannedStep(recipe, spec, "run", ("no entry in cache (never built)",), None, None, None)
        # Its key waits for the input's bytes; what the step itself changed is known now.
        waiting = f"{DEPENDS} {', '.join(pending)} changes"
        return PlannedStep(recipe, spec, "run", (*own_changes(last, spec, cache), waiting), None, None, None)
    digests = input_digests(
        spec, {d: done[d].entry for d in spec.deps}, frozenset(d for d in spec.deps if done[d].spec.measured)
    )
    ing = ingredients(spec, digests, cache)
    key = step_key(ing)
    entry = cache.get(key)
    if force:
        return PlannedStep(recipe, spec, "run", (FORCED,), key, ing, None)
    if entry is not None:
        why = "in the remote cache (make pulls it)" if key in cache.remote_only else "up to date"
        return PlannedStep(recipe, spec, "cached", (why,), key, ing, entry)
    return PlannedStep(recipe, spec, "run", tuple(explain(last, ing, key)), key, ing, None)


MEASURED_BY = "measured by "
"""How a key names an input from a measured step (see ``input_digests``)."""


def input_digests(
    spec: StepSpec, entries: dict[str, EntryRecord | None], measured: frozenset[str] = frozenset()
) -> dict[str, str]:
    """Each input's digest; an input from a step in ``measured`` (its outputs are
    measurements: peaks, timings) by that step's key instead, since the same measurement
    never gives the same bytes twice: a rebuild or a cold cache would otherwise rerun every
    step after it."""
    out: dict[str, str] = {}
    for inp in spec.inputs:
        entry = entries[inp.step]
        assert entry is not None
        by_path = {o["path"]: o["sha256"] for o in entry["outputs"]}
        out[f"{inp.step}:{inp.path}"] = MEASURED_BY + entry["key"] if inp.step in measured else by_path[inp.path]
    return out


def own_changes(last: LastBuild | None, spec: StepSpec, cache: Cache) -> list[str]:
    """What changed in a step's own ingredients (its inputs aside) since its last build."""
    then = last.get("ingredients") if last else None
    if not last or not isinstance(then, dict):
        return []
    now = ingredients(spec, {}, cache)
    before = {**then, "inputs": {}}
    return [r for r in explain({**last, "ingredients": before, "key": None}, now, "") if r != "no entry in cache"]


def explain(last: LastBuild | None, now: Ingredients, key: str) -> list[str]:
    """Why a step must run, in words, by comparing its ingredients with its last build's."""
    before = last.get("ingredients") if last else None
    if not last or not isinstance(before, dict):
        return (
            ["no entry in cache (never built)"]
            if not last or last.get("key") is None
            else ["its key differs from the lock's (no ingredients recorded)"]
        )
    if last.get("key") == key:
        return ["no entry in cache (removed by gc, or damaged)"]
    reasons: list[str] = []
    code = _code_changes(before.get("code"), now["code"])
    if code:
        reasons.append(f"the {now['kind']} step's code changed ({code})")
    if before.get("outputs") != now["outputs"]:
        reasons.append(f"its declared outputs changed ({_short(before.get('outputs'))} -> {_short(now['outputs'])})")
    for path, old, new in json_changes(before.get("params", {}), now["params"]):
        reasons.append(f"{path} {_change_words(old, new)}")
    for name in sorted(set(before.get("packages", {})) | set(now["packages"])):
        old, new = before.get("packages", {}).get(name), now["packages"].get(name)
        if old != new:
            reasons.append(f"{name} changed {old} -> {new}")
    for label in sorted(set(before.get("files", {})) | set(now["files"])):
        old, new = before.get("files", {}).get(label), now["files"].get(label)
        if old == new or old is None or new is None:
            continue  # a file newly named or no longer named shows up as a params change
        reasons.append(f"{label} is missing" if new == "missing" else f"the contents of {label} changed")
    for path, old, new in json_changes(before.get("identity", {}), now["identity"]):
        reasons.append(f"{path} {_change_words(old, new)}")
    changed_inputs = sorted(
        {
            k.split(":", 1)[0]
            for k in set(before.get("inputs", {})) | set(now["inputs"])
            if before.get("inputs", {}).get(k) != now["inputs"].get(k)
        }
    )
    if changed_inputs:
        reasons.append(f"its input from {', '.join(changed_inputs)} changed")
    return reasons or ["no entry in cache"]


def _code_changes(before: object, now: dict[str, str]) -> str:
    """Which of a step's onnxbuild modules changed, were added or no longer reached, in words;
    "" when none did."""
    if not isinstance(before, dict):  # a key from before code was keyed (a kind's version number)
        return "onnxbuild's code is now in the key" if now else ""
    names = sorted(set(before) | set(now))
    changed = [m for m in names if m in before and m in now and before[m] != now[m]]
    added = [m for m in names if m not in before]
    gone = [m for m in names if m not in now]
    words = [f"{_short_list(changed)}"] if changed else []
    words += [f"now reaches {_short_list(added)}"] if added else []
    words += [f"no longer reaches {_short_list(gone)}"] if gone else []
    return "; ".join(words)


def _short_list(modules: list[str], most: int = 4) -> str:
    return ", ".join(modules[:most]) + (f" and {len(modules) - most} more" if len(modules) > most else "")


def _change_words(old: object, new: object) -> str:
    if old is MISSING:
        return f"added ({_short(new)})"
    if new is MISSING:
        return f"removed (was {_short(old)})"
    return f"changed {_short(old)} -> {_short(new)}"


def _short(value: object) -> str:
    import json

    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 60 else text[:57] + "..."

"""What ``onnxbuild diff`` found, as data (RecipeDiff, Metric, Cost) and as text, Markdown or
JSON (pure functions: the HTML page is in report/page.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

from onnxbuild._util import MISSING, format_duration, format_ms
from onnxbuild.review.modeldiff import ModelDiff, ModelRow

if TYPE_CHECKING:
    from onnxbuild.engine.cache import Cache
    from onnxbuild.engine.graph import Plan


@dataclass
class RecipeDiff:
    """One recipe's diff: its key changes, the steps they rebuild, figures and model files that changed."""

    path: str
    status: str  # added | deleted | changed | unchanged
    changes: list[tuple[str, object, object]] = field(default_factory=list)
    invalidated: list[str] = field(default_factory=list)
    metrics: list[Metric] = field(default_factory=list)
    error: str = ""
    figures: str = ""
    """Why there are no figure rows: "unchanged" (both sides built, same figures) or "not built on one side"."""
    models: list[ModelDiff] = field(default_factory=list)
    """ONNX files both sides built whose bytes differ: what changed inside each."""
    cost: Cost | None = None
    """What `make` of the working tree's recipe would do here."""


@dataclass(frozen=True)
class Cost:
    """The working tree's side as `plan` sees it: steps to build, taken from the remote, cached."""

    build: int
    remote: int
    cached: int
    estimate_s: float | None

    @staticmethod
    def of(planned: Plan, cache: Cache) -> Cost:
        remote = sum(
            1 for s in planned.steps if s.action == "cached" and (s.key in cache.pulled or s.key in cache.remote_only)
        )
        cached = sum(1 for s in planned.steps if s.action == "cached") - remote
        return Cost(len(planned.would_run), remote, cached, planned.estimate_s)


@dataclass(frozen=True)
class Metric:
    """A figure on both sides of a diff, as numbers (JSON) with a unit for people (text, md, html)."""

    what: str
    base: float | None
    now: float | None
    unit: str  # "ms" | "bytes" | "" (a plain number)

    def shown(self, value: float | None) -> str:
        if value is None:
            return "-"
        if self.unit == "ms":
            return format_ms(value)
        if self.unit == "bytes":
            return f"{int(value):,}"
        return f"{value:.3g}"

    @property
    def change(self) -> str:
        if self.base and self.now and self.unit == "ms":
            return f"{self.shown(self.now)} ({self.now / self.base:.2f}x)"
        return self.shown(self.now) if self.now is not None else "new"


def render(base: str, diffs: list[RecipeDiff], fmt: str) -> str:
    """The diff as ``json``, ``md`` or text (HTML: ``report.page.render_diff``)."""
    if fmt == "json":
        return (
            json.dumps(
                {
                    "base": base,
                    "summary": _summary(diffs),
                    "recipes": [
                        {
                            "path": d.path,
                            "status": d.status,
                            "error": d.error,
                            "changes": [_json_change(k, a, b) for k, a, b in d.changes],
                            "invalidated": d.invalidated,
                            "metrics": [
                                {"what": m.what, "base": m.base, "now": m.now, "unit": m.unit} for m in d.metrics
                            ],
                            "figures": d.figures or "changed",
                            "models": [
                                {
                                    "step": m.step,
                                    "path": m.path,
                                    "changes": [
                                        {"what": r.what, "base": r.base, "now": r.now, "unit": r.unit} for r in m.rows
                                    ],
                                    "drift": m.drift,
                                    "drift_inputs": m.drift_inputs,
                                    "note": m.note or None,
                                }
                                for m in d.models
                            ],
                        }
                        for d in diffs
                    ],
                },
                indent=2,
                default=str,
            )
            + "\n"
        )
    md = fmt == "md"
    lines = [f"## onnxbuild diff against {base[:12]}" if md else f"onnxbuild diff against {base[:12]}", ""]
    if not diffs:
        lines.append("No recipe changed.")
    else:
        lines += [f"**{summary_line(diffs)}**" if md else summary_line(diffs), ""]
    for d in diffs:
        lines.append(f"### `{d.path}`: {d.status}" if md else f"{d.path}: {d.status}")
        if d.error:
            lines += ["", "```", d.error, "```"] if md else [f"  {d.error}"]
        if d.changes:
            if md:
                lines += ["", "| key | base | working tree |", "|---|---|---|"]
                lines += [f"| `{cell(k)}` | {cell(show(a))} | {cell(show(b))} |" for k, a, b in d.changes]
            else:
                lines += [f"  {k}: {show(a)} -> {show(b)}" for k, a, b in d.changes]
        if d.invalidated:
            lines += [
                "",
                f"Steps that rebuild: {', '.join(d.invalidated)}" if md else f"  rebuilds: {', '.join(d.invalidated)}",
            ]
        if d.metrics:
            if md:
                lines += ["", "| figure | base | working tree |", "|---|---|---|"] + [
                    f"| {cell(m.what)} | {m.shown(m.base)} | {cell(m.change)} |" for m in d.metrics
                ]
            else:
                lines += [f"  {m.what}: {m.shown(m.base)} -> {m.change}" for m in d.metrics]
        elif d.figures:
            lines += ["", f"Figures: {d.figures}."] if md else [f"  figures: {d.figures}"]
        if d.models:
            rows = [(m.path, r.what, r.shown(r.base), r.shown(r.now)) for m in d.models for r in model_lines(m)]
            if md:
                lines += ["", "| model file | what | base | working tree |", "|---|---|---|---|"] + [
                    f"| `{f}` | {cell(w)} | {cell(a)} | {cell(b)} |" for f, w, a, b in rows
                ]
            else:
                lines += ["  model files:"] + [f"    {f}: {w}: {a} -> {b}" for f, w, a, b in rows]
        lines.append("")
    return "\n".join(lines) + "\n"


class DiffSummary(TypedDict):
    """What a diff costs to build, over every recipe."""

    recipes: int
    changed: int
    to_build: int
    from_remote: int
    cached: int
    estimate_s: float | None


def _summary(diffs: list[RecipeDiff]) -> DiffSummary:
    costs = [d.cost for d in diffs if d.cost is not None]
    estimates = [c.estimate_s for c in costs if c.build]
    return {
        "recipes": len(diffs),
        "changed": sum(1 for d in diffs if d.status != "unchanged"),
        "to_build": sum(c.build for c in costs),
        "from_remote": sum(c.remote for c in costs),
        "cached": sum(c.cached for c in costs),
        "estimate_s": None if any(e is None for e in estimates) else sum(e for e in estimates if e is not None),
    }


def summary_line(diffs: list[RecipeDiff]) -> str:
    """Terraform's last line, first: what the change costs to build."""
    s = _summary(diffs)
    n = s["changed"]
    line = (
        f"{n} of {s['recipes']} recipe{'s' if s['recipes'] != 1 else ''} changed; "
        f"{s['to_build']} step{'s' if s['to_build'] != 1 else ''} to build"
    )
    line += f", {s['from_remote']} from the remote cache, {s['cached']} cached"
    if s["to_build"]:
        line += (
            f"; {format_duration(s['estimate_s'])} by the last build's timings"
            if s["estimate_s"] is not None
            else "; not built here before: no estimate"
        )
    return line


def model_lines(m: ModelDiff) -> list[ModelRow]:
    """A changed model file as rows for people: what changed inside, then how far its outputs moved."""
    rows = list(m.rows) or [
        ModelRow("contents", "same operators, signature and weight bytes", "(weights' values differ)")
    ]
    if m.drift:
        worst = max(m.drift, key=lambda k: m.drift[k])
        where = ", ".join(f"{k}={v}" for k, v in m.drift_inputs.items())
        rows.append(
            ModelRow(
                f"output drift on the validation inputs ({where})", "-", f"max abs diff {m.drift[worst]:.3g} ({worst})"
            )
        )
    if m.note:
        rows.append(ModelRow("output drift", "-", m.note))
    return rows


def _json_change(key: str, old: object, new: object) -> dict[str, object]:
    """A change as JSON: absent sides are null, and ``change`` says which kind it is."""
    kind = "added" if old is MISSING else "removed" if new is MISSING else "changed"
    return {"key": key, "change": kind, "base": None if old is MISSING else old, "now": None if new is MISSING else new}


def cell(text: str) -> str:
    """Text safe in a Markdown table cell: a `|` in a value would start a new column."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def show(value: object) -> str:
    if value is MISSING:
        return "(absent)"
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."

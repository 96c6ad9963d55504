"""The ``onnxbuild`` command: parse options, call one library function, print the result.

This is the only module that prints or exits. Library errors become ``Error: ...``
with exit code 2 (bad recipe or usage) or 1 (failed build), never a traceback.

Its size (one short function per command and option set, ~960 lines, most of them click
options, one per line as ruff format writes them) is on purpose: the commands read top to
bottom in the order of ``onnxbuild --help``, and none holds logic a library caller would
need (that is in api.py).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import click

from onnxbuild import api
from onnxbuild._util import format_duration
from onnxbuild._version import __version__
from onnxbuild.errors import INTERRUPTED, INTERRUPTED_EXIT, OnnxbuildError, RecipeError, UsageError

if TYPE_CHECKING:
    from collections.abc import Callable

    from onnxbuild.engine.graph import PlannedStep
    from onnxbuild.engine.manifest import StepRecord
    from onnxbuild.engine.runner import BuildReport

_Command = TypeVar("_Command", bound="Callable[..., object]")

EPILOG_MAKE = """\b
Examples:
  onnxbuild make recipes/gpt2.yaml
  onnxbuild make recipes/*.yaml -j 2 --keep-going
  onnxbuild make recipes/gpt2.yaml --target check --force
  onnxbuild make recipes/gpt2.yaml --target benchmark --force --single
"""


class Group(click.Group):
    """The command group: maps an error to exit 1 when --detailed-exitcode asks for Terraform's codes."""

    def invoke(self, ctx: click.Context) -> object:
        # Terraform's -detailed-exitcode: 0 nothing to do, 2 changes, 1 any error (a
        # recipe error too), so a script can tell "would change" from "cannot tell".
        detailed = DETAILED in ctx.args  # the command name aside, its own arguments
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            if not detailed:
                raise
            exc.show()
            ctx.exit(1)
        except RecipeError as exc:
            click.echo(
                f"Error: {len(exc.problems)} problem{'s' if len(exc.problems) != 1 else ''} in the recipe:", err=True
            )
            for p in exc.problems:
                click.echo(f"  {p}", err=True)
            ctx.exit(1 if detailed else exc.exit_code)
        except OnnxbuildError as exc:
            click.echo(f"Error: {exc}", err=True)
            ctx.exit(1 if detailed else exc.exit_code)
        except KeyboardInterrupt:
            click.echo(INTERRUPTED, err=True)
            ctx.exit(INTERRUPTED_EXIT)
        except OSError as exc:
            # the disk is full, the cache or artifacts folder is read-only: say which, no traceback
            where = f" ({exc.filename})" if exc.filename else ""
            hint = {
                28: "free some space or point --cache-dir/--artifacts-dir at a bigger disk",
                30: "the file system is read-only; pass a writable --cache-dir/--artifacts-dir",
                13: "permission denied; pass a folder you can write to",
            }
            click.echo(
                f"Error: {exc.strerror or exc}{where}; {hint.get(exc.errno or 0, 'check the disk and the folder')}",
                err=True,
            )
            ctx.exit(1)


DETAILED = "--detailed-exitcode"
detailed_option = click.option(
    DETAILED,
    "detailed",
    is_flag=True,
    help="Exit codes as Terraform's plan -detailed-exitcode: 0 nothing changes, 2 something changes, 1 any error "
    "(recipe errors included).",
)


def _settings(ctx: click.Context) -> api.Settings:
    settings: api.Settings = ctx.obj
    return settings


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="onnxbuild")
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar=api.CACHE_ENV,
    default=None,
    help="Cache folder (default .onnxbuild/cache; env ONNXBUILD_CACHE_DIR).",
)
@click.option(
    "--artifacts-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("artifacts"),
    show_default=True,
    help="Where artifacts/<recipe-name>/ folders are written.",
)
@click.option(
    "--cache-url",
    envvar="ONNXBUILD_CACHE_URL",
    default=None,
    metavar="URL",
    help="Remote cache shared with other machines (any fsspec URL: file://, s3://, gs://); "
    "env ONNXBUILD_CACHE_URL or [tool.onnxbuild] cache_url.",
)
@click.option(
    "--cache-read-only",
    is_flag=True,
    envvar="ONNXBUILD_CACHE_READ_ONLY",
    help="Pull from the remote cache but never push (untrusted pull-request builds).",
)
@click.pass_context
def cli(
    ctx: click.Context, cache_dir: Path | None, artifacts_dir: Path, cache_url: str | None, cache_read_only: bool
) -> None:
    """Build ONNX model artifacts from YAML recipes, cached and reproducible.

    \b
    Start with:
      onnxbuild make recipes/gpt2.yaml     build (export, check, validate)
      onnxbuild plan recipes/gpt2.yaml     what would run, and why
      onnxbuild show recipes/gpt2.yaml     the recipe with every default filled in
    """
    if cache_url is None and ctx.invoked_subcommand in ("make", "plan", "diff", "cache"):
        from onnxbuild.engine.remote import config_from_project

        config = config_from_project(Path.cwd())
        cache_url = config.get("cache_url")
        cache_read_only = cache_read_only or bool(config.get("cache_read_only", False))
    ctx.obj = api.Settings(
        cache_dir=cache_dir or Path(".onnxbuild/cache"),
        artifacts_dir=artifacts_dir,
        cache_url=cache_url,
        cache_read_only=cache_read_only,
    )


def _override(field: str) -> Callable[[click.Context, click.Parameter, object], None]:
    """A click callback that lets a global option be given after the command name too."""

    def callback(ctx: click.Context, param: click.Parameter, value: object) -> None:
        if value is None or value is False:
            return
        from dataclasses import replace

        ctx.obj = replace(ctx.obj, **{field: value})

    return callback


def settings_options(command: _Command) -> _Command:
    """--cache-dir, --artifacts-dir, --cache-url and --cache-read-only after the command name
    (``onnxbuild make --cache-url URL recipe.yaml``), as people type them; they override
    the same options given before it."""
    options = [
        click.option(
            "--cache-dir",
            type=click.Path(file_okay=False, path_type=Path),
            default=None,
            expose_value=False,
            callback=_override("cache_dir"),
            help="Cache folder (also accepted before the command).",
        ),
        click.option(
            "--artifacts-dir",
            type=click.Path(file_okay=False, path_type=Path),
            default=None,
            expose_value=False,
            callback=_override("artifacts_dir"),
            help="Where artifacts/<recipe-name>/ folders are written (also before the command).",
        ),
        click.option(
            "--cache-url",
            default=None,
            metavar="URL",
            expose_value=False,
            callback=_override("cache_url"),
            help="Remote cache URL (also before the command).",
        ),
        click.option(
            "--cache-read-only",
            is_flag=True,
            default=False,
            expose_value=False,
            callback=_override("cache_read_only"),
            help="Pull from the remote cache, never push (also before the command).",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


class Printer:
    """Step-by-step progress on stderr; colour only on a terminal."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.tty = sys.stderr.isatty()

    def _out(self, text: str, fg: str | None = None) -> None:
        if not self.quiet:
            click.echo(click.style(text, fg=fg) if self.tty else text, err=True)

    def step_started(self, step: PlannedStep) -> None:
        self._out(f"  run    {step.label}  ({step.reason})", fg="cyan")

    def step_finished(self, step: PlannedStep, record: StepRecord, seconds: float) -> None:
        status = record["status"]
        summary = record["data"].get("summary", "") if status in ("built", "cached") else record["reason"]
        colours = {"built": "green", "cached": "blue", "failed": "red", "skipped": "yellow"}
        took = f" in {seconds:.1f}s" if status == "built" else ""
        text = f"  {status:<6} {step.label}{took}" + (f"  {summary}" if summary else "")
        self._out(text, fg=colours.get(status))

    def warning(self, message: str) -> None:
        self._out(f"  warning: {message}", fg="yellow")


@cli.command(epilog=EPILOG_MAKE)
@click.argument("recipes", nargs=-1, required=True)
@click.option(
    "--target",
    "-t",
    metavar="STEP",
    help="Build only this step and what it needs (e.g. check); "
    "other steps' current outputs stay in the artifact folder.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Rerun steps even if cached: every step (with --target: the target and every step it needs).",
)
@click.option(
    "--single",
    is_flag=True,
    help="With --force and --target: rerun only the target step; what it needs comes from the cache "
    "(built if missing).",
)
@click.option(
    "--jobs",
    "-j",
    type=int,
    default=None,
    help="Steps to run at once (default 1; with --executor ray, as many as the cluster places).",
)
@click.option("--keep-going", "-k", is_flag=True, help="After a failure, build everything that does not depend on it.")
@click.option("--json", "as_json", is_flag=True, help="Print the build report as JSON on stdout.")
@click.option("--strict-providers", is_flag=True, help="Fail the build when a target provider cannot be used here.")
@click.option(
    "--lock",
    "write_lock",
    is_flag=True,
    help="Write <recipe>.lock.json (step keys, ingredients, output digests) beside each recipe that built.",
)
@click.option(
    "--frozen",
    is_flag=True,
    help="CI: fail when a recipe's lock is stale, or when an output, built or pulled, "
    "differs from the digest in the lock.",
)
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default=None,
    help="Where steps run: local processes (default) or Ray tasks; or [tool.onnxbuild] executor.",
)
@click.option(
    "--ray-address",
    metavar="ADDRESS",
    default=None,
    help="A Ray cluster (auto, ray://host:port); default: start a local Ray instance. Or [tool.onnxbuild] ray_address.",
)
@click.option(
    "--ray-retries",
    type=click.IntRange(0, 20),
    default=2,
    show_default=True,
    help="Times Ray reruns a step whose worker died.",
)
@settings_options
@click.pass_context
def make(
    ctx: click.Context,
    recipes: tuple[str, ...],
    target: str | None,
    force: bool,
    single: bool,
    jobs: int | None,
    keep_going: bool,
    as_json: bool,
    strict_providers: bool,
    write_lock: bool,
    frozen: bool,
    executor: str | None,
    ray_address: str | None,
    ray_retries: int,
) -> None:
    """Build the artifacts of RECIPES (export, check, validate, ...)."""
    if write_lock and target is not None:
        raise click.UsageError("--lock records whole builds; drop --target")
    if write_lock and frozen:
        raise click.UsageError("--frozen checks against the lock and --lock rewrites it; give one")
    if executor is None or ray_address is None:
        from onnxbuild.engine.remote import config_from_project

        config = config_from_project(Path.cwd())
        executor = executor or str(config.get("executor", "local"))
        ray_address = ray_address or config.get("ray_address")
    printer = Printer(quiet=False)
    report = api.build(
        recipes,
        _settings(ctx),
        jobs=jobs,
        keep_going=keep_going,
        force=force,
        target=target,
        single=single,
        reporter=printer,
        executor=executor,
        ray_address=ray_address,
        ray_retries=ray_retries,
        frozen=frozen,
    )
    if as_json:
        click.echo(json.dumps(_report_json(report), indent=2, sort_keys=True))
    else:
        click.echo(_summary(report))
    if write_lock:
        for path in api.write_locks(report, _settings(ctx)):
            click.echo(f"lock: {path}", err=True)
    if not report.ok:
        from onnxbuild.engine.runner import raise_for_failures

        raise_for_failures(report)
    if strict_providers:
        api.check_providers(report)


def _report_json(report: BuildReport) -> dict[str, object]:
    return {
        "ok": report.ok,
        "seconds": round(report.seconds, 3),
        "recipes": [
            {
                "name": r.recipe.name,
                "recipe": r.recipe.path,
                "artifacts": str(r.artifacts),
                "ok": r.ok,
                "steps": r.steps,
            }
            for r in report.recipes
        ],
    }


def _summary(report: BuildReport) -> str:
    lines = []
    for r in report.recipes:
        counts: dict[str, int] = {}
        for s in r.steps:
            counts[s["status"]] = counts.get(s["status"], 0) + 1
        state = "ok" if r.ok else "FAILED"
        pulled = sum(1 for s in r.steps if s["status"] == "cached" and s["reason"] == "pulled from the remote cache")
        lines.append(
            f"{r.recipe.name}: {state} "
            f"({', '.join(f'{n} {k}' for k, n in counts.items())}"
            f"{f'; {pulled} pulled from the remote cache' if pulled else ''})"
        )
        width = max(len(s["name"]) for s in r.steps) if r.steps else 4
        for s in r.steps:
            timing = r.timings["steps"].get(s["name"])
            secs = timing["seconds"] if timing is not None else 0.0
            took = (
                f"{secs:6.1f}s"
                if s["status"] == "built"
                else ("pulled " if s["reason"] == "pulled from the remote cache" else "       ")
            )
            outs = ", ".join(o["path"] for o in s["outputs"])
            lines.append(f"  {s['name']:<{width}}  {s['status']:<7} {took}  {outs}")
        weights = next((s["data"].get("weights") for s in r.steps if s["data"].get("weights")), None)
        if weights and weights != "pretrained":
            why = next((s["data"].get("why") for s in r.steps if s["data"].get("why")), "")
            lines.append(f"  weights: {weights}" + (f" ({why})" if why else ""))
        lines.append(f"  artifacts: {r.artifacts}/")
    lines.append(f"done in {report.seconds:.2f}s")
    return "\n".join(lines)


@cli.command()
@click.argument("recipes", nargs=-1, required=True)
@click.option("--target", "-t", metavar="STEP", help="Plan only this step and what it needs.")
@click.option("--force", is_flag=True, help="Plan as if --force were given to make.")
@click.option("--single", is_flag=True, help="Plan as if --single were given to make.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option(
    "--check",
    "check_lock",
    is_flag=True,
    help="Only check that each <recipe>.lock.json matches its recipe; exit 1 if stale.",
)
@detailed_option
@settings_options
@click.pass_context
def plan(
    ctx: click.Context,
    recipes: tuple[str, ...],
    target: str | None,
    force: bool,
    single: bool,
    as_json: bool,
    check_lock: bool,
    detailed: bool,
) -> None:
    """Show what `make` would do and why, without doing it.

    Exits 0 when everything is up to date, 1 when some step would run (or a file
    is to pull, or an artifact is out of step), so CI can assert that committed
    artifacts are current; 2 for a recipe or usage error. With --detailed-exitcode:
    0 / 2 changes / 1 error, as Terraform.

    \b
    Example:
      onnxbuild plan recipes/gpt2.yaml
      export: will run: export.opset changed 17 -> 18
      check: will run: only if its input from export changes
    """
    if check_lock:
        problems = api.check_locks(recipes, _settings(ctx))
        if as_json:
            click.echo(json.dumps({"up_to_date": not problems, "problems": problems}, indent=2))
        else:
            for line in problems:
                click.echo(line)
        if problems:
            from onnxbuild.errors import BuildFailed

            if detailed:
                click.echo(
                    "Error: the lock files do not match the recipes; "
                    "run `onnxbuild make RECIPE --lock` and commit the locks",
                    err=True,
                )
                ctx.exit(2)
            raise BuildFailed(
                "the lock files do not match the recipes; run `onnxbuild make RECIPE --lock` and commit the locks"
            )
        if not as_json:
            click.echo("locks match the recipes")
        return
    result = api.plan(recipes, _settings(ctx), force=force, target=target, single=single, reporter=Printer())
    pulls = sum(1 for s in result.steps if s.action == "cached" and s.reason.startswith("in the remote cache"))
    if as_json:
        click.echo(
            json.dumps(
                {
                    "up_to_date": result.up_to_date,
                    "estimate_s": result.estimate_s,
                    "artifacts_out_of_step": list(result.out_of_step),
                    "steps": [
                        {
                            "recipe": s.recipe.name,
                            "step": s.spec.name,
                            "action": s.action,
                            "reasons": list(s.reasons),
                            "key": s.key,
                        }
                        for s in result.steps
                    ],
                },
                indent=2,
            )
        )
    else:
        for s in result.steps:
            verb = {"run": "will run", "cached": "cached", "outside": "outside target"}[s.action]
            click.echo(f"{s.label}: {verb}: {s.reason}")
        for line in result.out_of_step:
            click.echo(line)
        n = len(result.would_run)
        stale = len(result.out_of_step)
        cached = sum(1 for s in result.steps if s.action == "cached") - pulls
        took = (
            f", {format_duration(result.estimate_s)} by the last build's timings"
            if n and result.estimate_s is not None
            else (", never built here: no estimate" if n else "")
        )
        pulled = f", {pulls} to pull" if pulls else ""
        said = (
            [f"{n} step{'s' if n != 1 else ''} would run{pulled}, {cached} cached{took}"]
            if n
            else ([f"{pulls} step{'s' if pulls != 1 else ''} to pull from the remote cache"] if pulls else [])
        )
        said += [f"{stale} artifact file{'s' if stale != 1 else ''} out of step with the cache"] if stale else []
        click.echo("; ".join(said) if said else "everything is up to date")
    ctx.exit(0 if result.up_to_date and not pulls else 2 if detailed else 1)


@cli.command("diff")
@click.argument("recipes", nargs=-1)
@click.option("--base", metavar="REF", help="Git ref to compare with (default: the merge-base with main).")
@click.option("--format", "fmt", type=click.Choice(["text", "md", "json", "html"]), default="text", show_default=True)
@detailed_option
@settings_options
@click.pass_context
def diff_command(ctx: click.Context, recipes: tuple[str, ...], base: str | None, fmt: str, detailed: bool) -> None:
    """Review recipe changes: resolved keys that differ, steps that rebuild, figure deltas.

    With no RECIPES, every recipe under recipes/ changed since the base. Markdown output
    fits a pull-request comment and is appended to $GITHUB_STEP_SUMMARY when that is set.
    Exits 0 (2 for a recipe or usage error); with --detailed-exitcode 0 when nothing
    changed, 2 when something did, 1 on any error.

    \b
    Example:
      onnxbuild diff --format md
      onnxbuild diff recipes/gpt2.yaml --base origin/main
    """
    import os

    from onnxbuild.review.diff import diff, render

    resolved_base, diffs = diff(list(recipes), base, _settings(ctx).cache())
    text = render(resolved_base, diffs, fmt)
    click.echo(text, nl=False)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary and fmt == "md":
        try:
            with open(summary, "a", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            raise UsageError(
                f"cannot append to $GITHUB_STEP_SUMMARY ({summary}: {exc.strerror}); the diff above is complete"
            ) from None
    invalid = [d.path for d in diffs if d.status == "invalid"]
    if invalid:
        raise UsageError(
            f"{len(invalid)} recipe{'s' if len(invalid) != 1 else ''} cannot be loaded: "
            f"{', '.join(invalid)} (see above)"
        )
    if detailed and any(d.status != "unchanged" for d in diffs):
        ctx.exit(2)


@cli.command("verify")
@click.argument("recipes", nargs=-1, required=True)
@click.option("--jobs", "-j", type=int, default=1, show_default=True, help="Steps to run at once in the rebuild.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdicts as JSON.")
@settings_options
@click.pass_context
def verify_command(ctx: click.Context, recipes: tuple[str, ...], jobs: int, as_json: bool) -> None:
    """Rebuild RECIPES from scratch in a throwaway cache; compare every digest with the manifest.

    Exits 1 if a deterministic step's output differs. Benchmarks and optimize levels
    extended/layout/all are hardware-dependent by design and reported as such.

    \b
    Example:
      onnxbuild verify recipes/gpt2.yaml
    """
    from onnxbuild.review.verify import verify

    verdicts = verify(list(recipes), _settings(ctx).artifacts_dir, jobs=jobs)
    if as_json:
        click.echo(
            json.dumps(
                [
                    {"recipe": v.recipe, "reproducible": v.reproducible, "steps": [s.__dict__ for s in v.steps]}
                    for v in verdicts
                ],
                indent=2,
            )
        )
    else:
        for v in verdicts:
            click.echo(f"{v.recipe}: {'byte-identical' if v.reproducible else 'NOT reproducible'}")
            for s in v.steps:
                click.echo(f"  {s.step:<20} {s.verdict}" + (f"  ({s.detail})" if s.detail else ""))
    if not all(v.reproducible for v in verdicts):
        from onnxbuild.errors import BuildFailed

        raise BuildFailed("some artifacts are not byte-reproducible (see above)")


@cli.command("report")
@click.argument("recipes", nargs=-1, required=True)
@settings_options
@click.pass_context
def report_command(ctx: click.Context, recipes: tuple[str, ...]) -> None:
    """(Re)write artifacts/<name>/report.html for RECIPES and print its path.

    One self-contained page (no network): the verdict first, then validation, generation,
    the benchmark beside PyTorch, fused ops and sizes per variant, the step graph with each
    step's status and reason, versions and digests. `make` writes it after each recipe.

    \b
    Example:
      onnxbuild report recipes/gpt2.yaml
    """
    for path in api.report(recipes, _settings(ctx)):
        click.echo(str(path))


@cli.command("explain-mismatch")
@click.argument("recipe")
@click.option(
    "--variant", required=True, metavar="NAME", help="The variant to examine: optimized, or a quantize entry's name."
)
@click.option(
    "--file", "file", metavar="PATH", help="Examine this ONNX file in the variant's place (one built elsewhere)."
)
@click.option(
    "--shape", type=int, default=0, show_default=True, help="Which of the recipe's validation shapes to feed."
)
@click.option(
    "--left-padding",
    type=int,
    default=0,
    show_default=True,
    metavar="N",
    help="Feed that shape as validation's left-padded batch: at least two rows, the last one's first N tokens padding.",
)
@click.option(
    "--out", metavar="DIR", help="Where the extracted subgraph goes (default: divergence/<recipe>-<variant>/)."
)
@settings_options
@click.pass_context
def explain_mismatch(
    ctx: click.Context, recipe: str, variant: str, file: str | None, shape: int, left_padding: int, out: str | None
) -> None:
    """Find the first node where a variant parts from the file it was made from.

    Runs both files on one validation shape with every intermediate tensor exposed,
    compares the tensors both name alike in the variant's node order with the variant's
    tolerances, and names the first node outside them, the module it came from, and a
    subgraph of that node alone (with the inputs that make it diverge) to reproduce it.
    Exits 1 when a node diverges, 0 when none does.

    \b
    Example:
      onnxbuild explain-mismatch recipes/gpt2.yaml --variant int8
    """
    found, what = api.explain_mismatch(
        recipe, variant, _settings(ctx), file=file, out=out, shape=shape, left_padding=left_padding
    )
    sizes = ", ".join(f"{k}={v}" for k, v in what["shape"].items())
    inputs = (
        "validation's inputs for that case"
        if what["validation_case"]
        else "seeded inputs (validation runs no such case)"
    )
    click.echo(
        f"{what['recipe']}: {what['variant']} ({what['candidate']}) against {what['base']} at "
        f"{sizes or 'the sample'}, {inputs} (atol {what['atol']:g}, rtol {what['rtol']:g})"
    )
    click.echo(f"  final outputs: max abs diff {found.outputs_max_abs_diff:.3g}")
    d = found.divergence
    if d is None:
        click.echo(f"  no divergence: {found.compared} shared tensors compared, all within tolerance")
        return
    click.echo(
        f"  first divergence: node {d.node} ({d.op_type}), output {d.output}: max abs diff {d.max_abs_diff:.3g}, "
        f"{d.mismatched:.1%} of its elements outside"
    )
    if d.module:
        click.echo(f"  from module: {d.module}")
    click.echo(f"  {d.compared} shared tensors compared up to it")
    click.echo(f"  subgraph: {d.subgraph} (its inputs in this run: {d.inputs})")
    ctx.exit(1)


@cli.command("upgrade-check")
@click.argument("recipes", nargs=-1, required=True)
@click.option(
    "--with",
    "withs",
    multiple=True,
    metavar="REQUIREMENT",
    help="A requirement to try, as pip takes it: --with 'onnxruntime==1.30.0' (repeatable).",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the Markdown report to this file.",
)
@settings_options
@click.pass_context
def upgrade_check(ctx: click.Context, recipes: tuple[str, ...], withs: tuple[str, ...], out: Path | None) -> None:
    """Build RECIPES with other package versions and report what changes.

    Builds them here (cached when current), then in a throwaway virtual environment with
    this one's packages and the --with requirements installed over them (its own cache and
    artifacts under .onnxbuild/upgrade/). Reports per artifact: bytes identical or not,
    validation figures moved, fused-op counts changed, latency on this machine; Markdown,
    for a pull request. Exit 1 when a contract, a validation or the build broke.

    \b
    Example:
      onnxbuild upgrade-check recipes/tiny-gpt2.yaml --with 'onnxruntime==1.30.0'
    """
    result = api.upgrade_check(recipes, withs, _settings(ctx))
    click.echo(result.markdown, nl=False)
    if out is not None:
        out.write_text(result.markdown, encoding="utf-8")
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as f:
            f.write(result.markdown)
    if result.broken:
        ctx.exit(1)


@cli.command()
@click.argument("recipe")
def show(recipe: str) -> None:
    """Print RECIPE with every default filled in (what the cache hashes).

    \b
    Example:
      onnxbuild show recipes/gpt2.yaml
    """
    click.echo(api.show(recipe), nl=False)


@cli.command()
def schema() -> None:
    """Print the recipe JSON Schema (draft 2020-12), e.g. for editor completion.

    \b
    Example:
      onnxbuild schema > recipe.schema.json
    """
    click.echo(api.schema_text(), nl=False)


@cli.command()
@click.argument("recipe")
@click.option("--format", "fmt", type=click.Choice(["text", "mermaid", "dot"]), default="text", show_default=True)
def dag(recipe: str, fmt: str) -> None:
    """Print RECIPE's step graph.

    \b
    Example:
      onnxbuild dag recipes/gpt2.yaml --format mermaid
    """
    click.echo(api.dag(recipe, fmt), nl=False)


@cli.command()
@click.argument("recipes", nargs=-1)
@settings_options
@click.pass_context
def clean(ctx: click.Context, recipes: tuple[str, ...]) -> None:
    """Remove artifact folders (of RECIPES, or all); the cache is kept.

    \b
    Example:
      onnxbuild clean recipes/gpt2.yaml
    """
    removed = api.clean(recipes, _settings(ctx))
    for path in removed:
        click.echo(f"removed {path}/")
    if not removed:
        click.echo("nothing to remove")


@cli.group()
def cache() -> None:
    """Inspect and repair the step cache.

    \b
    Example:
      onnxbuild cache verify
    """


@cache.command("verify")
@settings_options
@click.pass_context
@click.option(
    "--remote",
    is_flag=True,
    help="Check the remote cache instead: every entry and object; repair from the local cache where it can.",
)
def cache_verify(ctx: click.Context, remote: bool) -> None:
    """Re-hash every cached file; drop entries whose files are missing or were altered.

    \b
    Example:
      onnxbuild cache verify
      onnxbuild cache verify --remote --cache-url s3://bucket/onnxbuild
    """
    if remote:
        checked, problems = api.verify_remote(_settings(ctx))
        for line in problems:
            click.echo(line)
        click.echo(
            f"checked {checked} remote cache entr{'y' if checked == 1 else 'ies'}; "
            f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
        )
        return
    checked, dropped = api.verify_cache(_settings(ctx))
    for line in dropped:
        click.echo(f"dropped {line}")
    click.echo(f"checked {checked} cache entr{'y' if checked == 1 else 'ies'}; dropped {len(dropped)}")


@cache.command("keygen")
@click.argument("private_key", type=click.Path(dir_okay=False, path_type=Path))
def cache_keygen(private_key: Path) -> None:
    """Make a key pair for signed remote cache entries; prints the public key.

    The job that pushes to the remote cache sets ONNXBUILD_CACHE_SIGNING_KEY=PRIVATE_KEY;
    every reader sets ONNXBUILD_CACHE_TRUSTED_KEYS to the printed public key (or
    cache_trusted_keys in [tool.onnxbuild]) and then refuses unsigned remote entries.

    \b
    Example:
      onnxbuild cache keygen ci-cache.key
    """
    from onnxbuild.engine.signing import keygen

    click.echo(keygen(private_key))


@cli.command(name="run")
@click.argument("artifact")
@click.option(
    "--prompt",
    "-p",
    default=None,
    help="Text (with a tokenizer in the folder) or token ids such as '464 2068'; every model but an image-to-text "
    "one needs it.",
)
@click.option(
    "--max-new-tokens",
    "-n",
    type=click.IntRange(1, 4096),
    default=32,
    show_default=True,
    help="Stop after this many tokens (or at end-of-text).",
)
@click.option(
    "--variant", default="model", show_default=True, help="Which built variant: model, optimized, or a quantize name."
)
@click.option(
    "--no-chat-template", is_flag=True, help="Encode the prompt as is even when the tokenizer has a chat template."
)
@click.option("--sample", is_flag=True, help="Sample instead of greedy decoding (seeded, so repeatable).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True)
@click.option("--top-k", type=click.IntRange(min=0), default=50, show_default=True)
@click.option(
    "--image",
    type=click.Path(dir_okay=False),
    default=None,
    help="For a vision-language or image-to-text model: a .npy of pixel values ([3, H, W] or [N, 3, H, W]) or a "
    "picture (Pillow).",
)
@click.option("--json", "as_json", is_flag=True, help="Print ids, text and timing as JSON.")
def run_command(
    artifact: str,
    prompt: str | None,
    max_new_tokens: int,
    variant: str,
    no_chat_template: bool,
    sample: bool,
    seed: int,
    temperature: float,
    top_k: int,
    image: str | None,
    as_json: bool,
) -> None:
    """Generate from a built decoder (a recipe with export.with_past: true), encoder-decoder
    or vision-language model (task image-text-to-text, with --image). An image-to-text model
    (an image encoder and a text decoder) takes --image and no prompt.

    ARTIFACT is the artifact folder (artifacts/<name>) or a model.onnx. With tokenizer
    files in the folder the prompt is text (the chat template applied when the tokenizer
    has one); without them, the prompt is token ids. For a vision-language model each image
    token in the prompt stands for one image (or the prompt holds every image's tokens); a
    prompt with none gets the image after its first token. A picture is resized to the
    vision tower's size and scaled to [-1, 1]; a .npy file is taken as the pixel values the
    model's processor would give.

    \b
    Examples:
      onnxbuild run artifacts/gpt2 --prompt "464 2068 7586" --max-new-tokens 16
      onnxbuild run artifacts/tiny-llava --image cat.npy --prompt "1 319 1967"
      onnxbuild run artifacts/tiny-vit-gpt2 --image cat.png
    """
    from onnxbuild.layouts.decoding import Sampling
    from onnxbuild.layouts.generation import run

    result = run(
        artifact,
        prompt,
        max_new_tokens=max_new_tokens,
        variant=variant,
        chat=not no_chat_template,
        sampling=Sampling(seed, temperature, top_k) if sample else None,
        image=image,
    )
    if as_json:
        payload = {
            "model": str(result.model),
            "prompt_ids": result.prompt_ids,
            "new_ids": result.new_ids,
            "text": result.text,
            "chat_template": result.chat_template,
            "seconds": round(result.seconds, 4),
            "tokens_per_s": round(result.tokens_per_s, 2),
            "prefill": str(result.prefill) if result.prefill else None,
        }
        click.echo(json.dumps(payload, indent=2))
        return
    click.echo(result.text if result.text is not None else " ".join(map(str, result.new_ids)))
    how = "sampled" if sample else "greedy"
    end = ", stopped at end-of-text" if result.stopped_at_eos else ""
    served = f" (the prompt through {result.prefill.name})" if result.prefill else ""
    click.echo(
        f"{len(result.new_ids)} tokens ({how}) in {result.seconds:.2f} s, {result.tokens_per_s:.1f} tokens/s, "
        f"{result.model}{served}{end}",
        err=True,
    )


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def providers(as_json: bool) -> None:
    """List ONNX Runtime's execution providers and whether each actually works here.

    Each listed provider runs a one-node model; one whose session falls back to CPU
    is reported as not working (onnxruntime-gpu lists CUDA even without a GPU).

    \b
    Example:
      onnxbuild providers
    """
    from onnxbuild.runtimes.providers import probe

    found = probe()
    if as_json:
        click.echo(json.dumps([p.__dict__ for p in found], indent=2))
        return
    import onnxruntime

    click.echo(f"onnxruntime {onnxruntime.__version__}")
    for p in found:
        click.echo(f"  {'works  ' if p.works else 'no     '} {p.name}: {p.reason}")


@cli.command()
@settings_options
@click.pass_context
def gc(ctx: click.Context) -> None:
    """Drop cache entries that no artifact folder refers to; report the bytes freed.

    \b
    Example:
      onnxbuild gc
    """
    removed, freed = api.gc(_settings(ctx))
    click.echo(f"removed {removed} cache file{'s' if removed != 1 else ''}, freed {_human(freed)}")


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"

"""Resource guards: a step over the recipe's memory or time limit is stopped and fails
with its figure; limits are in no cache key."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import onnxbuild
from onnxbuild.api import load_recipe
from onnxbuild.cli import cli
from onnxbuild.errors import RecipeError

TINY = """
name: lim
source:
  huggingface:
    model: openai-community/gpt2
    task: text-generation
    offline: random-init
    config: {model_type: gpt2, vocab_size: 1000, n_positions: 128, n_embd: 64, n_layer: 2, n_head: 4}
validate:
  shapes: [{batch: 1, sequence: 4}]
"""


def write(tmp_path: Path, limits: str) -> Path:
    path = tmp_path / "lim.yaml"
    path.write_text(TINY + limits, encoding="utf-8")
    return path


def test_a_step_over_its_memory_limit_fails_with_the_figure_and_the_build_exits_1(tmp_path: Path) -> None:
    recipe = write(tmp_path, "limits:\n  steps:\n    export: {memory_mb: 200}\n")
    result = CliRunner().invoke(
        cli,
        ["--cache-dir", str(tmp_path / "cache"), "--artifacts-dir", str(tmp_path / "artifacts"), "make", str(recipe)],
    )
    assert result.exit_code == 1, result.output
    assert "step export failed: stopped at" in result.output
    assert (
        "MB resident, over limits.memory_mb (200 MB) for this step; raise the limit in the recipe if the model needs it"
        in result.output
    )
    assert "Traceback" not in result.output


def test_a_step_over_its_time_limit_fails_and_earlier_steps_stay_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a tiny model's validate, forked from the build's warm process, can finish within 0.3 s:
    # its first attempt sleeps 5 s first (the test hook), the second build's does not
    monkeypatch.setenv("ONNXBUILD_TEST_STEP_DELAY", f"validate:5:{tmp_path / 'slept-once'}")
    settings = onnxbuild.Settings(cache_dir=tmp_path / "cache", artifacts_dir=tmp_path / "artifacts")
    recipe = write(tmp_path, "limits:\n  seconds: 600\n  steps:\n    validate: {seconds: 0.3}\n")
    report = onnxbuild.build([recipe], settings)
    steps = {s["name"]: s for s in report.recipes[0].steps}
    assert steps["export"]["status"] == "built" and steps["validate"]["status"] == "failed"
    assert "over limits.seconds (0.3 s) for this step" in steps["validate"]["reason"]
    assert steps["report"]["status"] == "skipped"
    # Limits change whether a step may finish, not what it writes: in no key, so raising one reruns nothing that
    # succeeded.
    write(tmp_path, "limits:\n  seconds: 600\n")
    again = onnxbuild.build([recipe], settings)
    statuses = {s["name"]: s["status"] for s in again.recipes[0].steps}
    assert statuses == {
        "source": "cached",
        "export": "cached",
        "check": "cached",
        "validate": "built",
        "report": "built",
    }


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ("limits:\n  steps:\n    exprot: {seconds: 1}\n", "limits.steps.exprot: no such step or step kind"),
        ("limits:\n  memory_mb: 10\n", "limits.memory_mb: must be an integer >= 64 or null (got 10)"),
        ("limits:\n  seconds: 0\n", "limits.seconds:"),
        ("limits:\n  steps:\n    export: {}\n", "limits.steps.export:"),
    ],
)
def test_bad_limits_are_named(tmp_path: Path, limits: str, message: str) -> None:
    with pytest.raises(RecipeError) as err:
        load_recipe(write(tmp_path, limits))
    assert message in str(err.value)


HOG = """
import os
import subprocess
import sys
import time

import torch


def gil(**kw):
    sum(range(3_000_000_000))  # one C call holding the GIL for a minute or more
    return torch.nn.Linear(4, 2)


def grow(**kw):
    x = list(range(60_000_000))  # one C call: ~2.3 GB, faster than any in-process sampler
    return torch.nn.Linear(4, 2)


def spawn(**kw):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(os.environ["HOG_PID_FILE"], "w") as f:
        f.write(str(child.pid))
    time.sleep(120)
    return torch.nn.Linear(4, 2)
"""


@pytest.mark.parametrize(
    ("factory", "limits", "said", "within_s"),
    [
        ("gil", "{seconds: 3}", "over limits.seconds (3 s)", 20.0),
        ("grow", "{memory_mb: 300}", "over limits.memory_mb (300 MB)", 60.0),
        ("spawn", "{seconds: 3}", "over limits.seconds (3 s)", 20.0),
    ],
)
def test_limits_hold_from_outside_the_step_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, factory: str, limits: str, said: str, within_s: float
) -> None:
    """The watch is in the runner, not a thread of the step: C code holding the GIL, or a
    single huge allocation, is still stopped, with every process the step started."""
    import os
    import time

    import psutil

    (tmp_path / "hog.py").write_text(HOG, encoding="utf-8")
    pid_file = tmp_path / "child.pid"
    monkeypatch.setenv("HOG_PID_FILE", str(pid_file))
    recipe = tmp_path / "hog.yaml"
    recipe.write_text(
        f'name: hog\nsource:\n  pytorch: {{factory: "hog.py:{factory}"}}\nexport:\n'
        f"  inputs: [{{name: x, shape: [batch, 4]}}]\nlimits:\n  steps:\n    export: {limits}\n",
        encoding="utf-8",
    )
    settings = onnxbuild.Settings(cache_dir=tmp_path / "cache", artifacts_dir=tmp_path / "artifacts")
    start = time.monotonic()
    report = onnxbuild.build([recipe], settings)
    took = time.monotonic() - start
    export = next(s for s in report.recipes[0].steps if s["name"] == "export")
    assert export["status"] == "failed" and said in export["reason"], export["reason"]
    assert took < within_s, f"stopped only after {took:.1f} s"
    if factory == "grow":
        peak = float(export["reason"].split("stopped at ")[1].split(" MB")[0].replace(",", ""))
        assert peak < 1500, export["reason"]
    if factory == "spawn":
        pid = int(pid_file.read_text(encoding="utf-8"))
        for _ in range(50):
            if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.1)
        else:
            os.kill(pid, 9)
            raise AssertionError("the process the step started outlived the stop")

"""validate.text and the accuracy budget's arithmetic, on numpy arrays and tiny recipes: the
figures (perplexity, KL, top-1) against hand computation, the per-layer search, and the bad
inputs with their exact messages. The real-weight builds that use them are in
test_smollm2.py and test_budget.py."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from onnxbuild.api import parse_recipe
from onnxbuild.errors import RecipeError, StepError
from onnxbuild.steps import budget, text_quality
from onnxbuild.steps.text_quality import Tally

# ---------------------------------------------------------------- figures


def test_tally_matches_perplexity_kl_and_top1_by_hand() -> None:
    # two positions, vocabulary of three; the variant moves probability off the first token
    ref = np.log(np.array([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3]]))
    got = np.log(np.array([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]]))
    targets = np.array([0, 1])
    tally = Tally()
    tally.add(ref, got, targets)
    assert tally.count == 2
    assert math.exp(tally.nll_reference / 2) == pytest.approx(1 / math.sqrt(0.7 * 0.6))
    assert math.exp(tally.nll / 2) == pytest.approx(1 / math.sqrt(0.5 * 0.3))
    kl = sum(p * math.log(p / q) for p, q in zip([0.7, 0.2, 0.1], [0.5, 0.3, 0.2])) + sum(
        p * math.log(p / q) for p, q in zip([0.1, 0.6, 0.3], [0.2, 0.3, 0.5])
    )
    assert tally.kl == pytest.approx(kl)
    assert tally.same == 1  # argmax agrees at the first position only


def test_budget_figures_are_zero_for_identical_logits_and_grow_with_noise() -> None:
    rng = np.random.default_rng(0)
    ref = [rng.standard_normal((16, 50)) * 3]
    targets = [rng.integers(0, 50, 16)]
    same = budget.figures(ref, [ref[0].copy()], targets)
    assert same["ppl_increase"] == pytest.approx(0.0, abs=1e-12) and same["kld_mean"] == pytest.approx(0.0, abs=1e-12)
    noisy = budget.figures(ref, [ref[0] + rng.standard_normal((16, 50))], targets)
    assert noisy["kld_mean"] > 0.01


class _Tokens:
    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}


def test_text_is_cut_into_whole_windows_from_the_start() -> None:
    windows = text_quality.token_windows(
        _Tokens(), "abcdefghij", {"file": None, "package": None, "inline": "x", "window": 4, "max_windows": 8}
    )
    assert windows.tolist() == [[97, 98, 99, 100], [101, 102, 103, 104]]
    capped = text_quality.token_windows(
        _Tokens(), "abcdefghij", {"file": None, "package": None, "inline": "x", "window": 2, "max_windows": 3}
    )
    assert capped.shape == (3, 2)


def test_a_text_shorter_than_one_window_says_how_long_it_is() -> None:
    with pytest.raises(StepError) as exc:
        text_quality.token_windows(
            _Tokens(), "abc", {"file": "short.txt", "package": None, "inline": None, "window": 256, "max_windows": 8}
        )
    assert (
        str(exc.value)
        == "validate.text: file short.txt is 3 tokens long, shorter than one window of 256; give more text or set "
        "validate.text.window to at most 3"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            {"file": "missing.txt"},
            "validate.text.file: {dir}/missing.txt does not exist (file paths are relative to the recipe's folder)",
        ),
        (
            {"package": "no_such_package_xyz/eval.txt"},
            "validate.text.package: no_such_package_xyz/eval.txt: the package 'no_such_package_xyz' is not "
            "installed; install it, or name a file beside the recipe under validate.text.file",
        ),
    ],
)
def test_a_text_that_cannot_be_read_names_its_key(text: dict[str, Any], message: str, tmp_path: Path) -> None:
    section = {"file": None, "package": None, "inline": None, "window": 8, "max_windows": 2, **text}
    with pytest.raises(StepError) as exc:
        text_quality.read_text(section, tmp_path)  # type: ignore[arg-type]
    assert str(exc.value) == message.format(dir=tmp_path)


# ---------------------------------------------------------------- the budget's search


def _order(n: int) -> list[budget.Candidate]:
    return [budget.Candidate(f"n{i}", f"w{i}", 1.0 / (i + 1), 100) for i in range(n)]


def test_search_finds_the_least_layers_that_meet_the_budget() -> None:
    calls: list[int] = []

    def evaluate(k: int) -> dict[str, float]:  # each kept layer takes 1% off a 10% loss
        calls.append(k)
        return {"ppl_increase": 0.10 - 0.01 * k, "kld_mean": 0.0}

    k, found, tried = budget.search(_order(20), evaluate, {"ppl_increase_max": 0.045}, "quantize.int4")
    assert k == 6 and found["ppl_increase"] == pytest.approx(0.04)
    assert calls == [0, 1, 2, 4, 8, 6, 5]  # doubling, then bisection
    assert [t["kept"] for t in tried] == calls


def test_a_budget_met_with_nothing_kept_keeps_nothing() -> None:
    k, _, tried = budget.search(
        _order(5), lambda k: {"ppl_increase": 0.01, "kld_mean": 0.0}, {"ppl_increase_max": 0.05}, "quantize.int4"
    )
    assert (k, len(tried)) == (0, 1)


def test_a_budget_no_plan_meets_names_the_best_plan_and_its_figure() -> None:
    with pytest.raises(StepError) as exc:
        budget.search(
            _order(3),
            lambda k: {"ppl_increase": 0.2 - 0.01 * k, "kld_mean": 0.5},
            {"ppl_increase_max": 0.05},
            "quantize.int4",
        )
    assert str(exc.value) == (
        "quantize.int4.budget: no plan meets ppl_increase_max 0.05 on the calibration text: the best found keeps "
        "3 of 3 MatMuls at the fallback precision and reaches ppl_increase 0.17, kld_mean 0.5; raise the budget, "
        "set budget.fallback: float, or use more bits"
    )


def test_rounding_to_the_grid_is_exact_on_grid_points_and_bounded_elsewhere() -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 8)).astype(np.float32)
    q = budget.quantized_copy(w, 4, 32, symmetric=False)
    np.testing.assert_allclose(
        budget.quantized_copy(q, 4, 32, symmetric=False), q, rtol=0, atol=1e-6
    )  # on the grid already
    step = (w.reshape(2, 32, 8).max(axis=1) - np.minimum(w.reshape(2, 32, 8).min(axis=1), 0)) / 15
    assert np.abs(w - q).reshape(2, 32, 8).max(axis=1).max() <= step.max() / 2 + 1e-6


# ---------------------------------------------------------------- recipe errors

DECODER = """name: t
source:
  huggingface:
    model: x
    task: {task}
    offline: random-init
    config: {{model_type: llama}}
{rest}"""


@pytest.mark.parametrize(
    ("task", "rest", "expected"),
    [
        pytest.param(
            "feature-extraction",
            "validate:\n  text: {inline: hello}\n",
            [
                "r.yaml:9:3: validate.text: measures perplexity of a text-generation model (task: "
                "text-generation); for an encoder use validate.sentences"
            ],
            id="text-on-an-encoder",
        ),
        pytest.param(
            "text-generation",
            "export: {with_past: true}\nvalidate:\n  text: {inline: hello, file: a.txt}\n",
            [
                "r.yaml:10:3: validate.text: give exactly one of file (beside the recipe), package (pkg/file.txt) "
                "and inline (the text itself); it has file and inline"
            ],
            id="text-from-two-places",
        ),
        pytest.param(
            "text-generation",
            "export: {with_past: true}\nvalidate:\n  text: {window: 64}\n",
            [
                "r.yaml:10:3: validate.text: give exactly one of file (beside the recipe), package (pkg/file.txt) "
                "and inline (the text itself); it has none"
            ],
            id="text-from-nowhere",
        ),
        pytest.param(
            "text-generation",
            "export: {with_past: true}\nquantize:\n  - {name: q, method: int4, validate: {kld_max: 0.1}}\n",
            [
                "r.yaml:10:40: quantize[0].validate.kld_max: kld_max gates quality on real text; add "
                "validate.text (the text to measure on)"
            ],
            id="text-gate-without-text",
        ),
        pytest.param(
            "text-generation",
            "export: {with_past: true}\nquantize:\n  - {name: q, method: int4, budget: {fallback: 8}}\n",
            [
                "r.yaml:10:29: quantize[0].budget: give ppl_increase_max and/or kld_max: the figures the plan "
                "keeps the file within (e.g. {ppl_increase_max: 0.05})"
            ],
            id="budget-without-a-figure",
        ),
        pytest.param(
            "feature-extraction",
            "quantize:\n  - {name: q, method: smooth_int8}\n",
            [
                "r.yaml:9:15: quantize[0].method: smooth_int8 calibrates on text windows through a decoder: it "
                "applies to text-generation models (for an encoder, use method: dynamic or static)"
            ],
            id="smooth-int8-on-an-encoder",
        ),
    ],
)
def test_bad_text_and_budget_recipes(task: str, rest: str, expected: list[str]) -> None:
    with pytest.raises(RecipeError) as exc:
        parse_recipe(DECODER.format(task=task, rest=rest), "r.yaml")
    assert [str(p) for p in exc.value.problems] == expected
    assert exc.value.exit_code == 2

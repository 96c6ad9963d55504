"""The coverage table (#41): one tiny random-init config per model type people ship
(tests/data/coverage/table.yaml), each built with onnxbuild's defaults: exported, checked, validated
against PyTorch at several shapes and, for decoders and encoder-decoders, its greedy generation
compared with transformers' ``generate()``. A transformers upgrade that breaks a family fails
here in that family's row.

Built together once (about 4 minutes on 2 cores): ``make test-slow``. The table it prints is
the README's coverage line."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

import onnxbuild

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
TABLE_FILE = HERE / "data" / "coverage" / "table.yaml"
TABLE: dict[str, dict[str, Any]] = yaml.safe_load(TABLE_FILE.read_text(encoding="utf-8"))["models"]
GENERATED = (
    "text-generation",
    "text2text-generation",
    "automatic-speech-recognition",
    "image-text-to-text",
    "image-to-text",
)
CTC = ("wav2vec2", "hubert")


def recipe(name: str, row: dict[str, Any]) -> dict[str, Any]:
    """The recipe a new user would write: the source, a KV cache for a decoder, a generation
    for what generates; everything else onnxbuild's defaults."""
    config = {k: v for k, v in row["config"].items() if v is not None}  # null: drop an anchor's key
    out: dict[str, Any] = {
        "name": name,
        "source": {
            "huggingface": {
                "model": f"tiny/{name}",
                "task": row["task"],
                "offline": "random-init",
                "seed": 0,
                "config": config,
            }
        },
    }
    if row["task"] == "text-generation":
        out["export"] = {"with_past": True}
        out["generate"] = {"max_new_tokens": 8, "prompt_ids": [11, 22, 33, 44, 55, 66, 77, 88]}
    elif row["task"] in GENERATED and config["model_type"] not in CTC:
        out["generate"] = {"max_new_tokens": 8}
    out.update(row.get("recipe", {}))
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every row built in one build (shared: read, don't change); the table printed."""
    root = tmp_path_factory.mktemp("coverage")
    paths = []
    for name, row in TABLE.items():
        path = root / "recipes" / f"{name}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(recipe(name, row), sort_keys=False), encoding="utf-8")
        paths.append(path)
    settings = onnxbuild.Settings(cache_dir=root / "cache", artifacts_dir=root / "artifacts")
    onnxbuild.build(paths, settings, jobs=2, keep_going=True)
    print("\n" + table(root / "artifacts"))
    return root / "artifacts"


def read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def table(artifacts: Path) -> str:
    lines = [f"{'model type':<14} {'task':<31} {'validated':<22} generated"]
    for name, row in TABLE.items():
        validation = read(artifacts / name / "reports" / "validation.json")
        generation = read(artifacts / name / "reports" / "generation.json")
        shapes = len(validation["variants"]["model"]["shapes"]) if validation else 0
        ok = "yes" if validation and validation["passed"] else "FAILED"
        gen = "-" if generation is None else "identical" if generation["passed"] else "DIFFERS"
        lines.append(f"{name:<14} {row['task']:<31} {ok + f' ({shapes} shapes)':<22} {gen}")
    return "\n".join(lines)


@pytest.mark.parametrize("model_type", list(TABLE))
def test_each_model_type_builds_validates_and_generates_like_pytorch(built: Path, model_type: str) -> None:
    folder = built / model_type
    validation = read(folder / "reports" / "validation.json")
    assert validation is not None, f"{model_type}: not built (see the build's output above)"
    model = validation["variants"]["model"]
    assert validation["passed"] and len(model["shapes"]) >= 3, model_type
    assert all(case["passed"] for case in model["shapes"]), model_type
    row = TABLE[model_type]
    if recipe(model_type, row).get("generate"):
        generation = read(folder / "reports" / "generation.json")
        assert generation is not None and generation["variants"]["model"]["greedy"]["identical"], model_type


def test_decoders_with_a_window_are_validated_and_generate_past_it(built: Path) -> None:
    for name in ("mistral", "gemma2", "gemma3_text", "qwen2", "gpt_oss", "exaone4"):
        window = TABLE[name]["config"]["sliding_window"]
        shapes = [c["shape"] for c in read(built / name / "reports" / "validation.json")["variants"]["model"]["shapes"]]
        assert any(s.get("past_sequence", 0) + s["sequence"] > window for s in shapes), name
        generation = read(built / name / "reports" / "generation.json")
        assert len(generation["prompt_ids"]) + generation["max_new_tokens"] > window, name


def test_the_table_spans_50_types_and_16_tasks_and_the_readme_counts_it() -> None:
    tasks = {row["task"] for row in TABLE.values()}
    assert len(TABLE) >= 50 and len(tasks) >= 16, (len(TABLE), sorted(tasks))
    # a row is a model (a type under a task: BERT as a classifier and as a sentence embedder, a
    # vision-encoder-decoder with a GPT-2 and with a TrOCR decoder); the types are distinct
    types = {row["config"]["model_type"] for row in TABLE.values()}
    readme = (HERE.parent / "README.md").read_text(encoding="utf-8")
    said = re.search(r"(\d+) models \((\d+) model types\) across (\d+) tasks", readme)
    assert said is not None and (int(said[1]), int(said[2]), int(said[3])) == (len(TABLE), len(types), len(tasks)), said

"""The generated documentation is what docs/gen.py writes: the README's SmolLM2 table comes
from bench/results/smollm2.json (make bench's output), so a hand edit or a stale copy fails."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_gen", ROOT / "docs" / "gen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_table_is_the_one_docs_gen_writes_from_the_bench_results() -> None:
    gen = _gen()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    data = json.loads((ROOT / "bench" / "results" / "smollm2.json").read_text(encoding="utf-8"))
    assert gen.README_START in readme and gen.README_END in readme
    assert readme == gen.with_readme_table(readme, data), "run `python docs/gen.py` (make docs) and commit README.md"
    block = readme.split(gen.README_START, 1)[1].split(gen.README_END, 1)[0]
    rows = [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| file")]
    assert len(rows) == len(dict.fromkeys([*data["timing_ms"], *data["quality"]]))
    assert any(row.startswith("| PyTorch bf16") for row in rows) and any("model builder" in row for row in rows)


def test_a_readme_without_the_markers_is_left_as_it_is() -> None:
    gen = _gen()
    assert gen.with_readme_table("# title\n", {"quality": {}, "timing_ms": {}}) == "# title\n"

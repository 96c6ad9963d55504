"""The code in the keys (onnxbuild/engine/codekeys.py): which steps an edit reruns, on a copy of the
package and the real recipes' plans; what counts as an edit; the memo; the rerun reason."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import onnxbuild
from onnxbuild.engine.codekeys import HOME, Code, code_digest, imports_of
from onnxbuild.engine.graph import explain
from onnxbuild.pipeline import steps_for
from onnxbuild.spec import StepSpec

ROOT = Path(__file__).resolve().parent.parent

CODE = '''"""A module."""
import os


def f(x: int) -> int:
    """Doubles."""
    return 2 * x  # twice
'''

# (what the edit is, the module after it, whether its key changes)
EDITS = [
    ("a comment", CODE.replace("# twice", "# two times"), False),
    ("a docstring", CODE.replace("Doubles.", "Twice x."), False),
    ("a docstring added", CODE.replace("    return", '    """more"""\n    return', 1), False),
    ("layout", CODE.replace("2 * x", "2*x").replace("\n\n\ndef", "\n\ndef"), False),
    ("a constant", CODE.replace("2 * x", "3 * x"), True),
    ("a name", CODE.replace("def f", "def g"), True),
    ("an import", CODE.replace("import os", "import sys"), True),
    ("a string that is not a docstring", CODE.replace("return 2 * x", "return len('ab') * x"), True),
]


@pytest.mark.parametrize(("what", "edited", "changes"), EDITS, ids=[e[0] for e in EDITS])
def test_only_an_edit_of_the_code_changes_its_digest(what: str, edited: str, changes: bool) -> None:
    assert (code_digest(edited) != code_digest(CODE)) is changes, what


def test_imports_are_found_in_functions_but_not_for_type_checking_only() -> None:
    known = ["onnxbuild", "onnxbuild.fusion", "onnxbuild.fusion.decoder", "onnxbuild.errors", "onnxbuild.spec"]
    source = (
        "from typing import TYPE_CHECKING\n"
        "from onnxbuild.errors import StepError\n"
        "if TYPE_CHECKING:\n"
        "    from onnxbuild.spec import StepSpec\n"
        "def run():\n"
        "    from onnxbuild.fusion import decoder\n"
        "    import numpy\n"
    )
    assert imports_of(source, known) == ("onnxbuild.errors", "onnxbuild.fusion.decoder")


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the installed package's modules, to edit."""
    home = tmp_path_factory.mktemp("code") / "onnxbuild"
    for path in HOME.rglob("*.py"):
        rel = path.relative_to(HOME)
        if "node_modules" in rel.parts or "__pycache__" in rel.parts:
            continue
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, home / rel)
    return home


def _plan(recipe: str) -> list[StepSpec]:
    return steps_for(onnxbuild.load_recipe(str(ROOT / "recipes" / recipe)))


def _keys(home: Path, specs: list[StepSpec]) -> dict[str, dict[str, str]]:
    code = Code(home)
    return {s.name: code.reach((s.entry, *s.code_also), s.code_stops) for s in specs}


def _rerun(home: Path, specs: list[StepSpec], module: str, text: str) -> set[str]:
    """The steps whose code changes when ``module`` (a path under the package) gains ``text``."""
    before = _keys(home, specs)
    path = home / module
    original = path.read_text(encoding="utf-8")
    try:
        path.write_text(original + text, encoding="utf-8")
        after = _keys(home, specs)
    finally:
        path.write_text(original, encoding="utf-8")
    return {name for name in before if before[name] != after[name]}


def _dependents(specs: list[StepSpec], of: str) -> set[str]:
    found = {of}
    for s in specs:  # in dependency order
        if found.intersection(s.deps):
            found.add(s.name)
    return found


def test_an_edit_to_the_fused_decoder_reruns_optimize_and_its_dependents_only(package: Path) -> None:
    specs = _plan("gpt2.yaml")  # TorchScript export, then a fused optimize
    rerun = _rerun(package, specs, "fusion/decoder.py", "\n\ndef _probe() -> int:\n    return 1\n")
    assert "optimize" in rerun
    assert "export" not in rerun and "source" not in rerun and "validate" not in rerun
    assert rerun <= _dependents(specs, "optimize"), rerun - _dependents(specs, "optimize")


def test_a_fused_export_has_the_fused_decoder_in_its_key(package: Path) -> None:
    """export's fused writer is a branch: in the key of exporter: fused recipes only."""
    specs = _plan("llama-3.2-1b.yaml")
    assert "export" in _rerun(package, specs, "fusion/decoder.py", "\n\ndef _probe() -> int:\n    return 1\n")


def test_a_comment_or_docstring_edit_reruns_nothing(package: Path) -> None:
    specs = _plan("gpt2.yaml")
    path = package / "fusion" / "decoder.py"
    original = path.read_text(encoding="utf-8")
    before = _keys(package, specs)
    try:
        path.write_text('"""Reworded."""\n# a new comment\n' + original.split('"""', 2)[2], encoding="utf-8")
        assert _keys(package, specs) == before
    finally:
        path.write_text(original, encoding="utf-8")


def test_an_edit_to_the_report_step_reruns_only_report(package: Path) -> None:
    specs = _plan("gpt2.yaml")
    assert _rerun(package, specs, "steps/report.py", "\n\nMERGED = 1\n") == {"report"}


def test_an_edit_to_a_source_kind_reruns_the_steps_that_load_it(package: Path) -> None:
    """A source kind is reached by name (sources.source_kind), not by import: still in the key."""
    specs = _plan("linear-regression.yaml")
    assert _rerun(package, specs, "sources/graph.py", "\n\nPROBE = 1\n") == {"source"}


def test_openvino_is_in_the_key_only_of_steps_that_run_it() -> None:
    specs = {s.name: s for s in _plan("gpt2.yaml")}
    assert "openvino" in specs["validate.int8-static"].packages  # served by OpenVINO in gpt2.yaml
    assert "openvino" not in specs["validate.int8"].packages
    assert "openvino" not in specs["export"].packages


def test_the_memo_is_read_back_by_size_and_time(package: Path, tmp_path: Path) -> None:
    memo = tmp_path / "code.json"
    first = Code(package, memo)
    keys = first.reach(["onnxbuild.steps.report"])
    first.save()
    assert memo.is_file()
    # the same size and time with other code: the memo's digest is taken, the file not parsed
    path = package / "steps" / "report.py"
    original, st = path.read_text(encoding="utf-8"), path.stat()
    try:
        path.write_text(original.replace("MEMORY = (0, 200)", "MEMORY = (0, 300)"), encoding="utf-8")
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert Code(package, memo).reach(["onnxbuild.steps.report"]) == keys
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
        assert Code(package, memo).reach(["onnxbuild.steps.report"]) != keys
    finally:
        path.write_text(original, encoding="utf-8")


def test_the_rerun_reason_names_the_modules_that_changed() -> None:
    before = {"kind": "optimize", "code": {"onnxbuild.fusion.decoder": "a" * 16, "onnxbuild.spec": "b" * 16}}
    now = {**before, "code": {"onnxbuild.fusion.decoder": "c" * 16, "onnxbuild.spec": "b" * 16}}
    for key in ("params", "outputs", "inputs", "files", "identity", "packages"):
        before[key] = now[key] = {} if key != "outputs" else []
    reasons = explain({"key": "x", "ingredients": before}, now, "y")  # type: ignore[arg-type]
    assert reasons == ["the optimize step's code changed (onnxbuild.fusion.decoder)"]
    old_style = {k: v for k, v in before.items() if k != "code"} | {"version": 15}
    assert explain({"key": "x", "ingredients": old_style}, now, "y") == [  # type: ignore[arg-type]
        "the optimize step's code changed (onnxbuild's code is now in the key)"
    ]

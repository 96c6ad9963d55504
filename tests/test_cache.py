"""The step cache: pinned keys, the store's layout, and damaged entries as warned misses."""

from __future__ import annotations

import hashlib
import os
import re
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers_engine import (
    Recorder,
    entry_files,
    leftovers,
    outcomes,
    read_json,
    scratch_dirs,
    sha256,
    whole_entries,
)

import onnxbuild
from onnxbuild._util import canonical_json
from onnxbuild.engine.cache import Cache, EntryRecord, step_key
from onnxbuild.engine.graph import ingredients
from onnxbuild.environment import package_version
from onnxbuild.pipeline import steps_for

LR = "recipes/linear-regression.yaml"

# ---------------------------------------------------------------- pinned keys
#
# What enters the key of linear-regression's `source` step, written out in full. If this
# test fails, every cached `source` output is invalidated: that must be on purpose (change
# the recipe defaults knowingly), then update the literals. The code digests here are
# stand-ins: the real ones change with every edit of the code they cover (test_codekeys.py);
# SOURCE_CODE pins which modules the source step of a graph recipe can reach.

SOURCE_CODE = [
    "onnxbuild",
    "onnxbuild._util",
    "onnxbuild.errors",
    "onnxbuild.recipe.model",
    "onnxbuild.recipe.sections",
    "onnxbuild.recipe.variants",
    "onnxbuild.sources",
    "onnxbuild.sources.graph",
    "onnxbuild.sources.kind",
    "onnxbuild.spec",
    "onnxbuild.steps",
    "onnxbuild.steps.base",
    "onnxbuild.steps.source",
]

SOURCE_INGREDIENTS: dict[str, Any] = {
    "kind": "source",
    "code": {"onnxbuild.steps.source": "0" * 16},
    "params": {
        "source": {
            "graph": {
                "opset": 18,
                "ir_version": 10,
                "name": "graph",
                "doc_string": "",
                "extra_opsets": {},
                "inputs": [{"name": "X", "dtype": "float32", "shape": ["batch", 4]}],
                "outputs": [{"name": "Y", "dtype": "float32", "shape": ["batch", 2]}],
                "initializers": [
                    {
                        "name": "A",
                        "dtype": "float32",
                        "shape": [4, 2],
                        "random": {"seed": 0, "distribution": "normal", "scale": 1.0},
                    },
                    {"name": "B", "dtype": "float32", "shape": [2], "values": [0.5, -0.5]},
                ],
                "nodes": [
                    {"op_type": "MatMul", "inputs": ["X", "A"], "outputs": ["XA"], "domain": "", "attributes": {}},
                    {"op_type": "Add", "inputs": ["XA", "B"], "outputs": ["Y"], "domain": "", "attributes": {}},
                ],
            }
        }
    },
    "outputs": ["model.onnx"],
    "inputs": {},
    "files": {},
    "identity": {},
    "packages": {"onnx": "1.23.2"},
}

# Exactly the text that is hashed: sorted keys, no whitespace.
SOURCE_CANONICAL = (
    '{"code":{"onnxbuild.steps.source":"'
    + "0" * 16
    + '"},"files":{},"identity":{},"inputs":{},"kind":"source","outputs":["model.onnx"],"packages":{"onnx":"1.23.2"},'
    '"params":{"source":{"graph":{"doc_string":"","extra_opsets":{},"initializers":['
    '{"dtype":"float32","name":"A","random":{"distribution":"normal","scale":1.0,"seed":0},"shape":[4,2]},'
    '{"dtype":"float32","name":"B","shape":[2],"values":[0.5,-0.5]}],'
    '"inputs":[{"dtype":"float32","name":"X","shape":["batch",4]}],"ir_version":10,"name":"graph",'
    '"nodes":[{"attributes":{},"domain":"","inputs":["X","A"],"op_type":"MatMul","outputs":["XA"]},'
    '{"attributes":{},"domain":"","inputs":["XA","B"],"op_type":"Add","outputs":["Y"]}],'
    '"opset":18,"outputs":[{"dtype":"float32","name":"Y","shape":["batch",2]}]}}}}'
)
SOURCE_KEY = "3eb09c343e3a69ce7af9f189654b14529924b6a2f6d4e6d32885c475b1a9e7ae"

CHECK_INGREDIENTS: dict[str, Any] = {
    "kind": "check",
    "code": {"onnxbuild.steps.check": "1" * 16},
    "params": {},
    "outputs": ["reports/check.json", "reports/check.md"],
    "inputs": {"source:model.onnx": "0" * 64},
    "files": {},
    "identity": {},
    "packages": {"onnx": "1.23.2"},
}
CHECK_CANONICAL = (
    '{"code":{"onnxbuild.steps.check":"'
    + "1" * 16
    + '"},"files":{},"identity":{},"inputs":{"source:model.onnx":"'
    + "0" * 64
    + '"},'
    '"kind":"check","outputs":["reports/check.json","reports/check.md"],"packages":{"onnx":"1.23.2"},"params":{}}'
)
CHECK_KEY = "2f209e16a26e6788d32c928ac489f25c7267d55ba9841d166cecb2e9fa5696b9"


def test_key_is_sha256_of_canonical_json_pinned() -> None:
    assert canonical_json(SOURCE_INGREDIENTS) == SOURCE_CANONICAL
    assert hashlib.sha256(SOURCE_CANONICAL.encode("utf-8")).hexdigest() == SOURCE_KEY
    assert step_key(SOURCE_INGREDIENTS) == SOURCE_KEY
    assert canonical_json(CHECK_INGREDIENTS) == CHECK_CANONICAL
    assert step_key(CHECK_INGREDIENTS) == CHECK_KEY


def test_key_ignores_dict_order_but_not_values() -> None:
    reordered = dict(reversed(list(SOURCE_INGREDIENTS.items())))
    assert step_key(reordered) == SOURCE_KEY
    assert step_key({**SOURCE_INGREDIENTS, "packages": {"onnx": "1.23.3"}}) != SOURCE_KEY
    assert step_key({**SOURCE_INGREDIENTS, "code": {"onnxbuild.steps.source": "2" * 16}}) != SOURCE_KEY


def test_linear_regression_ingredients_are_exactly_these(project: Path, settings: onnxbuild.Settings) -> None:
    """The recipe's real ingredients are the pinned ones, with this machine's onnx version."""
    onnx_version = package_version("onnx")
    recipe = onnxbuild.load_recipe(LR)
    source, _ = steps_for(recipe)
    cache = Cache(settings.cache_dir)
    found = ingredients(source, {}, cache)
    assert list(found["code"]) == SOURCE_CODE
    assert all(len(d) == 16 for d in found["code"].values())
    expected_source = {**SOURCE_INGREDIENTS, "code": found["code"], "packages": {"onnx": onnx_version}}
    assert found == expected_source

    plan = onnxbuild.plan([LR], settings)
    assert plan.steps[0].ingredients == expected_source
    assert plan.steps[0].key == step_key(expected_source)
    assert plan.steps[1].key is None  # known only once source's output exists

    report = onnxbuild.build([LR], settings, in_process=True)
    model_sha = sha256(settings.artifacts_dir / "linear-regression" / "model.onnx")
    last = read_json(settings.cache_dir / "last" / "linear-regression.json")
    assert {k: last["source"][k] for k in ("key", "ingredients")} == {
        "key": step_key(expected_source),
        "ingredients": expected_source,
    }
    expected_check = {
        **CHECK_INGREDIENTS,
        "code": last["check"]["ingredients"]["code"],
        "inputs": {"source:model.onnx": model_sha},
        "packages": {"onnx": onnx_version},
    }
    assert {k: last["check"][k] for k in ("key", "ingredients")} == {
        "key": step_key(expected_check),
        "ingredients": expected_check,
    }
    assert last["check"]["seconds"] >= 0  # what it cost, for plan's estimate
    assert [s["key"] for s in report.recipes[0].steps] == [step_key(expected_source), step_key(expected_check)]


# ---------------------------------------------------------------- the store


def test_commit_moves_outputs_into_read_only_objects(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    cache.ensure_writable()
    work = tmp_path / "work"
    (work / "reports").mkdir(parents=True)
    (work / "a.txt").write_text("same\n")
    (work / "reports" / "b.txt").write_text("same\n")
    entry = cache.commit("ab" * 32, "s", "fake", {"x": 1}, work, ["reports/b.txt", "a.txt"], {"n": 1})

    sha = hashlib.sha256(b"same\n").hexdigest()
    assert entry["outputs"] == [
        {"path": "a.txt", "sha256": sha, "bytes": 5},
        {"path": "reports/b.txt", "sha256": sha, "bytes": 5},
    ]
    obj = cache.object_path(sha)
    assert obj == tmp_path / "cache" / "objects" / sha[:2] / sha
    assert stat.S_IMODE(obj.stat().st_mode) == 0o444
    assert sorted(p.name for p in (tmp_path / "cache" / "objects").rglob("*") if p.is_file()) == [sha]  # stored once
    assert not (work / "a.txt").exists()
    assert cache.entry_path("ab" * 32) == tmp_path / "cache" / "entries" / "ab" / f"{'ab' * 32}.json"
    assert cache.get("ab" * 32) == entry
    assert leftovers(tmp_path / "cache") == []


def test_unknown_key_is_a_silent_miss(tmp_path: Path) -> None:
    messages: list[str] = []
    assert Cache(tmp_path / "cache", warn=messages.append).get("cd" * 32) is None
    assert messages == []


def test_entry_under_the_wrong_key_is_damaged(tmp_path: Path) -> None:
    messages: list[str] = []
    cache = Cache(tmp_path / "cache", warn=messages.append)
    path = cache.entry_path("ef" * 32)
    path.parent.mkdir(parents=True)
    path.write_text('{"key": "something else", "outputs": []}')
    assert cache.get("ef" * 32) is None
    assert messages == [f"cache entry {'ef' * 6} is damaged (key mismatch); rebuilding"]
    assert not path.exists()


def test_clean_scratch_removes_only_dead_builds_folders(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    cache.ensure_writable()  # as every build does first: a cache onnxbuild made (tagged)
    mine = cache.scratch()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    theirs = tmp_path / "cache" / "tmp" / f"{dead.stdout.strip()}-abcd"
    (theirs / "out").mkdir(parents=True)
    (theirs / "out" / "model.onnx").write_bytes(b"partial")
    cache.clean_scratch()
    assert scratch_dirs(tmp_path / "cache") == [mine]


# ---------------------------------------------------------------- damaged entries


def _truncate_entry(cache: Cache, entry: EntryRecord) -> str:
    path = cache.entry_path(entry["key"])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return rf"cache entry {entry['key'][:12]} is damaged \(.+\); rebuilding"


def _delete_object(cache: Cache, entry: EntryRecord) -> str:
    cache.object_path(entry["outputs"][0]["sha256"]).unlink()
    return rf"cache entry {entry['key'][:12]} refers to a missing object; rebuilding"


def _grow_object(cache: Cache, entry: EntryRecord) -> str:
    out = entry["outputs"][0]
    obj = cache.object_path(out["sha256"])
    os.chmod(obj, 0o644)
    with open(obj, "ab") as f:
        f.write(b"\0")
    size = out["bytes"]
    return re.escape(
        f"cache entry {entry['key'][:12]} is damaged ({out['path']} has {size + 1} bytes, expected {size}); rebuilding"
    )


def _edit_artifact_in_place(cache: Cache, entry: EntryRecord) -> str:
    """Flip one byte of the artifact, keeping its size: it is a hard link to the cached object."""
    out = entry["outputs"][0]
    obj = cache.object_path(out["sha256"])
    os.chmod(obj, 0o644)
    data = bytearray(obj.read_bytes())
    data[-1] ^= 0xFF
    with open(obj, "r+b") as f:
        f.write(data)
    os.utime(obj, ns=(obj.stat().st_atime_ns, obj.stat().st_mtime_ns + 1_000_000))
    return re.escape(
        f"cache entry {entry['key'][:12]}: {out['path']} no longer matches its digest (modified in place?); "
        "discarded, rebuilding"
    )


@pytest.mark.parametrize(
    "damage",
    [_truncate_entry, _delete_object, _grow_object, _edit_artifact_in_place],
    ids=["truncated-entry", "deleted-object", "resized-object", "tampered-same-size"],
)
def test_damaged_entry_is_a_warned_miss_and_the_build_succeeds(
    settings: onnxbuild.Settings, damage: Callable[[Cache, EntryRecord], str]
) -> None:
    onnxbuild.build([LR], settings, in_process=True)
    model = settings.artifacts_dir / "linear-regression" / "model.onnx"
    good = sha256(model)
    cache = Cache(settings.cache_dir)
    source_key = read_json(settings.cache_dir / "last" / "linear-regression.json")["source"]["key"]
    entry = cache.get(source_key)
    assert entry is not None
    expected = damage(cache, entry)

    recorder = Recorder()
    report = onnxbuild.build([LR], settings, in_process=True, reporter=recorder)

    assert report.ok
    assert len(recorder.warnings) == 1, recorder.warnings
    assert re.fullmatch(expected, recorder.warnings[0]), recorder.warnings[0]
    assert outcomes(report) == {
        "linear-regression:source": ("built", "no entry in cache (removed by gc, or damaged)"),
        "linear-regression:check": ("cached", "inputs were rebuilt identical"),
    }
    assert sha256(model) == good
    assert len(whole_entries(settings.cache_dir)) == 2  # the entry is whole again
    assert leftovers(settings.cache_dir, settings.artifacts_dir) == []


def test_plan_reports_a_damaged_entry(settings: onnxbuild.Settings) -> None:
    onnxbuild.build([LR], settings, in_process=True)
    for path in entry_files(settings.cache_dir):
        path.write_text("{")
    recorder = Recorder()
    plan = onnxbuild.plan([LR], settings, reporter=recorder)
    assert [s.reasons for s in plan.steps] == [
        ("no entry in cache (removed by gc, or damaged)",),
        ("only if its input from source changes",),
    ]
    assert len(recorder.warnings) == 1  # check's entry is not looked up: its key depends on source's output
    assert "is damaged" in recorder.warnings[0]


def test_cache_verify_rehashes_everything_and_drops_what_was_altered(settings: onnxbuild.Settings) -> None:
    from click.testing import CliRunner

    from onnxbuild.cli import cli

    onnxbuild.build([LR], settings, in_process=True)
    cache = Cache(settings.cache_dir)
    check_key = read_json(settings.cache_dir / "last" / "linear-regression.json")["check"]["key"]
    entry = cache.get(check_key)
    assert entry is not None
    report = next(o for o in entry["outputs"] if o["path"] == "reports/check.md")
    obj = cache.object_path(report["sha256"])
    os.chmod(obj, 0o644)
    obj.write_bytes(obj.read_bytes().replace(b"passed", b"PASSED"))  # same size, new bytes

    result = CliRunner().invoke(cli, ["--cache-dir", str(settings.cache_dir), "cache", "verify"])
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        f"dropped entry {check_key[:12]} (check): reports/check.md missing or not matching its digest\n"
        "checked 2 cache entries; dropped 1\n"
    )
    assert len(whole_entries(settings.cache_dir)) == 1
    again = onnxbuild.build([LR], settings, in_process=True)
    assert outcomes(again)["linear-regression:check"][0] == "built"
    clean = CliRunner().invoke(cli, ["--cache-dir", str(settings.cache_dir), "cache", "verify"])
    assert clean.stdout == "checked 2 cache entries; dropped 0\n"

"""Package versions for cache keys: the memo in the cache's state/versions.json."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from onnxbuild import environment
from onnxbuild.environment import Versions


def test_the_memo_survives_another_way_of_starting_and_a_new_distribution_invalidates_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`onnxbuild`, `python -m onnxbuild` and `python -c` put different folders first on
    sys.path; keyed by the folders' mtimes, each threw the others' memo away and paid
    importlib.metadata (25-40 ms) on every no-op. A folder without distributions does not
    count now; one that gains a distribution does."""
    memo = tmp_path / "versions.json"
    first = Versions(memo)
    numpy = first.get("numpy")
    assert numpy != "not installed"
    first.save()

    elsewhere = tmp_path / "bin"
    elsewhere.mkdir()
    monkeypatch.setattr(sys, "path", [str(elsewhere), *sys.path[1:]])
    looked_up: list[str] = []
    monkeypatch.setattr(environment, "_lookup", lambda name: looked_up.append(name) or "looked up")
    assert Versions(memo).get("numpy") == numpy and looked_up == []

    (elsewhere / "numpy-0.0.1.dist-info").mkdir()  # a distribution installed into that folder
    assert Versions(memo).get("numpy") == "looked up" and looked_up == ["numpy"]

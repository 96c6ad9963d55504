"""report.html: a self-contained page per artifact folder, rendered in headless Chromium.

Unit tests render folders written by hand (missing and damaged files, a failed step,
hostile text); one test builds tests/data/tiny-variants.yaml and looks at the page as a
person would, through Chromium's DOM and a screenshot (skipped, with the reason, where
Chromium is not installed; `make install` installs it).
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import onnxbuild
from onnxbuild.cli import cli
from onnxbuild.report.page import render_report, write_report

DATA = Path(__file__).resolve().parent / "data"


def write(folder: Path, rel: str, data: Any) -> None:
    path = folder / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")


def manifest(name: str = "demo") -> dict[str, Any]:
    return {
        "name": name,
        "recipe": {"path": "recipes/demo.yaml", "digest": "ab" * 32, "resolved": {}},
        "steps": [
            {
                "name": "source",
                "kind": "source",
                "key": "1" * 64,
                "outputs": [{"path": "reports/source.json", "sha256": "2" * 64, "bytes": 120}],
                "data": {"weights": "random-init", "why": "Hub unreachable"},
            },
            {
                "name": "export",
                "kind": "export",
                "key": "3" * 64,
                "outputs": [{"path": "model.onnx", "sha256": "4" * 64, "bytes": 2_500_000}],
                "data": {},
            },
        ],
        "versions": {"onnx": "1.23.2"},
        "platform": {"python": "3.11"},
    }


def case(outputs: dict[str, float], passed: bool = True) -> dict[str, Any]:
    return {
        "shape": {"batch": 1, "sequence": 8},
        "error": None,
        "passed": passed,
        "top1_agreement": None,
        "outputs": {
            n: {"max_abs_diff": d, "max_rel_diff": d, "passed": passed or n != "present.10.key"}
            for n, d in outputs.items()
        },
    }


def test_the_verdict_comes_first_and_random_init_is_shown(tmp_path: Path) -> None:
    write(tmp_path, "manifest.json", manifest())
    write(
        tmp_path,
        "timings.json",
        {
            "steps": {
                "source": {"status": "built", "reason": "never built", "seconds": 0.1},
                "export": {"status": "cached", "reason": "up to date", "seconds": 0},
            }
        },
    )
    write(tmp_path, "reports/source.json", {"weights": "random-init", "why": "Hub unreachable"})
    page = render_report(tmp_path)
    assert (
        page.index('id="verdict"') < page.index('id="steps"') < page.index('id="versions"') < page.index('id="digests"')
    )
    assert "Build OK" in page and "random-init weights" in page and "Hub unreachable" in page
    assert "2.4 MB" in page and "4" * 64 in page


def test_a_failed_step_leads_the_page(tmp_path: Path) -> None:
    write(tmp_path, "manifest.json", manifest())
    write(
        tmp_path,
        "timings.json",
        {
            "steps": {
                "source": {"status": "built", "reason": ""},
                "export": {"status": "failed", "reason": "torch.onnx.export raised <boom>"},
                "check": {"status": "skipped", "reason": "depends on export"},
            }
        },
    )
    page = render_report(tmp_path)
    verdict = page[page.index('id="verdict"') : page.index("</section>")]
    assert (
        "Build FAILED" in verdict
        and "<b>export</b> failed: torch.onnx.export raised &lt;boom&gt;" in verdict
        and "skipped: check" in verdict
    )


def test_validation_rows_per_variant_and_shape_with_the_worst_output_in_natural_order(tmp_path: Path) -> None:
    outputs = {f"present.{i}.key": 1e-7 * (i + 1) for i in range(12)}
    variant = {"provider": "CPUExecutionProvider", "atol": 1e-4, "rtol": 1e-3}
    write(
        tmp_path,
        "reports/validation.json",
        {
            "passed": False,
            "variants": {
                "int8": {**variant, "shapes": [case(outputs, passed=False)]},
                "model": {**variant, "shapes": [case(outputs)]},
            },
        },
    )
    page = render_report(tmp_path)
    rows = [line for line in page.split("<tr") if 'data-variant="' in line and "present." in line]
    assert [r.split('data-variant="')[1].split('"')[0] for r in rows[:2]] == ["model", "int8"]
    assert "present.11.key" in rows[0] and "pass" in rows[0]
    assert "present.10.key" in rows[1] and "FAIL" in rows[1]
    details = page[page.index("<details>") :]
    assert details.index("present.2.key") < details.index("present.10.key")


@pytest.mark.parametrize("broken", ["{", "[]", '{"variants": 3}', "\x00\x01"])
def test_damaged_or_missing_files_never_break_the_page(tmp_path: Path, broken: str) -> None:
    for rel in (
        "manifest.json",
        "timings.json",
        "reports/validation.json",
        "benchmark.json",
        "reports/generation.json",
        "reports/source.json",
    ):
        write(tmp_path, rel, broken)
    page = render_report(tmp_path)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert render_report(tmp_path / "nowhere").startswith("<!DOCTYPE html>")


def test_text_from_files_is_escaped_and_nothing_is_fetched(tmp_path: Path) -> None:
    data = manifest('<script>alert("x")</script>')
    write(tmp_path, "manifest.json", data)
    write(
        tmp_path,
        "benchmark.json",
        {
            "machine": {"cpu": "<img src=http://evil>"},
            "baseline": [],
            "providers": [],
            "results": [
                {
                    "variant": "model",
                    "provider": "CPUExecutionProvider",
                    "shape": {"batch": 1},
                    "p50_ms": 0.34,
                    "p90_ms": 0.5,
                }
            ],
        },
    )
    page = render_report(tmp_path)
    assert "<script" not in page and "&lt;script&gt;" in page
    assert "<img src=http" not in page
    assert external_refs(page) == []  # text may name a URL; no tag loads one
    assert "@import" not in page and "url(" not in page
    assert "340 µs" in page and "0.0 ms" not in page


def test_write_report_never_writes_through_a_link(tmp_path: Path) -> None:
    write(tmp_path, "manifest.json", manifest())
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere.html"
    elsewhere.write_text("theirs", encoding="utf-8")
    (tmp_path / "report.html").symlink_to(elsewhere)
    path = write_report(tmp_path)
    assert not path.is_symlink() and elsewhere.read_text(encoding="utf-8") == "theirs"


def test_a_page_is_written_again_only_when_what_it_shows_or_the_page_itself_changed(
    project: Path, settings: onnxbuild.Settings
) -> None:
    """#39: a no-op make rewrote report.html each time (20 ms of a 0.15 s goal). The page
    carries the key of what it is rendered from and the digest of the rest of it; a no-op
    leaves it alone, a build that changes a step, or a page edited by hand, writes it again."""
    from onnxbuild.report.pagekey import is_current

    for _ in range(2):  # a build, then a no-op (whose page says "cached" where the first said "built")
        assert onnxbuild.build(["recipes/linear-regression.yaml"], settings).ok
    folder = settings.artifacts_dir / "linear-regression"
    page = folder / "report.html"
    assert is_current(folder)
    before = page.stat()
    assert onnxbuild.build(["recipes/linear-regression.yaml"], settings).ok  # another no-op
    assert page.stat().st_ino == before.st_ino and page.stat().st_mtime_ns == before.st_mtime_ns

    page.write_text(page.read_text(encoding="utf-8").replace("Build OK", "Build 0K"), encoding="utf-8")
    assert not is_current(folder)
    assert onnxbuild.build(["recipes/linear-regression.yaml"], settings).ok
    assert is_current(folder) and "Build OK" in page.read_text(encoding="utf-8")

    timings = folder / "timings.json"
    timings.write_text(timings.read_text(encoding="utf-8").replace('"cached"', '"built"'), encoding="utf-8")
    assert not is_current(folder)  # what the page shows changed under it


def test_onnxbuild_report_needs_a_build_first(project: Path) -> None:
    result = CliRunner().invoke(cli, ["report", "recipes/linear-regression.yaml"])
    assert result.exit_code == 2
    assert (
        result.stderr == "Error: artifacts/linear-regression/ has no manifest.json: build it first with "
        "`onnxbuild make recipes/linear-regression.yaml`\n"
    )


def external_refs(page: str) -> list[str]:
    """Every tag attribute that would make a browser fetch something from elsewhere."""
    from html.parser import HTMLParser

    found: list[str] = []

    class Refs(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag == "link":
                found.append("<link>")
            for name, value in attrs:
                if name in ("src", "href", "srcset", "action") and value and not value.startswith(("data:", "#")):
                    found.append(f"<{tag} {name}={value[:40]}>")

    Refs().feed(page)
    return found


# ---------------------------------------------------------------- as a person sees it


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium not installed: `make install` installs Debian's chromium where apt-get runs as root")
    # --host-resolver-rules makes any network name unresolvable: a page that needed one would show it
    return subprocess.run(
        [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow  # a headless Chromium renders the page: make test-slow
def test_the_report_of_a_build_renders_in_chromium(project: Path, settings: onnxbuild.Settings) -> None:
    shutil.copy(DATA / "tiny-variants.yaml", project / "recipes")
    report = onnxbuild.build(["recipes/tiny-variants.yaml"], settings)
    assert report.ok
    folder = report.recipes[0].artifacts
    page = folder / "report.html"
    assert page.is_file()  # make writes it
    variants = [
        name
        for name in ("model", "optimized", "int8")
        if (folder / ("model.onnx" if name == "model" else f"{name}/model.onnx")).is_file()
    ]
    assert len(variants) >= 2
    dom = chromium("--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr
    html = dom.stdout
    assert 'id="verdict"' in html and "Build OK" in html
    validation = html[html.index('id="validation"') : html.index("</section>", html.index('id="validation"'))]
    for name in variants:
        assert f'data-variant="{name}"' in validation, name
    assert "<img" in html and 'src="data:image/png;base64,' in html
    assert external_refs(html) == []
    shot = project / "report.png"
    done = chromium(f"--screenshot={shot}", "--window-size=1280,2400", page.as_uri())
    assert done.returncode == 0, done.stderr
    assert png_size(shot) == (1280, 2400)
    assert shot.stat().st_size > 10_000


WRONG_TYPES = [
    (
        "reports/validation.json",
        {"passed": True, "variants": {"model": {"shapes": [3, {"outputs": {}, "top1_agreement": "x"}]}}},
    ),
    (
        "reports/validation.json",
        {
            "passed": True,
            "variants": {"model": {"shapes": [], "top1": {"agreement": 1.0, "min": "<u>x</u>", "tokens": "<u>x</u>"}}},
        },
    ),
    (
        "reports/generation.json",
        {"max_new_tokens": "<u>x</u>", "variants": {"model": 3, "int8": {"greedy": {"agreement": "x"}}}},
    ),
    (
        "benchmark.json",
        {
            "machine": {"cores": "<u>x</u>"},
            "providers": 3,
            "results": [{"variant": "model", "p50_ms": "x", "ratio_to_pytorch": "x"}],
        },
    ),
    ("reports/optimize.json", {"fused_ops": [1]}),
    ("timings.json", {"steps": {"source": {"status": "built", "seconds": "x"}}}),
]


@pytest.mark.parametrize(("rel", "data"), WRONG_TYPES)
def test_valid_json_of_the_wrong_types_costs_one_section_not_the_page(tmp_path: Path, rel: str, data: Any) -> None:
    built = manifest()
    built["steps"].append(
        {
            "name": "optimize",
            "kind": "optimize",
            "outputs": [{"path": "optimized/model.onnx", "sha256": "5" * 64, "bytes": 10}],
            "data": {},
        }
    )
    write(tmp_path, "manifest.json", built)
    write(tmp_path, rel, data)
    page = render_report(tmp_path)
    assert page.rstrip().endswith("</html>") and 'id="verdict"' in page
    assert "<u>" not in page

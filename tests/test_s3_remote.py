"""The remote cache on S3, against a real S3 API server (moto's, in a thread): two runners with
empty caches share one bucket; writes go straight to their keys (no temp keys, copies or
deletes, counted from the server's own request log); a missing bucket and credentials in a
committed config file are refused with the fix (issue 40)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
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
    """An S3 API server on a free port, with one bucket; its endpoint URL."""
    import boto3

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    client = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1"
    )
    client.create_bucket(Bucket=BUCKET)
    yield endpoint
    server.stop()


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
    import boto3

    client = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1"
    )
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def test_two_runners_share_an_s3_remote_and_a_push_writes_each_object_once(s3: str, tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/shared"
    env = _env(s3, ONNXBUILD_CACHE_URL=url)
    runners = []
    for name in ("runner-1", "runner-2"):
        work = tmp_path / name
        shutil.copytree(ROOT / "recipes", work / "recipes")
        runners.append(work)

    _recording(s3, "reset")
    _recording(s3, "start")
    first = _onnxbuild(runners[0], env, "make", LR, "--json")
    _recording(s3, "stop")
    assert first.returncode == 0, first.stdout + first.stderr
    requests_seen = [json.loads(line) for line in _recording(s3, "download").splitlines() if line.strip()]
    writes = [r for r in requests_seen if r["method"] in ("PUT", "POST", "DELETE")]
    keys = _keys(s3, "shared/")
    objects = [k for k in keys if k.startswith("shared/objects/")]
    entries = [k for k in keys if k.startswith("shared/entries/")]
    assert objects and entries and not [k for k in keys if k.endswith(".tmp")]
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
    import boto3

    client = boto3.client(
        "s3", endpoint_url=s3, aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1"
    )
    assert "no-such-bucket" not in [b["Name"] for b in client.list_buckets()["Buckets"]]
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

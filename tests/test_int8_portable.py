"""Issue 50: an int8 file computes the same on an AVX2-only CPU as on a VNNI one.

ONNX Runtime picks its int8 kernels from cpuid. QEMU's user-mode emulator with its EPYC-Milan
model (AMD Zen 3: AVX2 and FMA, no AVX-512, no VNNI) gives the same Python and the same wheel
the CPU class issue 50 failed on, so these tests run the dynamic int8 variants natively and
under it and compare. onnxbuild's own sessions agree there (they set
``session.x64quantprecision`` where u8s8 saturates); a plain session with 8-bit weights does
not, which shows the emulated CPU takes the saturating AVX2 kernels; 7-bit weights
(``reduce_range: true``) agree in any session.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml

import onnxbuild
from onnxbuild.quant import u8s8
from onnxbuild.runtimes import sessions
from tests.helpers_tiny import TINY_GPT2_SOURCE

QEMU = shutil.which("qemu-x86_64")
pytestmark = [
    pytest.mark.skipif(
        QEMU is None or platform.machine().lower() not in ("x86_64", "amd64"),
        reason="needs qemu-x86_64 (apt-get install qemu-user) on an x86_64 machine",
    ),
    pytest.mark.slow,  # about 20 s: the emulator starts Python and ONNX Runtime three times
]
ZEN3 = "EPYC-Milan"

RUN = """
import sys, numpy as np, onnxruntime as ort
from onnxbuild.runtimes import sessions
feeds = dict(np.load(sys.argv[2]))
options = sessions.options() if sys.argv[4] == "onnxbuild" else ort.SessionOptions()
s = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
np.save(sys.argv[3], s.run(["logits"], feeds)[0])
print(sessions.u8s8_saturates())
"""


def zen3(model: Path, feeds: Path, out: Path, options: str = "onnxbuild") -> np.ndarray:
    """The logits of ``model`` on ``feeds`` computed on the emulated Zen 3, in a session with
    onnxbuild's options or ONNX Runtime's defaults (``plain``)."""
    assert QEMU is not None
    done = subprocess.run(
        [QEMU, "-cpu", ZEN3, sys.executable, "-c", textwrap.dedent(RUN), str(model), str(feeds), str(out), options],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
            "OMP_NUM_THREADS": "1",
        },
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "True"  # onnxbuild reads the emulated CPU as one whose u8s8 saturates
    return np.load(out)


@pytest.fixture(scope="module")
def variants(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("int8")
    doc = {
        "name": "tiny-int8",
        "source": TINY_GPT2_SOURCE,
        "quantize": [
            {"name": "int8", "method": "dynamic"},  # 8-bit weights
            {"name": "int8-7bit", "method": "dynamic", "reduce_range": True},
        ],
    }
    (root / "tiny-int8.yaml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    settings = onnxbuild.Settings(cache_dir=root / "cache", artifacts_dir=root / "artifacts")
    for target in ("quantize.int8", "quantize.int8-7bit"):
        assert onnxbuild.build([root / "tiny-int8.yaml"], settings, target=target).ok
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 1000, size=(2, 24))
    np.savez(root / "feeds.npz", input_ids=ids)
    return root


def native(model: Path, feeds: Path) -> np.ndarray:
    s = ort.InferenceSession(str(model), sessions.options(), providers=["CPUExecutionProvider"])
    out: np.ndarray = s.run(["logits"], dict(np.load(feeds)))[0]
    return out


def test_eight_bit_int8_computes_the_same_on_an_avx2_only_cpu_in_onnxbuilds_sessions(variants: Path) -> None:
    model = variants / "artifacts" / "tiny-int8" / "int8" / "model.onnx"
    wide = u8s8.saturating(onnx.load_model(str(model)))
    assert wide and all(name.endswith("_quantized") for name in wide)  # 8-bit weights: u8s8 can saturate
    here = native(model, variants / "feeds.npz")
    there = zen3(model, variants / "feeds.npz", variants / "int8.npy")
    print("8-bit, onnxbuild's session: max abs diff native vs Zen 3:", float(np.abs(here - there).max()))
    assert float(np.abs(here - there).max()) < 1e-4
    # the witness: a plain session there takes the saturating kernels (if this ever agrees, the
    # emulator no longer models an AVX2-only CPU and the assertion above proves nothing)
    plain = zen3(model, variants / "feeds.npz", variants / "plain.npy", options="plain")
    print("8-bit, plain session: max abs diff native vs Zen 3:", float(np.abs(here - plain).max()))
    assert float(np.abs(here - plain).max()) > 1e-2


def test_seven_bit_int8_weights_compute_the_same_there_in_any_session(variants: Path) -> None:
    model = variants / "artifacts" / "tiny-int8" / "int8-7bit" / "model.onnx"
    assert u8s8.saturating(onnx.load_model(str(model))) == []
    here = native(model, variants / "feeds.npz")
    there = zen3(model, variants / "feeds.npz", variants / "7bit.npy", options="plain")
    print("7-bit, plain session: max abs diff native vs Zen 3:", float(np.abs(here - there).max()))
    assert float(np.abs(here - there).max()) < 1e-4

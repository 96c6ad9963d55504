"""Models at the sizes people ship, beside onnxruntime-genai's model builder (`make bench` calls this).

For each recipe (default: recipes/llama-3.2-1b.yaml and recipes/llama-3.2-3b.yaml): one
`onnxbuild make` from an empty cache, each step's wall time and peak RSS from its timings.json,
and the whole tree's maximum resident set from `/usr/bin/time -v`; then the model builder on the
same weights (the random-init safetensors folder the source step wrote, artifacts/<name>/weights)
for fp32 (1B only: 3B's fp32 does not fit 24 GB) and int4 (block 32, its default), in the virtual
environment bench/decoders.py makes, each under `/usr/bin/time -v`.

    python bench/sizes.py [RECIPE ...]      # GENAI_PYTHON=/path/to/venv/bin/python to reuse a venv

Figures depend on the machine: compare rows of one run only (`lscpu` is printed first).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decoders import genai_python

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "sizes"
RECIPES = ["recipes/llama-3.2-1b.yaml", "recipes/llama-3.2-3b.yaml"]


def timed(command: list[str], cwd: Path) -> tuple[int, float, float, str]:
    """(exit code, wall seconds, maximum resident set in GB, stderr's tail) of one command."""
    started = time.monotonic()
    done = subprocess.run(["/usr/bin/time", "-v", *command], cwd=cwd, capture_output=True, text=True)
    wall = time.monotonic() - started
    found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    return done.returncode, wall, int(found.group(1)) / 1e6 if found else float("nan"), done.stderr[-1500:]


def builder_input(weights: Path, folder: Path) -> Path:
    """The weights folder as the builder reads it: the same files (hard links, no copy) and a
    tokenizer, which it saves beside its model: a small one trained here (the Hub is not reachable)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    for f in weights.iterdir():
        (folder / f.name).unlink(missing_ok=True)
        (folder / f.name).hardlink_to(f)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    text = ["the onnx format holds a graph of operators and their weights"] * 20
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(str(folder))
    return folder


def main(recipes: list[str]) -> None:
    print(subprocess.run(["lscpu"], capture_output=True, text=True).stdout.split("Flags")[0].strip()[-600:])
    genai = genai_python()
    for recipe in recipes:
        src = ROOT / recipe
        name = next(line.split(":", 1)[1].strip() for line in src.read_text().splitlines() if line.startswith("name:"))
        work = OUT / name
        shutil.rmtree(work, ignore_errors=True)  # from an empty cache: every step runs
        (work / "recipes").mkdir(parents=True)
        shutil.copyfile(src, work / "recipes" / src.name)
        code, wall, peak, tail = timed([sys.executable, "-m", "onnxbuild", "make", f"recipes/{src.name}"], work)
        print(f"\n## {name}\n")
        if code != 0:
            print(f"onnxbuild make failed ({code}):\n{tail}")
            continue
        artifacts = work / "artifacts" / name
        steps = json.loads((artifacts / "timings.json").read_text())["steps"]
        print("| tool | step | wall | peak RSS |\n|---|---|---|---|")
        for step, s in steps.items():
            print(f"| onnxbuild | {step} | {s['seconds']:.0f} s | {s['peak_rss_mb'] / 1000:.1f} GB |")
        print(f"| onnxbuild | whole build | {wall:.0f} s | {peak:.1f} GB |")
        weights = artifacts / "weights"
        if not genai or not weights.is_dir():
            print(
                "| model builder | - | skipped: "
                + ("no onnxruntime-genai" if not genai else "no weights folder")
                + " | |"
            )
            continue
        folder = builder_input(weights, work / "hf")
        for precision in ("fp32", "int4") if "1b" in name else ("int4",):
            out = work / f"builder-{precision}"
            command = [genai, "-m", "onnxruntime_genai.models.builder", "-i", str(folder), "-o", str(out)]
            code, wall, peak, tail = timed([*command, "-p", precision, "-e", "cpu", "-c", str(work / "hf-cache")], work)
            size = sum(f.stat().st_size for f in out.glob("*.onnx*")) / 1e9 if out.is_dir() else 0.0
            shown = f"{wall:.0f} s | {peak:.1f} GB |" if code == 0 else f"failed ({code}) | {peak:.1f} GB |"
            print(f"| model builder | {precision} ({size:.2f} GB out) | {shown}")
            if code != 0:
                print(f"\nthe model builder failed:\n{tail}\n")
            shutil.rmtree(out, ignore_errors=True)  # gigabytes; the figures are above
        shutil.rmtree(work / "hf-cache", ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:] or RECIPES)

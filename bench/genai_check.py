"""Generate from a built with-past artifact folder with onnxruntime-genai, to compare with
``onnxbuild run``. onnxruntime-genai brings its own onnxruntime, which cannot sit beside
onnxruntime-gpu, so run this from a separate virtual environment:

    python3 -m venv /tmp/genai && /tmp/genai/bin/pip install onnxruntime-genai numpy
    /tmp/genai/bin/python bench/genai_check.py artifacts/gpt2 464 2068 7586
    onnxbuild run artifacts/gpt2 --prompt "464 2068 7586" -n 16     # the same ids
"""

from __future__ import annotations

import sys

import numpy as np
import onnxruntime_genai as og


def main() -> None:
    folder, prompt = sys.argv[1], [int(t) for t in sys.argv[2:]] or [11, 22, 33]
    model = og.Model(folder)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + 16, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([prompt], dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    print(" ".join(str(int(t)) for t in generator.get_sequence(0)[len(prompt) :]))


if __name__ == "__main__":
    main()

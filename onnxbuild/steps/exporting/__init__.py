"""The parts of the ``export`` step kind (onnxbuild/steps/export.py): ``rules``, what it checks
of a recipe and fills in before any step runs; ``vlm``, a vision-language model's three files."""

"""The parts of the ``quantize`` step kind (onnxbuild/steps/quantize.py), one per family of
methods: ``int8`` (dynamic and static), ``nbits`` (weight-only MatMulNBits), ``gguf`` (a
GGUF's own blocks) and ``budgeted`` (4-bit within an accuracy budget).
"""

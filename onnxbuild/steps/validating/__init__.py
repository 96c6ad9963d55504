"""The parts of the ``validate`` step kind (onnxbuild/steps/validate.py), each importable on its
own: ``compare`` (the tolerance rule, feeds cast as a session declares them, pooling and
cosine), ``cases`` (the shapes, padding, seeds and real tokens), ``targets`` (one case on ONNX
Runtime, onnxruntime-web and OpenVINO), ``checks`` (accuracy and sentence embeddings) and
``divergence`` (the first node where a variant leaves its base: a failed validation's
answer, and ``onnxbuild explain-mismatch``'s).
"""

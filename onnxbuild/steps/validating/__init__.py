"""The parts of the ``validate`` step kind (onnxbuild/steps/validate.py), each importable on its
own: ``compare`` (the tolerance rule, feeds cast as a session declares them, pooling and
cosine), ``cases`` (the shapes, padding, seeds and real tokens), ``targets`` (one case on ONNX
Runtime, onnxruntime-web and OpenVINO) and ``checks`` (accuracy and sentence embeddings).
"""

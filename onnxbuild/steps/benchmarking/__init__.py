"""The parts of the ``benchmark`` step kind (onnxbuild/steps/benchmark.py), each importable on its
own: ``timing`` (the feeds per shape and the timed loop every part shares), ``pytorch`` (the
baselines), ``decode`` (decode steps on ONNX Runtime), ``targets`` (encoder-decoders,
onnxruntime-web, OpenVINO), ``profiles`` (where the time goes) and ``limits`` (the roofline).
"""

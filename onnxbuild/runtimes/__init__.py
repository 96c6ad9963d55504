"""Running artifacts: ONNX Runtime's shared session options and tested providers, the OpenVINO
target, and `onnxbuild run`'s generation loop (onnxruntime-web is in onnxbuild/web)."""

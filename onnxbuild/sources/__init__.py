"""Where models come from. Plan-time helpers here are light; loading imports torch/onnx inside."""

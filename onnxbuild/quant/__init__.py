"""Quantized weights carried into ONNX graphs from other formats (GGUF: :mod:`.gguf_exact`)."""

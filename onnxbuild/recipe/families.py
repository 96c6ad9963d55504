"""Architectures with a fused decoder graph (onnxbuild/fusion/decoder.py), named here so the
recipe loader can check ``optimize.decoder: fused`` without importing the graph writer."""

FUSED_DECODERS = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gpt2")

"""Fused graphs built from a model's weights, for the architectures ONNX Runtime has kernels for.

An export traces the model op by op; ONNX Runtime's pattern-matching fusions then have to
recognise attention and normalisation in whatever the exporter emitted, and on today's
transformers graphs they often do not. For the decoder families people ship (Llama,
Mistral, Qwen2/3, Phi-3, Gemma) the graph is known, so it is written directly with the
fused operators (ONNX's Attention and RotaryEmbedding, SkipSimplifiedLayerNormalization,
packed QKV and gate-up MatMuls), as onnxruntime-genai's model builder does. The file keeps
the export's inputs and outputs, so it is validated against PyTorch like any variant.
"""

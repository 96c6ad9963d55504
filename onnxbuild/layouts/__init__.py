"""Model layouts: how a model is laid out in files, and the loops that run it.

A single file, a decoder with its KV cache as inputs and outputs (``decoding``), an
encoder-decoder's two files (``seq2seq_decoding``), a vision-language model's three
(``vlm_decoding``), and ``onnxbuild run``'s driver over them (``generation``). A layout sits
above the sources (it runs the torch wrappers a source kind exports, beside the ONNX files, to
compare their greedy tokens) and above the runtimes (it runs the files on their sessions), so
a runtime never imports a source: the KV cache's names, which both need, are in
``recipe/tasks.py``.
"""

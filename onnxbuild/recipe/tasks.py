"""What each Hugging Face task exports: inputs, outputs and the Auto class that builds it.

Kept as data (not code that imports transformers) so ``show`` can print the resolved
inputs without importing anything heavy.
"""

from __future__ import annotations

from typing import TypedDict

from onnxbuild.recipe.sections import Tensor

PAST = "past_key_values.{i}.{kv}"
"""A decoder's past for layer i (kv: key or value), an input: [batch, kv_heads, past_sequence, head_dim]."""
PRESENT = "present.{i}.{kv}"
"""The cache it returns, past and new tokens: [batch, kv_heads, total_sequence, head_dim]."""
PAST_PREFIX = "past_key_values."
PRESENT_PREFIX = "present."


class TaskInfo(TypedDict):
    """A Hugging Face task: its model class, default inputs and outputs, and how validation reads them."""

    auto_class: str
    inputs: list[Tensor]
    outputs: list[str]
    top1: bool
    """The first output's last axis scores classes or tokens: validation gates the top-1
    agreement with PyTorch (``validate.top1_min``)."""
    per_token: bool
    """Every output has the input's sequence axis second (batch, sequence, ...)."""


_TOKENS: list[int | str] = ["batch", "sequence"]
_TEXT: list[Tensor] = [
    {"name": "input_ids", "dtype": "int64", "shape": _TOKENS},
    {"name": "attention_mask", "dtype": "int64", "shape": _TOKENS},
]
CHANNELS = "channels"
"""Stands for the config's num_channels in an image task's input; replaced when the recipe resolves."""
MEL_BINS, FRAMES = "mel_bins", "frames"
"""Stand for the config's num_mel_bins and 2 x max_source_positions in a speech task's input."""
_AUDIO: list[Tensor] = [{"name": "input_features", "dtype": "float32", "shape": ["batch", MEL_BINS, FRAMES]}]
_IMAGE: list[Tensor] = [{"name": "pixel_values", "dtype": "float32", "shape": ["batch", CHANNELS, "height", "width"]}]
_WAVEFORM: list[Tensor] = [{"name": "input_values", "dtype": "float32", "shape": ["batch", "samples"]}]
"""Raw 16 kHz audio (wav2vec2, HuBERT): its convolutions take any length above their receptive field."""
_CHOICES: list[Tensor] = [
    {"name": "input_ids", "dtype": "int64", "shape": ["batch", "choices", "sequence"]},
    {"name": "attention_mask", "dtype": "int64", "shape": ["batch", "choices", "sequence"]},
]

TASKS: dict[str, TaskInfo] = {
    "feature-extraction": {
        "auto_class": "AutoModel",
        "inputs": _TEXT,
        "outputs": ["last_hidden_state"],
        "top1": False,
        "per_token": True,
    },
    "text-classification": {
        "auto_class": "AutoModelForSequenceClassification",
        "inputs": _TEXT,
        "outputs": ["logits"],
        "top1": True,
        "per_token": False,
    },
    "token-classification": {
        "auto_class": "AutoModelForTokenClassification",
        "inputs": _TEXT,
        "outputs": ["logits"],
        "top1": True,
        "per_token": True,
    },
    # The answer span's start: argmax over the tokens is the prediction, so top-1 applies.
    "question-answering": {
        "auto_class": "AutoModelForQuestionAnswering",
        "inputs": _TEXT,
        "outputs": ["start_logits", "end_logits"],
        "top1": True,
        "per_token": True,
    },
    "fill-mask": {
        "auto_class": "AutoModelForMaskedLM",
        "inputs": _TEXT,
        "outputs": ["logits"],
        "top1": True,
        "per_token": True,
    },
    # GPT-2's attention mask is all ones for a single unpadded prompt; the seeds leave it out,
    # and so do we by default (the export wrapper supplies it so TorchScript can trace).
    "text-generation": {
        "auto_class": "AutoModelForCausalLM",
        "inputs": [{"name": "input_ids", "dtype": "int64", "shape": _TOKENS}],
        "outputs": ["logits"],
        "top1": True,
        "per_token": True,
    },
    # Encoder and decoder in two files (onnxbuild/sources/seq2seq.py); export.inputs are the
    # encoder's, and validation also varies the decoder's new tokens (decoder_sequence).
    "text2text-generation": {
        "auto_class": "AutoModelForSeq2SeqLM",
        "inputs": _TEXT,
        "outputs": ["logits"],
        "top1": True,
        "per_token": True,
    },
    # Whisper: log-mel features of 30 s of audio in (the encoder takes exactly that many
    # frames), tokens out; encoder and decoder files as for text2text-generation.
    "automatic-speech-recognition": {
        "auto_class": "AutoModelForSpeechSeq2Seq",
        "inputs": _AUDIO,
        "outputs": ["logits"],
        "top1": True,
        "per_token": True,
    },
    "image-classification": {
        "auto_class": "AutoModelForImageClassification",
        "inputs": _IMAGE,
        "outputs": ["logits"],
        "top1": True,
        "per_token": False,
    },
    # A vision tower (ViT, CLIP's vision model, ConvNeXt...): its hidden states; add
    # pooler_output to export.outputs for the pooled embedding.
    "image-feature-extraction": {
        "auto_class": "AutoModel",
        "inputs": _IMAGE,
        "outputs": ["last_hidden_state"],
        "top1": False,
        "per_token": False,
    },
    # DETR / YOLOS / Conditional DETR: a score per class (and "no object") and a box per query.
    "object-detection": {
        "auto_class": "AutoModelForObjectDetection",
        "inputs": _IMAGE,
        "outputs": ["logits", "pred_boxes"],
        "top1": True,
        "per_token": False,
    },
    # SegFormer, MobileViT, BEiT: a score per class at each pixel of a downsampled map.
    "semantic-segmentation": {
        "auto_class": "AutoModelForSemanticSegmentation",
        "inputs": _IMAGE,
        "outputs": ["logits"],
        "top1": False,
        "per_token": False,
    },
    "audio-classification": {
        "auto_class": "AutoModelForAudioClassification",
        "inputs": _WAVEFORM,
        "outputs": ["logits"],
        "top1": True,
        "per_token": False,
    },
    # CLIP / SigLIP: both towers in one file; each image's score against each text.
    "zero-shot-image-classification": {
        "auto_class": "AutoModelForZeroShotImageClassification",
        "inputs": [*_TEXT, *_IMAGE],
        "outputs": ["logits_per_image", "logits_per_text"],
        "top1": True,
        "per_token": False,
    },
    # One score per candidate answer: inputs are [batch, choices, sequence].
    "multiple-choice": {
        "auto_class": "AutoModelForMultipleChoice",
        "inputs": _CHOICES,
        "outputs": ["logits"],
        "top1": True,
        "per_token": False,
    },
    # sentence-transformers' embedding: the encoder's tokens mean-pooled over the attention mask
    # inside the graph (sentence_embedding), beside the tokens themselves (token_embeddings).
    "sentence-similarity": {
        "auto_class": "AutoModel",
        "inputs": _TEXT,
        "outputs": ["sentence_embedding", "token_embeddings"],
        "top1": False,
        "per_token": True,
    },
    # A vision-language model (LLaVA, Idefics3): three files (onnxbuild/sources/vlm.py). The inputs are
    # what validation sizes: images (each the vision tower's one size, from vision_config) and a
    # prompt whose text tokens follow each row's image tokens.
    "image-text-to-text": {
        "auto_class": "AutoModelForImageTextToText",
        "inputs": [
            {"name": "pixel_values", "dtype": "float32", "shape": ["num_images", CHANNELS, "height", "width"]},
            {"name": "input_ids", "dtype": "int64", "shape": _TOKENS},
        ],
        "outputs": ["logits"],
        "top1": True,
        "per_token": True,
    },
    # An image encoder (ViT, DeiT, Swin) and a text decoder with cross-attention (GPT-2,
    # TrOCR): transformers' VisionEncoderDecoderModel, built by AutoModelForImageTextToText (its
    # table maps vision-encoder-decoder there; AutoModelForVision2Seq is gone in transformers 5).
    # Two files as for text2text-generation, pixel_values into the encoder at its one size.
    "image-to-text": {
        "auto_class": "AutoModelForImageTextToText",
        "inputs": _IMAGE,
        "outputs": ["logits"],
        "top1": True,
        "per_token": True,
    },
}

POOLED_TASKS = frozenset({"sentence-similarity"})
"""Tasks whose wrapper mean-pools the encoder's last_hidden_state into ``sentence_embedding``."""

CTC_TYPES = frozenset(
    {
        "wav2vec2",
        "wav2vec2-conformer",
        "hubert",
        "wavlm",
        "data2vec-audio",
        "unispeech",
        "unispeech-sat",
        "sew",
        "sew-d",
    }
)
"""Speech encoders whose automatic-speech-recognition head is CTC: one file, raw audio in,
a score per vocabulary entry per frame out (AutoModelForCTC), not an encoder and a decoder."""
WHISPER_LAYOUT = frozenset({"whisper"})
"""Speech encoder-decoders whose files onnxbuild writes (log-mel [batch, bins, frames] in)."""
CTC_TASK: TaskInfo = {
    "auto_class": "AutoModelForCTC",
    "inputs": _WAVEFORM,
    "outputs": ["logits"],
    "top1": True,
    "per_token": False,
}


def task_info(task: str, model_type: object) -> TaskInfo:
    """The task as a model of this type does it (a CTC speech model's ASR is one file)."""
    if task == "automatic-speech-recognition" and model_type in CTC_TYPES:
        return CTC_TASK
    return TASKS[task]


SIZE_DIMS = frozenset({"height", "width", "samples"})
"""Dimensions never validated at 1 (a convolution's kernel is larger): the smallest default
shape keeps their sample size."""

ENCODER_FILE, DECODER_FILE = "encoder_model.onnx", "decoder_model.onnx"
"""An encoder-decoder's two files (Optimum's and onnxruntime-genai's names)."""
DEFAULT_DECODER_SEQUENCE = 4
"""Decoder tokens of an encoder-decoder's export sample (its validation varies them too)."""
SEQ2SEQ_TASKS = frozenset({"text2text-generation", "automatic-speech-recognition", "image-to-text"})
IMAGE_TO_TEXT_TYPES = frozenset({"vision-encoder-decoder"})
"""The model types image-to-text exports (AutoModelForImageTextToText also builds LLaVA and the
other vision-language models of image-text-to-text, which are not encoder-decoders)."""
VLM_TASKS = frozenset({"image-text-to-text"})
VISION_FILE, EMBEDDING_FILE, VLM_DECODER_FILE = "vision.onnx", "embedding.onnx", "decoder.onnx"
"""A vision-language model's three files (onnxruntime-genai's names for its phi3v-type models)."""
DEFAULT_NUM_IMAGES = 2
"""Images of a vision-language model's export sample (validation's default shapes take 1, 2 and 5)."""
IMAGE_TASKS = frozenset(t for t, info in TASKS.items() if any(i["name"] == "pixel_values" for i in info["inputs"]))

FIXED_SIZE_IMAGES = frozenset(
    {
        "vit",
        "deit",
        "beit",
        "data2vec-vision",
        "vit_msn",
        "vit_mae",
        "clip",
        "clip_vision_model",
        "siglip",
        "siglip_vision_model",
        "yolos",
        "levit",
        # MobileViT unfolds its feature maps into patches with sizes computed in Python from the
        # map's shape (math.ceil, int), which tracing fixes: another size fails a Reshape.
        "mobilevit",
        "mobilevitv2",
        # Swin pads to whole windows with Python conditionals, which tracing fixes at the export size.
        "swin",
        "swinv2",
        "donut-swin",
        # (found building every AutoModelForImageClassification type) FocalNet and MobileNetV2 pad
        # with sizes computed in Python (traced: another size gives other numbers, 90% of FocalNet's
        # logits off at 129x129); I-JEPA, Perceiver and PVT do not interpolate their position
        # embeddings (PyTorch itself refuses another size); DINOv2 with registers' dynamo export
        # fixes the size.
        "focalnet",
        "mobilenet_v2",
        "ijepa",
        "perceiver",
        "pvt",
        "dinov2_with_registers",
    }
)
"""Model types whose absolute position embeddings fix the image size (config.image_size):
their export takes that size only, and validation varies the batch. Convolutional models
(ResNet, ConvNeXt, EfficientNet, RegNet) take any size."""

TOKEN_INPUTS = frozenset({"input_ids", "attention_mask", "token_type_ids", "position_ids"})

# export.with_past: a decoder takes its mask over past + new tokens, and explicit positions
# (they continue after the past); the past_key_values.* inputs are added from the config.
WITH_PAST_INPUTS: list[Tensor] = [
    {"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence"]},
    {"name": "attention_mask", "dtype": "int64", "shape": ["batch", "total_sequence"]},
    {"name": "position_ids", "dtype": "int64", "shape": ["batch", "sequence"]},
]
DERIVED_DIMS = frozenset({"total_sequence"})
"""Dimensions computed from others (past_sequence + sequence), never sized in a recipe."""

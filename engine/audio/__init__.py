"""Audio stage: any PCM -> 16 kHz mono float32 -> streaming HuBERT features, one 1024-d row per video frame.

``pcm`` normalises and resamples input audio, ``hubert`` chunks it by the official 3-5-2
streaming contract and runs the encoder (onnxruntime or PyTorch), ``standin_hubert`` is our
own small stand-in encoder for tests and the demo (not HuBERT).
"""

from engine.audio.hubert import (
    FEATURE_DIM,
    HubertFeatureStream,
    HubertRunner,
    OnnxHubertRunner,
    TorchHubertRunner,
    extract_features,
    frames_for_samples,
)
from engine.audio.pcm import PcmError, StreamingResampler, to_mono_16k

__all__ = [
    "FEATURE_DIM",
    "HubertFeatureStream",
    "HubertRunner",
    "OnnxHubertRunner",
    "PcmError",
    "StreamingResampler",
    "TorchHubertRunner",
    "extract_features",
    "frames_for_samples",
    "to_mono_16k",
]

"""open_video_encoder auto|nvenc|x264: NVENC where it works, otherwise a clear reason and x264."""

from __future__ import annotations

import pytest
import torch

from streaming.encoders.nvenc import NvencUnavailable, load_pynvvideocodec
from streaming.encoders.select import open_video_encoder


def nvenc_works() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        open_video_encoder("nvenc", 256, 256, torch.device("cuda"))
    except NvencUnavailable:
        return False
    return True


def test_x264_on_request() -> None:
    encoder, note = open_video_encoder("x264", 64, 64, torch.device("cpu"))
    assert encoder.name == "x264" and "x264" in note


@pytest.mark.skipif(nvenc_works(), reason="this machine has a working NVENC")
def test_auto_falls_back_to_x264_and_says_why() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    encoder, note = open_video_encoder("auto", 64, 64, device)
    assert encoder.name == "x264"
    assert "NVENC unavailable" in note
    with pytest.raises(NvencUnavailable) as caught:
        open_video_encoder("nvenc", 64, 64, device)
    assert str(caught.value) in note


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_without_cuda_the_message_says_so() -> None:
    with pytest.raises(NvencUnavailable, match="needs a CUDA device"):
        open_video_encoder("nvenc", 64, 64, torch.device("cpu"))


def test_pynvvideocodec_import_failures_become_one_clear_error() -> None:
    """Not installed -> ImportError; installed without the NVIDIA encode library -> RuntimeError at import."""
    try:
        module = load_pynvvideocodec()
    except NvencUnavailable as exc:
        assert "not installed" in str(exc) or "cannot load the NVIDIA encoder library" in str(exc)
    else:
        assert hasattr(module, "CreateEncoder")


def test_unknown_encoder_names_are_refused() -> None:
    with pytest.raises(ValueError, match="auto, nvenc, x264"):
        open_video_encoder("vp8", 64, 64, torch.device("cpu"))


@pytest.mark.skipif(not nvenc_works(), reason="no working NVENC here (no GPU, no driver, or a data-centre GPU)")
def test_nvenc_encodes_from_device_memory() -> None:
    import av

    from tests.streaming.synthetic import picture, read_index

    encoder, _ = open_video_encoder("nvenc", 256, 256, torch.device("cuda"))
    units = []
    for i in range(60):
        if i == 10:
            encoder.keyframes.request()
        units += encoder.encode(picture(i, 256, 256).cuda(), i)
    units += encoder.flush()
    assert [u.index for u in units] == list(range(60))
    keyframes = [u.index for u in units if u.keyframe]
    assert keyframes[:2] == [0, 10]
    decoder = av.CodecContext.create("h264", "r")
    decoded = [f for u in units for f in decoder.decode(av.Packet(u.data))]
    assert [read_index(f.to_ndarray(format="rgb24")) for f in decoded] == list(range(60))

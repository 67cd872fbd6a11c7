"""What a WebRTC picture shows, in the picture: tags written into x264's access units come back from PyAV's decoder."""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np

from streaming.picture_tags import PictureTag, read_tag, tag_access_unit


def encoded(count: int) -> list[bytes]:
    """``count`` access units of a 64x64 x264 stream (Annex-B; the first an IDR with SPS, PPS and x264's own SEI)."""
    encoder = av.CodecContext.create("libx264", "w")
    encoder.width = encoder.height = 64
    encoder.pix_fmt, encoder.time_base = "yuv420p", Fraction(1, 25)
    encoder.options = {"preset": "ultrafast", "tune": "zerolatency"}
    units = []
    for i in range(count):
        rgb = np.full((64, 64, 3), 30 * i % 256, np.uint8)
        frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")
        frame.pts = i
        units += [bytes(packet) for packet in encoder.encode(frame)]
    return units


def test_every_decoded_picture_carries_its_own_tag_and_the_picture_is_unchanged() -> None:
    tags = [
        PictureTag(pts=i, audio_from=None if i == 0 else 1, segment=i // 3, speech=i % 2 == 1, repeat=i == 4)
        for i in range(6)
    ]  # zero bytes in the payload: the emulation prevention is exercised
    plain, tagged = av.CodecContext.create("h264", "r"), av.CodecContext.create("h264", "r")
    for unit, tag in zip(encoded(6), tags):
        (reference,) = plain.decode(av.Packet(unit))
        (picture,) = tagged.decode(av.Packet(tag_access_unit(unit, tag)))
        assert read_tag(picture.side_data) == tag
        assert np.array_equal(picture.to_ndarray(), reference.to_ndarray()), "the coded picture is untouched"
        assert read_tag(reference.side_data) is None, "x264's own SEI is not taken for a tag"


def test_large_values_and_an_access_unit_without_a_slice() -> None:
    tag = PictureTag(pts=2**32 - 1, audio_from=2**31, segment=65_536, speech=True, repeat=False)
    unit = tag_access_unit(encoded(1)[0], tag)
    (picture,) = av.CodecContext.create("h264", "r").decode(av.Packet(unit))
    assert read_tag(picture.side_data) == tag
    assert tag_access_unit(b"\x00\x00\x00\x01\x67abc", tag).startswith(b"\x00\x00\x00\x01\x67abc"), "appended"

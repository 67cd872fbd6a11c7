"""What a WebRTC picture shows, carried in the picture itself: an H.264 SEI message (user data unregistered) with the
stream timestamp, the session's speech segment and whether the frame speaks or repeats.

A viewer that needs more than pictures (a voice-agent bot: which pictures speak, which segment they end, which audio
samples go with them) reads it back from the decoded frame's side data, exactly, where matching events to pictures by
their arrival time would be a guess. Browsers and other decoders ignore it. ``audio_from`` is the timestamp of the
picture the viewer's audio starts with: audio sample ``n`` from the first one received belongs to picture
``audio_from + n // 1920`` (the audio's timestamps follow the pictures', gaps included).

The message goes into each viewer's copy of an access unit ahead of its first slice (H.264 7.4.1.2.3: SEI NAL units
precede the primary coded picture), so the shared bitstream of RTMP and MP4 never carries it.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

TAG_UUID = uuid.UUID("5d1f3a0c-7b9e-4c52-a8e6-d1770b1e7a9f").bytes
"""Names this project's SEI payload among any others in a stream (x264 writes its settings the same way)."""
VERSION = 1
_LAYOUT = struct.Struct(">BIIIB")
"""version, timestamp (1/25 s), the timestamp the audio starts at (NO_AUDIO: none yet), segment, flags."""
NO_AUDIO = 2**32 - 1
SPEECH, REPEAT = 1, 2
START_CODE = b"\x00\x00\x01"
SEI_NAL = 6
USER_DATA_UNREGISTERED = 5
SLICES = range(1, 6)
"""NAL unit types of coded slices (non-IDR to IDR)."""


@dataclass(frozen=True)
class PictureTag:
    """One picture of a viewer's stream: its timestamp (1/25 s), the timestamp of the picture that viewer's audio
    starts with (None: no audio sent yet), the speech segment of the session frame it shows, whether that frame speaks
    and whether it is a repeat (a stand-in for a frame that was not ready: the last picture again, silence)."""

    pts: int
    audio_from: int | None
    segment: int
    speech: bool
    repeat: bool

    def payload(self) -> bytes:
        flags = SPEECH * self.speech | REPEAT * self.repeat
        audio_from = NO_AUDIO if self.audio_from is None else self.audio_from
        return TAG_UUID + _LAYOUT.pack(VERSION, self.pts, audio_from, self.segment, flags)


def tag_access_unit(access_unit: bytes, tag: PictureTag) -> bytes:
    """The Annex-B access unit with ``tag``'s SEI NAL unit inserted before its first slice."""
    sei = b"\x00\x00\x00\x01" + bytes([SEI_NAL]) + _escape(_sei_message(tag.payload()))
    at = _first_slice(access_unit)
    return access_unit[:at] + sei + access_unit[at:]


def read_tag(side_data: Iterable) -> PictureTag | None:
    """The tag among a decoded frame's side data (PyAV ``VideoFrame.side_data``), or None when it has none."""
    for entry in side_data:
        data = bytes(entry)
        if data[: len(TAG_UUID)] == TAG_UUID and len(data) >= len(TAG_UUID) + _LAYOUT.size:
            version, pts, audio_from, segment, flags = _LAYOUT.unpack_from(data, len(TAG_UUID))
            if version == VERSION:
                audio_from = None if audio_from == NO_AUDIO else audio_from
                return PictureTag(pts, audio_from, segment, bool(flags & SPEECH), bool(flags & REPEAT))
    return None


def _sei_message(payload: bytes) -> bytes:
    """One user-data-unregistered SEI message and the RBSP trailing bits (H.264 7.3.2.3)."""
    size, header = len(payload), bytearray([USER_DATA_UNREGISTERED])
    while size >= 255:
        header.append(255)
        size -= 255
    header.append(size)
    return bytes(header) + payload + b"\x80"


def _escape(rbsp: bytes) -> bytes:
    """Emulation prevention (H.264 7.4.1): a 0x03 after two zero bytes wherever the next byte is 0-3."""
    out, zeros = bytearray(), 0
    for byte in rbsp:
        if zeros >= 2 and byte <= 3:
            out.append(3)
            zeros = 0
        out.append(byte)
        zeros = zeros + 1 if byte == 0 else 0
    return bytes(out)


def _first_slice(access_unit: bytes) -> int:
    """Where the start code of the access unit's first slice begins (its end when it has none)."""
    at = access_unit.find(START_CODE)
    while at >= 0 and at + 3 < len(access_unit):
        if access_unit[at + 3] & 0x1F in SLICES:
            return at - 1 if at > 0 and access_unit[at - 1] == 0 else at
        at = access_unit.find(START_CODE, at + 3)
    return len(access_unit)

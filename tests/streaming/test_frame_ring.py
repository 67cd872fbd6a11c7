"""The shared-memory frame ring: a reader sees each frame whole, or None when its slot was taken by another."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streaming.frame_ring import FrameRing
from streaming.frames import AUDIO_SAMPLES_PER_FRAME


def test_a_second_mapping_reads_what_the_writer_wrote_and_its_name_goes_once_the_reader_is_attached() -> None:
    writer = FrameRing(None, 64, 32, slots=4, create=True)
    named = Path("/dev/shm") / writer.name
    assert named.exists()
    reader = FrameRing(writer.name, 64, 32, slots=4)
    try:
        assert not named.exists(), "an attached ring's name stays: a kill of both processes would leave the block"
        picture = np.arange(64 * 48, dtype=np.uint32).astype(np.uint8).reshape(48, 64)
        audio = np.linspace(-1, 1, AUDIO_SAMPLES_PER_FRAME, dtype=np.float32)
        writer.write(5, picture, audio)
        got = reader.read(5)
        assert got is not None and (got[0] == picture).all() and (got[1] == audio).all()
        assert reader.read(1) is None, "slot 1 holds frame 5: frame 1 is gone"
        writer.begin(9)
        assert reader.read(5) is None, "a slot being rewritten is never read half-done"
    finally:
        reader.close()
        writer.close()


def test_a_reader_of_the_wrong_size_is_refused_and_the_writer_removes_the_name() -> None:
    writer = FrameRing(None, 64, 32, slots=2, create=True)
    try:
        with pytest.raises(ValueError, match="expected"):
            FrameRing(writer.name, 128, 64, slots=2)
        assert (Path("/dev/shm") / writer.name).exists(), "a refused reader took the writer's name"
    finally:
        writer.close()
    assert not (Path("/dev/shm") / writer.name).exists()


def test_a_slot_is_free_for_the_frame_a_ring_later_only_once_its_reader_released_it() -> None:
    writer = FrameRing(None, 64, 32, slots=2, create=True)
    reader = FrameRing(writer.name, 64, 32, slots=2)
    try:
        picture, audio = np.zeros((48, 64), np.uint8), np.zeros(AUDIO_SAMPLES_PER_FRAME, np.float32)
        assert writer.free(0) and writer.free(1), "an empty ring has room"
        writer.write(0, picture, audio)
        writer.write(1, picture, audio)
        assert not writer.free(2) and not writer.free(3), "frames 0 and 1 are not written out yet"
        assert reader.read(0) is not None
        reader.release(0)
        assert writer.free(2) and not writer.free(3), "frame 0 released: its slot takes frame 2, not frame 1's"
    finally:
        reader.close()
        writer.close()

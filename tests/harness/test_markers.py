"""Latency markers: loud bursts in quiet speech, found again at the right sample, through AAC too, and paired with what
was pushed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.assets import demo_audio
from harness.markers import (
    AAC_PRIMING,
    CODES,
    Onset,
    OnsetDetector,
    burst_seconds,
    find_onsets,
    pair,
    utterance,
)
from streaming.frames import AUDIO_RATE, AUDIO_SAMPLES_PER_FRAME

RATE = 16_000
CHUNK = 320


def speech() -> np.ndarray:
    return demo_audio()[0]


def test_an_utterance_holds_two_markers_on_chunk_boundaries_and_quiet_speech_around_them() -> None:
    spoken = utterance(speech(), RATE, first_number=4, seconds=1.5, chunk=CHUNK)
    assert spoken.samples.size == 1.5 * RATE and spoken.marker_offsets[0] == 0
    assert all(offset % CHUNK == 0 for offset in spoken.marker_offsets)
    onsets = find_onsets(spoken.samples, RATE)
    assert [round(o.time * RATE) for o in onsets] == list(spoken.marker_offsets)
    assert [o.code for o in onsets] == [4 % CODES, 5 % CODES]
    assert [o.seconds for o in onsets] == pytest.approx([burst_seconds(4), burst_seconds(5)], abs=0.003)
    assert utterance(speech(), RATE, 0, seconds=1.6, chunk=CHUNK, shift=0.08).marker_offsets[1] == 0.88 * RATE
    with pytest.raises(ValueError, match="too short"):
        utterance(speech(), RATE, 0, seconds=0.7, chunk=CHUNK)


def test_bursts_are_found_the_same_whatever_blocks_the_audio_arrives_in() -> None:
    spoken = utterance(speech(), RATE, 0, seconds=1.6, chunk=CHUNK)
    whole = find_onsets(spoken.samples, RATE, start=3.0)
    detector, pieces = OnsetDetector(RATE), []
    for lo in range(0, spoken.samples.size, 333):
        pieces += detector.feed(spoken.samples[lo : lo + 333], 3.0 + lo / RATE)
    pieces += detector.feed(np.zeros(RATE, np.float32), 3.0 + spoken.samples.size / RATE)
    flat = lambda onsets: [x for o in onsets for x in (o.time, o.seconds)]  # noqa: E731
    assert len(whole) == 2 and flat(pieces) == pytest.approx(flat(whole)) and whole[0].time == pytest.approx(3.0)


def test_a_gap_inside_a_burst_does_not_change_its_code() -> None:
    spoken = utterance(speech(), RATE, 2, seconds=1.5, chunk=CHUNK).samples
    gapped = np.concatenate([spoken[:CHUNK], np.zeros(2 * CHUNK, np.float32), spoken[CHUNK:]])
    assert [o.code for o in find_onsets(gapped, RATE)] == [2, 3]


def test_loud_speech_without_a_burst_is_not_a_marker_but_any_sample_above_the_threshold_after_quiet_is() -> None:
    quiet = np.resize(speech() * 0.45 / np.abs(speech()).max(), RATE)
    assert find_onsets(quiet, RATE) == []
    quiet[8000] = 0.7
    assert [round(o.time * RATE) for o in find_onsets(quiet, RATE)] == [8000]


def test_a_burst_survives_aac_in_flv_and_comes_out_exactly_the_encoder_delay_late(tmp_path) -> None:
    from streaming.encoders.select import open_video_encoder
    from streaming.output import EncodedFrame
    from streaming.sinks.mux import Muxer

    spoken = utterance(speech(), AUDIO_RATE, 1, seconds=1.2, chunk=AUDIO_SAMPLES_PER_FRAME)
    audio = np.concatenate([np.zeros(10 * AUDIO_SAMPLES_PER_FRAME + 700, np.float32), spoken.samples])
    frames = audio.size // AUDIO_SAMPLES_PER_FRAME
    encoder, _ = open_video_encoder("x264", 64, 64, torch.device("cpu"), None)
    muxer = Muxer(str(tmp_path / "marker.flv"), "flv", 64, 64)
    units = [
        u for i in range(frames) for u in encoder.encode(torch.zeros(64, 64, 3, dtype=torch.uint8), i)
    ] + encoder.flush()
    for unit in units:
        own = audio[unit.index * AUDIO_SAMPLES_PER_FRAME : (unit.index + 1) * AUDIO_SAMPLES_PER_FRAME]
        muxer.write(EncodedFrame(unit.index, 64, 64, unit.data, unit.keyframe, own, (), False))
    muxer.close()
    import av

    with av.open(str(tmp_path / "marker.flv")) as container:
        decoded = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
    found = find_onsets(decoded, AUDIO_RATE)
    expected = [
        (10 * AUDIO_SAMPLES_PER_FRAME + 700 + offset + AAC_PRIMING) / AUDIO_RATE for offset in spoken.marker_offsets
    ]
    assert [o.time for o in found] == pytest.approx(expected, abs=0.0002)
    assert [o.code for o in found] == [1, 2]


def test_pairing_survives_a_lost_marker_and_never_pairs_an_onset_heard_before_its_push() -> None:
    pushed = [10.0, 11.0, 12.0, 13.0, 14.0]
    heard = [
        Onset(0.0, burst_seconds(0)),
        Onset(2.0, burst_seconds(2)),
        Onset(3.0, burst_seconds(3)),
        Onset(4.0, burst_seconds(4)),
    ]
    assert pair(heard, pushed, [10.5, 12.5, 13.5, 14.5]) == [0, 2, 3, 4]
    assert pair(heard[:1], pushed, [9.0]) == [None]

"""livekit-agents' avatar I/O (``livekit.agents.voice.avatar``) where this project needs what the library keeps
private: the one module that touches those names. The service's room output (``serving.rooms``) and the agent's side
(``integrations.livekit_avatar``, ``integrations.livekit_compat``) use the names here instead.

- **Names of the protocol.** ``RPC_CLEAR_BUFFER``, ``RPC_PLAYBACK_FINISHED``, ``RPC_PLAYBACK_STARTED``: the avatar
  protocol's RPC methods, defined in ``_datastream_io`` only.
- **State read.** ``pending_playback_count`` (``AudioOutput._pending_playback_count``: segments captured and not yet
  answered), ``remote_participant`` and ``open_stream`` (a ``DataStreamAudioReceiver``'s ``_remote_participant``,
  ``_current_reader`` and ``_stream_readers``), the runner's receiver and generator (``AvatarRunner._audio_recv``,
  ``_video_gen``), and the agent output's room, destination, start, pushed seconds, clear timeout and tasks
  (``DataStreamAudioOutput._room``, ``_destination_identity``, ``_started``, ``_pushed_duration``,
  ``_clear_buffer_timeout``, ``_tasks``); ``allow_pause`` sets an output's ``_capabilities``;
  ``CLEARS_IN_TURN`` says whether the release's output has 1.8.9's clear rules (``_finish_cancelled_capture``).
- **Hooks overridden.** ``RoomAudioReceiver`` (``DataStreamAudioReceiver._register_clear_buffer_rpc``,
  ``_iter_reader``, ``_stream_readers``), ``PlaybackRpcsOnItsRoom`` (``DataStreamAudioOutput
  ._register_playback_finished_rpc`` and ``_register_playback_started_rpc``), ``ClearHookRunner``
  (``AvatarRunner._on_clear_buffer`` and ``_audio_playing``).

Checked against livekit-agents 1.8.9 with livekit (rtc) 1.1.21, the releases constraints-integrations.txt pins
(pyproject.toml's ``livekit`` extra allows ``livekit-agents>=1.8,<1.9``). The notes of ``integrations.livekit_compat``
describe 2.0.0b1, for which ``ClearsInTurn`` exists; that release is not installed here to check these names against.

What breaks if upstream changes them: a moved constant, or a renamed attribute read here, fails at once (ImportError,
AttributeError) where a room is served or the agent starts its avatar. A renamed hook fails quietly, each in its way:
``_register_clear_buffer_rpc`` and the playback ones: the library's table of handlers per process is used again, so
two rooms of one process whose avatars (or agents) share an identity answer each other's RPCs
(``tests/integrations/test_livekit_streams.py``); ``_iter_reader``: a byte stream the receiver stops reading early is
never closed (it stays subscribed to the FFI's events for the life of the process); ``_stream_readers``: a clear that
drops a whole segment before any of it was read goes unanswered and the agent waits for its timeout;
``_on_clear_buffer`` or ``_audio_playing``: the in-process runner no longer answers such a clear either. The tests of
``tests/integrations`` exercise each.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from livekit import rtc
from livekit.agents.voice.avatar import (
    AudioReceiver,
    AvatarRunner,
    DataStreamAudioOutput,
    DataStreamAudioReceiver,
    VideoGenerator,
    _datastream_io,
)
from livekit.agents.voice.io import AudioOutput, AudioOutputCapabilities

RPC_CLEAR_BUFFER: str = _datastream_io.RPC_CLEAR_BUFFER
RPC_PLAYBACK_FINISHED: str = _datastream_io.RPC_PLAYBACK_FINISHED
RPC_PLAYBACK_STARTED: str = _datastream_io.RPC_PLAYBACK_STARTED
CLEARS_IN_TURN: bool = hasattr(DataStreamAudioOutput, "_finish_cancelled_capture")
"""The release's ``DataStreamAudioOutput`` has livekit-agents 1.8.9's clear rules (``integrations.livekit_compat``)."""


# -- state read (and the one setting written) ------------------------------------------------------------------------


def pending_playback_count(output: AudioOutput) -> int:
    """Segments ``output`` captured that have had no ``playback_finished`` yet."""
    return output._pending_playback_count


def remote_participant(receiver: object) -> rtc.RemoteParticipant | None:
    """The agent a ``DataStreamAudioReceiver`` takes audio from, once it has joined (None before, or for another
    receiver)."""
    return getattr(receiver, "_remote_participant", None)


def open_stream(receiver: DataStreamAudioReceiver) -> rtc.ByteStreamReader | None:
    """The byte stream ``receiver`` is reading, else the oldest one waiting to be read, else None."""
    return receiver._current_reader or (receiver._stream_readers[0] if receiver._stream_readers else None)


def runner_parts(runner: AvatarRunner) -> tuple[AudioReceiver, VideoGenerator]:
    """The audio receiver and the video generator ``runner`` was made with."""
    return runner._audio_recv, runner._video_gen


def output_room(output: DataStreamAudioOutput) -> tuple[rtc.Room, str]:
    """The room of an agent's data-stream output, and the identity of the avatar it sends to."""
    return output._room, output._destination_identity


def output_started(output: DataStreamAudioOutput) -> bool:
    """The avatar has joined and the output sends to it."""
    return output._started


def pushed_duration(output: DataStreamAudioOutput) -> float:
    """Seconds of audio the output sent in its current segment."""
    return output._pushed_duration


def clear_buffer_timeout(output: DataStreamAudioOutput) -> float | None:
    """Seconds the output waits for the answer to a clear before it finishes the segments itself (None: never)."""
    return output._clear_buffer_timeout


def keep_task(output: DataStreamAudioOutput, task: asyncio.Task[Any]) -> None:
    """Hold ``task`` among the output's own tasks until it is done (as the output holds its RPCs)."""
    output._tasks.add(task)
    task.add_done_callback(output._tasks.discard)


def allow_pause(output: AudioOutput) -> None:
    """Say ``output`` can pause (``can_pause``): the stock data-stream output says it cannot."""
    output._capabilities = AudioOutputCapabilities(pause=True)


# -- hooks overridden --------------------------------------------------------------------------------------------------


class RoomAudioReceiver(DataStreamAudioReceiver):
    """``DataStreamAudioReceiver`` whose ``lk.clear_buffer`` handler belongs to its own room, which lets go of every
    byte stream it stops reading, and counts the byte streams it takes.

    The stock receiver (livekit-agents 1.8 and 2.0.0b1 alike) ends a segment when its stream's trailer comes, when a
    newer stream arrives while it is open (the trailer was lost), when a clear discards it, or after
    ``STREAM_IDLE_TIMEOUT`` (10 s) with no chunk (``_iter_reader``). It keeps its clear handlers in one table per
    process, by the agent's identity: two rooms of one worker whose agents share an identity would answer each other's
    clears, so each receiver here registers its handler on its own room's participant. A stream it ends early stays
    subscribed to the FFI's events for the life of the process (its reader is never closed): here it is closed. The
    count (``streams_taken``) lets a clear that drops a whole segment before any of it was read still answer it."""

    def _register_clear_buffer_rpc(
        self, room: rtc.Room, *, caller_identity: str, handler: Callable[[rtc.RpcInvocationData], str]
    ) -> None:
        room.local_participant.register_rpc_method(RPC_CLEAR_BUFFER, handler)

    def __init__(self, room: rtc.Room, *, frame_size_ms: int) -> None:
        super().__init__(room, frame_size_ms=frame_size_ms)
        self._stream_readers = _Counted()

    async def _iter_reader(self, reader: rtc.ByteStreamReader) -> AsyncIterator[bytes]:
        try:
            async for chunk in super()._iter_reader(reader):
                yield chunk
        finally:
            reader.close()  # a no-op once its trailer was read

    def streams_taken(self) -> int:
        """Byte streams (agent segments) this receiver has begun to read or read whole."""
        return self._stream_readers.appended - len(self._stream_readers)


class _Counted(list):
    """A list that counts what was ever appended to it (the receiver's queue of byte streams)."""

    appended = 0

    def append(self, item: Any) -> None:
        self.appended += 1
        super().append(item)


class PlaybackRpcsOnItsRoom:
    """For a ``DataStreamAudioOutput`` (put it first among the bases): the avatar's playback RPCs reach the output of
    their own room. The stock output keeps their handlers in one table per process by the avatar's identity, so two
    rooms of one agent process with avatars of one name answered each other."""

    def _register_playback_finished_rpc(
        self, room: rtc.Room, *, caller_identity: str, handler: Callable[[rtc.RpcInvocationData], str]
    ) -> None:
        room.local_participant.register_rpc_method(RPC_PLAYBACK_FINISHED, handler)

    def _register_playback_started_rpc(
        self, room: rtc.Room, *, caller_identity: str, handler: Callable[[rtc.RpcInvocationData], str]
    ) -> None:
        room.local_participant.register_rpc_method(RPC_PLAYBACK_STARTED, handler)


class ClearHookRunner(AvatarRunner):
    """``AvatarRunner`` with a say in each clear: where ``answers_clear`` is True the runner answers the clear with
    ``playback_finished(interrupted=True)``, as it does on its own only once it has read a frame of the segment."""

    def _on_clear_buffer(self) -> None:
        if self.answers_clear(self._audio_playing):
            self._audio_playing = True
        super()._on_clear_buffer()

    def answers_clear(self, audio_playing: bool) -> bool:
        """Whether the clear now coming is answered; ``audio_playing``: the runner has read a frame of the segment (its
        own rule)."""
        return audio_playing

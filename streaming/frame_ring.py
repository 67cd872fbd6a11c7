"""One session's encoder input in shared memory: a ring of slots, each an I420 picture and its 48 kHz audio.

The engine core writes frame ``i`` into slot ``i % slots`` (the GPU copies the converted picture
straight into it) and then tells the session's output worker, which copies the slot out at once.
Each slot starts with the index of the frame it holds; the writer sets it to -1 before it
overwrites the slot and to the frame's index once the slot is complete, and the reader checks
it before and after its copy, so a reader that fell a whole ring behind gets None, never a torn
picture. A render job's reader, which must see every frame, also marks each slot released once it has written the
frame out (the header's second int64), and its writer fills a slot only when it is ``free``: the ring is then the
job's backpressure, bounded in memory however far the GPU runs ahead of the encoder.

Before the first frame the writer may put a still picture (the avatar's portrait) under the index ``STILL``: its slot
is frame ``slots - 2``'s, long before that frame is made, so a reader that takes it when the ring is announced gets it
(and None once that frame has replaced it). Only plain bytes cross: no pickle, no Python objects.

The writer creates the block under a name in /dev/shm; its reader opens it by that name and removes the name at once
(both mappings stay), so once the reader is attached no end of either process, not even a kill of both, leaves the
block behind. The writer removes the name of a block no reader attached.
"""

from __future__ import annotations

from multiprocessing import resource_tracker, shared_memory

import numpy as np

from streaming.frames import AUDIO_SAMPLES_PER_FRAME, check_size

HEADER_BYTES = 64
"""The frame index (int64) at the slot's start, then the index its reader released, padded so the picture starts
cache-line aligned."""
AUDIO_BYTES = AUDIO_SAMPLES_PER_FRAME * 4
RING_SLOTS = 50
"""Two seconds of frames: far more than a worker ever lags when it keeps up at all."""
EMPTY = -1
STILL = -2
"""The index of the still picture a preview shows before the session's first frame."""


def i420_bytes(width: int, height: int) -> int:
    """Bytes of one 4:2:0 picture."""
    return width * height * 3 // 2


class FrameRing:
    """``slots`` frames of ``width`` x ``height`` in the shared-memory block ``name`` (created by the writer)."""

    def __init__(
        self, name: str | None, width: int, height: int, slots: int = RING_SLOTS, create: bool = False
    ) -> None:
        check_size(width, height)
        self.width, self.height, self.slots = width, height, slots
        self.picture_bytes = i420_bytes(width, height)
        self.slot_bytes = -(-(HEADER_BYTES + self.picture_bytes + AUDIO_BYTES) // 64) * 64
        size = self.slot_bytes * slots
        self._shm = shared_memory.SharedMemory(name=name, create=create, size=size if create else 0)
        if not create:
            if self._shm.size < size:
                resource_tracker.unregister(self._shm._name, "shared_memory")  # the writer's block, not this reader's
                self._shm.close()
                raise ValueError(f"shared memory {name!r} holds {self._shm.size} bytes, {size} expected")
            self._shm.unlink()  # attached: the name goes now (the block lives on while either process maps it)
        self.owner = create
        self.buffer = np.ndarray((slots, self.slot_bytes), np.uint8, self._shm.buf)
        self._index = np.ndarray((slots,), np.int64, self._shm.buf, strides=(self.slot_bytes,))
        self._released = np.ndarray((slots,), np.int64, self._shm.buf, offset=8, strides=(self.slot_bytes,))
        if create:
            self._index[:] = EMPTY
            self._released[:] = EMPTY

    @property
    def name(self) -> str:
        """The shared-memory block's name (what a reader opens)."""
        return self._shm.name

    def slot(self, index: int) -> int:
        return index % self.slots

    def picture(self, slot: int) -> np.ndarray:
        """Slot ``slot``'s picture as a writable (H * 3/2, W) view."""
        start = HEADER_BYTES
        return self.buffer[slot, start : start + self.picture_bytes].reshape(self.height * 3 // 2, self.width)

    def audio(self, slot: int) -> np.ndarray:
        """Slot ``slot``'s audio as a writable float32 view of AUDIO_SAMPLES_PER_FRAME samples."""
        start = HEADER_BYTES + self.picture_bytes
        return self.buffer[slot, start : start + AUDIO_BYTES].view(np.float32)

    def begin(self, index: int) -> int:
        """Mark frame ``index``'s slot as being written; returns the slot."""
        slot = self.slot(index)
        self._index[slot] = EMPTY
        return slot

    def commit(self, index: int) -> None:
        """Frame ``index``'s slot is complete."""
        self._index[self.slot(index)] = index

    def write(self, index: int, picture: np.ndarray, audio: np.ndarray) -> None:
        """Write frame ``index`` from host arrays (the CPU path; on CUDA the core copies into ``picture`` itself)."""
        slot = self.begin(index)
        self.picture(slot)[:] = picture
        self.audio(slot)[:] = audio
        self.commit(index)

    def read(self, index: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Copies of frame ``index``'s picture and audio, or None when its slot holds another frame (overwritten or not
        yet written)."""
        slot = self.slot(index)
        if self._index[slot] != index:
            return None
        picture, audio = self.picture(slot).copy(), self.audio(slot).copy()
        if self._index[slot] != index:
            return None
        return picture, audio

    def release(self, index: int) -> None:
        """The reader is done with frame ``index``: its slot may take the frame a ring later (``free``)."""
        self._released[self.slot(index)] = index

    def released(self, index: int) -> bool:
        """Whether the reader has released frame ``index`` (a render job's writer ends once its last frame is)."""
        return int(self._released[self.slot(index)]) == index

    def free(self, index: int) -> bool:
        """Whether frame ``index`` may be written without overwriting a frame its reader has not released."""
        slot = self.slot(index)
        held = int(self._index[slot])
        return held < 0 or held == index or int(self._released[slot]) == held

    def close(self) -> None:
        """Detach (and, for the writer, remove the block)."""
        self.buffer = self._index = self._released = None
        self._shm.close()
        if self.owner:
            try:
                self._shm.unlink()
            except FileNotFoundError:  # its reader attached and removed the name
                resource_tracker.unregister(self._shm._name, "shared_memory")

"""When an encoder's own CUDA stream may read a frame: after the frame's event, not after all queued work.

The runtime's loop and every output thread share the legacy default stream, so waiting on "the
current stream" from an output thread waits for whatever the loop has queued since: the next
hop's sampling and rendering, tens of milliseconds. A runtime frame carries the event recorded
when its image was finished; an encoder that waits on that alone converts and copies at once.
"""

from __future__ import annotations

import torch


def order_after(stream: torch.cuda.Stream, ready: torch.cuda.Event | None) -> None:
    """Make ``stream``'s next work wait for ``ready`` (the image's event), or, without one, for all the work
    queued so far on the calling thread's current stream (always correct, possibly slow)."""
    if ready is not None:
        stream.wait_event(ready)
    else:
        stream.wait_stream(torch.cuda.current_stream(stream.device))

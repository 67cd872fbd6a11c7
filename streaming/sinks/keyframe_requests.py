"""A browser's keyframe requests (RTCP PLI and FIR) from an aiortc sender to our own callback: the one place that
touches aiortc's private names.

aiortc answers a PLI or FIR by asking its own encoder for a keyframe, through ``RTCRtpSender._send_keyframe`` (called
from ``RTCRtpSender._handle_rtcp_packet``). The preview sends packets encoded once for every viewer
(``streaming.sinks.webrtc``), so aiortc's encoder is never used: the request has to reach the shared encoder instead,
and aiortc has no public hook for it. ``route_keyframe_requests`` replaces that method on one sender.

Checked against aiortc 1.16.0 (pinned in constraints.txt and constraints-integrations.txt; pyproject.toml allows
``aiortc>=1.9``). If a release renames ``_send_keyframe`` or stops calling it for PLI/FIR, nothing fails at once:
a viewer that lost a picture is no longer sent an IDR when its browser asks and shows a broken picture until the
next one. ``route_keyframe_requests`` logs a warning when the method is gone, and
``tests/streaming/sinks/test_webrtc.py::test_browser_pli_reaches_the_shared_encoder`` fails when the route no longer
carries a PLI.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiortc import RTCRtpSender

log = logging.getLogger(__name__)
_warned = False


def route_keyframe_requests(sender: RTCRtpSender, request_keyframe: Callable[[], None]) -> None:
    """Call ``request_keyframe()`` for each PLI or FIR the remote side sends ``sender`` (instead of aiortc's own
    keyframe request, which only reaches an encoder of aiortc's)."""
    global _warned
    if not callable(getattr(sender, "_send_keyframe", None)) and not _warned:
        _warned = True
        log.warning(
            "aiortc's RTCRtpSender has no _send_keyframe: a browser's PLI/FIR may no longer reach the encoder "
            "(streaming.sinks.keyframe_requests was checked against aiortc 1.16.0)"
        )
    sender._send_keyframe = request_keyframe

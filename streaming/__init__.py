"""Audio in, encoded video and audio out: encoders and sinks (MP4 file; RTMP and WebRTC later)."""

from streaming.mp4 import Mp4Writer

__all__ = ["Mp4Writer"]

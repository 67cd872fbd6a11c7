"""The media library: encoders (x264, NVENC, Opus/AAC), sinks (RTMP, WebRTC, MP4), audio sources, the output clock.

Nothing is imported here: import from the submodules, each of which pulls in only what it needs
(the WebRTC preview needs aiortc, an MP4 file does not). The service's processes are ``serving``.
"""

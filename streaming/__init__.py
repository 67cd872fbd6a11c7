"""Live output: encoders (x264, NVENC, Opus/AAC), sinks (RTMP, WebRTC, MP4), audio sources and the server.

Nothing is imported here: import from the submodules, each of which pulls in only what it needs
(the server needs aiohttp and aiortc, an MP4 file needs neither).
"""

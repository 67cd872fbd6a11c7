"""Live output: encoders (x264, NVENC, Opus/AAC), sinks (RTMP, WebRTC, MP4), audio sources and the server.

Kept free of imports so that a light module (a source, the push protocol) can be loaded
without pulling in torch or aiortc; import from the submodules.
"""

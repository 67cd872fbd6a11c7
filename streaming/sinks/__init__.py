"""Where encoded frames go: RTMP, the WebRTC preview, MP4 files."""

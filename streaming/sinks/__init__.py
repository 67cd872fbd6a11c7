"""Where encoded frames go: RTMP, the WebRTC preview, MP4 files, a LiveKit room's tracks; and the one adapter each
to the private names of aiortc (``keyframe_requests``) and livekit-agents (``livekit_avatar_io``) they need."""

"""Where a session's audio comes from: a file in real time, a microphone, a WebSocket push."""

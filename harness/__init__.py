"""The live-output harness, shared by the benchmarks and the tests: a real nginx-rtmp, a TTS-like pusher, RTMP readers,
headless WebRTC viewers (Chromium, aiortc), audible timing markers, the server as a child process watched through
/metrics, a pipecat bot process that measures itself, and the reference checkout for side-by-side runs."""

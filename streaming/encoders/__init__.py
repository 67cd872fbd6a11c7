"""H.264 encoders (libx264 via PyAV, NVENC via PyNvVideoCodec), colour conversion and audio codecs."""

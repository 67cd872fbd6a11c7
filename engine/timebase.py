"""The engine's one timebase: frame rate, the model's audio rate, the hop, the motion window, the sampler's steps.

Everything that counts frames or samples imports these names from here; nothing defines them again.
"""

FPS = 25
"""Video frames per second: Ditto's motion is trained at 25 fps, so every output runs on this clock."""
SAMPLE_RATE = 16_000
"""The audio encoders' sample rate (HuBERT): all input audio is resampled to it once, on the way in."""
SAMPLES_PER_FRAME = SAMPLE_RATE // FPS
"""640: the model's audio samples that one video frame speaks."""
HOP_FRAMES = 5
"""Frames of new audio per encoder hop in the faithful mode (200 ms): the reference's streaming chunk."""
SEQ_FRAMES = 80
"""Frames in one motion-diffusion window (LMDM): the length the network was trained on."""
OFFLINE_OVERLAP = 10
"""Frames shared by consecutive windows in a file render (the reference's offline mode)."""
DEFAULT_STEPS = 25
"""DDIM steps per window unless asked otherwise (the reference's own default is 50; ``bench.steps`` compares the
two)."""
MIN_INPUT_RATE = 8_000
"""The lowest sample rate accepted from a client or a file (telephone audio)."""
MAX_INPUT_RATE = 192_000
"""The highest sample rate accepted from a client or a file."""

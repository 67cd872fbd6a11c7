# Sourced by the bench/gpu_*.sh scripts on the lent GPU: carried wheels on the path, caches, $out, the newsroom clip.
out=${OUT:-/tmp/out}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
fi
export DITTO_CACHE_DIR=/tmp/ditto-cache PYTHONUNBUFFERED=1
# Bytecode kept: the lent machine sets PYTHONDONTWRITEBYTECODE, so every process compiled torch's sources again (4 s
# more per start, 2026-12-02), where an installed torch keeps its bytecode. The first process fills /tmp/pycache.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/pycache
since() { python3 -c "print(round($EPOCHREALTIME - $1, 2))"; }
# The newsroom clip: the bundled speech looped to 7.84 s, as /tmp/newsroom.wav.
newsroom_clip() {
    python3 - <<'PY'
import numpy as np, wave
from engine.assets import demo_audio
audio, rate = demo_audio()
clip = np.concatenate([audio] * 3)[: int(7.84 * rate)]
with wave.open("/tmp/newsroom.wav", "wb") as w:
    w.setnchannels(1); w.setsampwidth(2); w.setframerate(rate)
    w.writeframes((np.clip(clip, -1, 1) * 32767).astype(np.int16).tobytes())
PY
}

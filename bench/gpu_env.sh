# Sourced by the bench/gpu_*.sh scripts on the lent GPU: carried wheels on the path, caches, $out, the newsroom clip.
out=${OUT:-/tmp/out}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
# Or all of them at once (bash bench/voice_bundle.sh): the wheels unpacked, with .carry/glass and the demo avatar.
if [[ -e .carry/voice/site.tar.xz ]]; then
    mkdir -p /tmp/site && tar -C /tmp/site -xJf .carry/voice/site.tar.xz && tar -xJf .carry/voice/tree.tar.xz || exit 1
fi
# A later call on the same warm machine may come without .whl (a path not named in carry is gone there): what an
# earlier call installed stays in /tmp/site.
[[ -d /tmp/site ]] && export PYTHONPATH=/tmp/site:$PWD
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
# The torch backend's compiled packages in $plans (random weights, 6 build processes): whether they are there, and
# building them (log to $out/aot_build.log). The scripts that call them set $plans first.
has_plans() { compgen -G "$plans/torch-aot-*/manifest.json" >/dev/null; }
build() {
    echo "building the packages into $plans (6 processes)"
    python3 -c "from engine.engine import random_checkpoints; random_checkpoints()"
    python3 -m compile.build_plans --checkpoints "$DITTO_CACHE_DIR/random-weights-seed0" --random-weights --aot only \
        --aot-jobs 6 --out "$plans" >"$out/aot_build.log" 2>&1
    local rc=$?
    tail -c 400 "$out/aot_build.log"
    echo "build: rc $rc after $SECONDS s"
    return $rc
}

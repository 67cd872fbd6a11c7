#!/usr/bin/env bash
# Start-up with the torch backend's compiled packages (docs/startup.md) on the lent GPU, in one call of under 10 min
# (carry .whl, .carry/glass and .carry/avatars in every call, or the avatar is not there):
#   bash bench/gpu_startup.sh all AVATAR      build the packages (6 processes), then measure
#   bash bench/gpu_startup.sh build [ARGS]    only build them in the background; ARGS go to compile.build_plans
#   bash bench/gpu_startup.sh follow [SECS]   the build's progress; returns once it is done or after SECS (540)
#   bash bench/gpu_startup.sh measure AVATAR  two starts phase by phase (bench.start_phases --profile: the first fills
#                                             the bytecode cache), a bench.runtime start, the newsroom clip, and
#                                             streaming.serve's first RTMP picture (bench.glass_to_glass)
# Logs and results go to /tmp/startup-runs, packed into $OUT/startup_<mode>.tgz at the end (the device returns at
# most 8 files); the packages to /tmp/plans (kept while the machine stays warm).
set -uo pipefail
source bench/gpu_env.sh
plans=/tmp/plans
runs=/tmp/startup-runs
mkdir -p "$runs" /var/log/nginx  # the bundled nginx opens its compiled-in log folder at start
checkpoints=$DITTO_CACHE_DIR/random-weights-seed0
mode=${1:?all, build, follow or measure}

build() {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$runs/gpu.txt"
    python3 -c "from engine.engine import random_checkpoints; random_checkpoints()"
    nohup python3 -m compile.build_plans --checkpoints "$checkpoints" --random-weights --aot only --out "$plans" "$@" \
        >"$runs/aot_build.log" 2>&1 &
    echo $! >/tmp/aot_build.pid
}

follow() {
    until ((SECONDS >= $1)); do kill -0 "$(cat /tmp/aot_build.pid)" 2>/dev/null || break; sleep 5; done
    tail -c 600 "$runs/aot_build.log"
    cp "$plans"/torch-aot-*/manifest.json "$runs/aot_manifest.json" 2>/dev/null
}

measure() {
    local avatar=$1 start rc
    for i in 1 2; do
        python3 -m bench.start_phases --plans "$plans" --out "$runs/start_phases_$i.json" \
            --profile "$runs/start_profile_$i.txt" >"$runs/start_phases_$i.log" 2>&1
        grep -A12 "| phase" "$runs/start_phases_$i.log"
    done
    start=$EPOCHREALTIME
    python3 -m bench.runtime --avatar "$avatar" --start-only --plans "$plans" --out "$runs/start_packages.json" \
        >"$runs/start_packages.log" 2>&1
    echo "bench.runtime --start-only, process start to exit: $(since "$start") s" | tee -a "$runs/startup.txt"
    newsroom_clip
    start=$EPOCHREALTIME
    python3 -m apps.render --avatar "$avatar" --audio /tmp/newsroom.wav --plans "$plans" --out /tmp/newsroom.mp4 \
        >"$runs/newsroom.log" 2>&1
    rc=$?
    echo "newsroom 7.84 s clip, process start to MP4: $(since "$start") s (rc $rc)" | tee -a "$runs/startup.txt"
    timeout $((585 - SECONDS)) python3 -m bench.glass_to_glass --avatar "$avatar" --viewer aiortc --utterances 10 \
        --plans "$plans" --out "$runs/glass.json" >"$runs/glass.log" 2>&1
    grep "start:" "$runs/glass.log" | tee -a "$runs/startup.txt"
}

case $mode in
all) build --aot-jobs 6; follow 300; measure "${2:?cached avatar folder}" ;;
build) build "${@:2}"; sleep 30; tail -c 600 "$runs/aot_build.log" ;;
follow) follow "${2:-540}" ;;
measure) measure "${2:?cached avatar folder}" ;;
*) echo "unknown mode $mode: all, build, follow or measure" >&2; exit 2 ;;
esac
tar czf "$out/startup_$mode.tgz" -C /tmp startup-runs

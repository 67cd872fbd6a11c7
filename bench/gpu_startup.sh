#!/usr/bin/env bash
# Start-up with the torch backend's compiled packages (docs/startup.md) on the lent GPU, in one call of under 10 min
# (carry .whl, .carry/glass and .carry/avatars in every call, or the avatar is not there):
#   bash bench/gpu_startup.sh all AVATAR      build the packages (6 processes), then measure
#   bash bench/gpu_startup.sh build [ARGS]    only build them in the background; ARGS go to compile.build_plans
#   bash bench/gpu_startup.sh follow [SECS]   the build's progress; returns once it is done or after SECS (540)
#   bash bench/gpu_startup.sh measure AVATAR  three starts phase by phase (bench.start_phases: the first fills the
#                                             bytecode cache, the third is profiled), the newsroom clip three times
#                                             (the same; the third under cProfile), and two starts of serve --demo
#                                             to its first RTMP picture (bench.serve_start)
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
    # The demo avatar as serve --demo's first start leaves it in the engine's cache (registering needs mediapipe,
    # which the GPU image lacks), so serve_start times the later starts a user sees.
    mkdir -p "$DITTO_CACHE_DIR/demo-avatar" && rm -rf "$DITTO_CACHE_DIR/demo-avatar/demo" && cp -r "$avatar" "$DITTO_CACHE_DIR/demo-avatar/demo"
    for i in 1 2 3; do  # 1 fills the bytecode cache; 2 is the representative start; 3 is profiled
        python3 -m bench.start_phases --plans "$plans" --out "$runs/start_phases_$i.json" \
            $( ((i == 3)) && echo --profile "$runs/start_profile_$i.txt") >"$runs/start_phases_$i.log" 2>&1
        grep -A12 "| phase" "$runs/start_phases_$i.log"
    done
    newsroom_clip
    for i in 1 2 3; do  # 1 fills the bytecode cache of the render's own modules; 2 is representative; 3 under cProfile
        start=$EPOCHREALTIME
        python3 $( ((i == 3)) && echo -m cProfile -o "$runs/newsroom.prof") -m apps.render --avatar "$avatar" \
            --audio /tmp/newsroom.wav --plans "$plans" --out /tmp/newsroom.mp4 >"$runs/newsroom_$i.log" 2>&1
        rc=$?
        echo "newsroom 7.84 s clip ($i), process start to MP4: $(since "$start") s (rc $rc)" | tee -a "$runs/startup.txt"
        grep -A1 "^wrote" "$runs/newsroom_$i.log" | tee -a "$runs/startup.txt"
    done
    python3 -c "import pstats; pstats.Stats('$runs/newsroom.prof').sort_stats('tottime').print_stats(60)" \
        >"$runs/newsroom_profile.txt" 2>&1
    python3 -X importtime -c "import apps.render" 2>"$runs/newsroom_importtime.txt"
    timeout $((585 - SECONDS)) python3 -m bench.serve_start --demo --plans "$plans" --starts 2 --out "$runs/serve_start.json" \
        >"$runs/serve_start.log" 2>&1
    grep "^start " "$runs/serve_start.log" | tee -a "$runs/startup.txt"
}

case $mode in
all) build --aot-jobs 6; follow 300; measure "${2:?cached avatar folder}" ;;
build) build "${@:2}"; sleep 30; tail -c 600 "$runs/aot_build.log" ;;
follow) follow "${2:-540}" ;;
measure) measure "${2:?cached avatar folder}" ;;
*) echo "unknown mode $mode: all, build, follow or measure" >&2; exit 2 ;;
esac
tar czf "$out/startup_$mode.tgz" -C /tmp startup-runs

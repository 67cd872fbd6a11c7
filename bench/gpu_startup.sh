#!/usr/bin/env bash
# Start-up with the torch backend's compiled packages (docs/startup.md), in calls on the lent GPU that chain:
#   bash bench/gpu_startup.sh build [ARGS]    compile the packages for this GPU in the background (minutes); ARGS go
#                                             to compile.build_plans (--aot-jobs N)
#   bash bench/gpu_startup.sh follow [SECS]   the build's progress; returns once it is done or after SECS (540)
#   bash bench/gpu_startup.sh measure AVATAR  a start with the packages phase by phase (bench.start_phases), a
#                                             second start, the live curve with them, the newsroom clip with them
# Results and logs under $OUT; the packages under /tmp/plans (kept while the machine stays warm).
set -uo pipefail
source bench/gpu_env.sh
plans=/tmp/plans
checkpoints=$DITTO_CACHE_DIR/random-weights-seed0
case "${1:?build, follow or measure}" in
build)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
    nohup python3 -m compile.build_plans --checkpoints "$checkpoints" --random-weights --aot only --out "$plans" "${@:2}" \
        > /tmp/aot_build.log 2>&1 &
    echo $! > /tmp/aot_build.pid
    sleep 60; tail -c 2000 /tmp/aot_build.log ;;
follow)
    until ((SECONDS >= ${2:-540})); do kill -0 "$(cat /tmp/aot_build.pid)" 2>/dev/null || break; sleep 5; done
    tail -c 4000 /tmp/aot_build.log | tee "$out/aot_build.log"
    cp "$plans"/torch-aot-*/manifest.json "$out/aot_manifest.json" 2>/dev/null ;;
measure)
    avatar=${2:?cached avatar folder}
    python3 -m bench.start_phases --plans "$plans" --out "$out/start_phases.json" --profile "$out/start_profile.txt" \
        >"$out/start_phases.log" 2>&1
    grep -v "warming up" "$out/start_phases.log" | tail -12
    start=$EPOCHREALTIME
    python3 -m bench.runtime --avatar "$avatar" --start-only --plans "$plans" --out "$out/start_packages.json" \
        >"$out/start_packages.log" 2>&1
    echo "process start to warmed runtime with packages (bench.runtime): $(since "$start") s" | tee -a "$out/startup.txt"
    python3 -m bench.runtime --avatar "$avatar" --live-only --sessions 12 16 --seconds 15 --plans "$plans" \
        --out "$out/runtime_packages.json" >"$out/runtime_packages.log" 2>&1
    tail -6 "$out/runtime_packages.log"
    newsroom_clip
    start=$EPOCHREALTIME
    python3 -m apps.render --avatar "$avatar" --audio /tmp/newsroom.wav --plans "$plans" --out "$out/newsroom.mp4" \
        >"$out/newsroom.log" 2>&1
    rc=$?
    echo "newsroom 7.84 s clip, process start to MP4 with packages: $(since "$start") s (rc $rc)" | tee -a "$out/startup.txt"
    cat "$out/startup.txt" ;;
esac

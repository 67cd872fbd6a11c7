#!/usr/bin/env bash
# Issue 37 on the lent GPU: pipecat bots in processes of their own against one apps.serve (bench.agents), on the torch
# backend's compiled packages. Calls on the same warm machine, one after the other (the streaming wheels and pipecat's
# do not fit in one call's 64 MiB together); `prepare` may be skipped where an earlier call (bench/gpu_cluster.sh
# single) left /tmp/site and /tmp/plans:
#   bash bench/gpu_agents.sh prepare         carry .whl, .carry/avatars/demo: the streaming wheels into /tmp/site, the
#                                            avatar into /tmp/avatars/demo, the packages built into /tmp/plans unless
#                                            they are there (6 processes)
#   bash bench/gpu_agents.sh glass           carry .carry/glass: bench.glass_to_glass, the service's own WebRTC latency
#                                            (20 utterances), kept in /tmp for the run call to compare with
#   bash bench/gpu_agents.sh voice [MINUTES] carry .carry/voice (bash bench/voice_bundle.sh): issue 52 in one call on
#                                            a fresh machine: the packages built, bench.glass_to_glass faithful then
#                                            low (10 utterances each), then bench.agents: 12 bots faithful, then 12
#                                            bots low, MINUTES (default 1) each, every phase with its witness viewer,
#                                            --glass both
#   bash bench/gpu_agents.sh run [MINUTES]   carry .carry/agents (bash bench/agents_bundle.sh), .carry/glass: pipecat's
#                                            wheels into /tmp/site, then bench.agents (--glass with the glass call's
#                                            result): 12 bots, then 6 bots + 6 RTMP streams, MINUTES (default 2)
#                                            each, then 12 bots with interruptions every ~6 s for 1 minute when that
#                                            still fits
# Carry .carry/avatars/demo too in any call where /tmp/avatars/demo is not there yet. Each call ends within 9.5 minutes
# (give it timeout_s 600); `glass` and `run` build the packages first when they are missing and then say to call them
# again. Results go to $OUT as they come: agents.json (after each phase), its .serve.log and .log, glass_to_glass.json
# and .log, aot_build.log, gpu.txt, versions.txt.
set -uo pipefail
mode=${1:?prepare, glass, voice or run}
[[ $mode =~ ^(prepare|glass|voice|run)$ ]] || { echo "unknown mode $mode: prepare, glass, voice or run" >&2; exit 2; }
minutes=${2:-2}
[[ $mode == voice ]] && minutes=${2:-1}
source bench/gpu_env.sh
mkdir -p /var/log/nginx /tmp/site  # the bundled nginx opens its compiled-in log folder at start
plans=/tmp/plans
avatar=/tmp/avatars/demo
limit=570
stop_margin=45  # the benchmark is told to stop this long before the limit, and killed 30 s after that
phase_overhead=50  # seconds beside a phase's minutes: bots start and open, first pictures, reports, RTMP read ends
glass=/tmp/glass_to_glass.json

take_avatar() {
    [[ -e $avatar/manifest.json ]] && return 0
    [[ -e .carry/avatars/demo/manifest.json ]] || { echo "no avatar: carry .carry/avatars/demo" >&2; return 1; }
    mkdir -p "$(dirname "$avatar")" && cp -r .carry/avatars/demo "$avatar"
}

take_pipecat() {
    if [[ ! -d /tmp/site/pipecat ]]; then  # bench/voice_bundle.sh's archive holds it already
        compgen -G ".carry/agents/pipecat_ai-*.whl" >/dev/null || { echo "carry .carry/agents (bench/agents_bundle.sh)" >&2; return 1; }
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .carry/agents/*.whl || return 1
    fi
    python3 - <<'PY' | tee "$out/versions.txt"
import importlib.metadata as metadata
import sys

import harness.pipecat_bot  # noqa: F401  everything a bot imports before its session
import integrations.service_backend  # noqa: F401  and what its session needs

names = ("pipecat-ai", "pydantic", "aiohttp", "typing_extensions", "numpy", "pillow", "av", "aiortc")
print({name: metadata.version(name) for name in names}, "torch imported by a bot:", "torch" in sys.modules)
PY
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
take_avatar || exit 1
case $mode in
prepare)
    [[ -e /tmp/site/av ]] || { echo "the streaming wheels did not install: carry .whl" >&2; exit 1; }
    has_plans || build || exit 1
    python3 -c "import apps.serve, serving.service, engine.engine, bench.agents"  # bytecode for the run call
    echo "prepared after $SECONDS s: now 'bash bench/gpu_agents.sh run'"
    ;;
glass)
    [[ -e /tmp/site/av ]] || { echo "no streaming wheels in /tmp/site: call 'bash bench/gpu_agents.sh prepare' first" >&2; exit 1; }
    if ! has_plans; then
        build || exit 1
        echo "the packages took this call: call 'bash bench/gpu_agents.sh glass' again now"
        exit 0
    fi
    timeout -s INT -k 30 $((limit - SECONDS - 30)) python3 -m bench.glass_to_glass --avatar "$avatar" --plans "$plans" \
        --viewer aiortc --utterances 20 --out "$out/glass_to_glass.json" 2>&1 | grep -v "warming up\|aiohttp.access" \
        | tee "$out/glass_to_glass.log" | tail -20
    cp "$out/glass_to_glass.json" "$glass" 2>/dev/null
    ;;
voice)
    [[ -e /tmp/site/av ]] || { echo "no streaming wheels in /tmp/site: carry .carry/voice (bench/voice_bundle.sh)" >&2; exit 1; }
    take_pipecat || exit 1
    has_plans || build || exit 1
    for latency in faithful low; do
        timeout -s INT -k 20 110 python3 -m bench.glass_to_glass --avatar "$avatar" --plans "$plans" --viewer aiortc \
            --latency $latency --utterances 10 --out "$out/glass_$latency.json" 2>&1 \
            | grep -v "warming up\|aiohttp.access" | tee "$out/glass_$latency.log" | tail -6
    done
    left=$((limit - SECONDS - stop_margin))
    echo "glass done after $SECONDS s; $left s left for the bots"
    timeout -s INT -k 30 "$left" python3 -m bench.agents --avatar "$avatar" --plans "$plans" --bots 12 12 \
        --minutes "$minutes" "$minutes" --latency faithful low --bot-python python3 \
        --glass "$out/glass_faithful.json" "$out/glass_low.json" --out "$out/agents.json" 2>&1 \
        | grep -v "warming up\|aiohttp.access" | tee "$out/agents.log" | tail -30
    echo "agents: rc ${PIPESTATUS[0]} after $SECONDS s of this call"
    ;;
run)
    [[ -e /tmp/site/av ]] || { echo "no streaming wheels in /tmp/site: call 'bash bench/gpu_agents.sh prepare' first" >&2; exit 1; }
    take_pipecat || exit 1
    if ! has_plans; then
        build || exit 1
        echo "the packages took this call: call 'bash bench/gpu_agents.sh run $minutes' again now"
        exit 0
    fi
    compare=()
    [[ -s $glass ]] && compare=(--glass "$glass")
    left=$((limit - SECONDS - stop_margin))
    phases=(--bots 12 6 --rtmp 0 6 --minutes "$minutes" "$minutes" --interrupt-every 0 0)
    need=$((2 * (minutes * 60 + phase_overhead) + 30))
    if ((left >= need + 60 + phase_overhead)); then
        phases=(--bots 12 6 12 --rtmp 0 6 0 --minutes "$minutes" "$minutes" 1 --interrupt-every 0 0 6)
    elif ((left < need)); then
        echo "$left s left of this call, too few for two phases of $minutes min: call 'bash bench/gpu_agents.sh run" \
            "$minutes' again now"
        exit 0
    fi
    # SIGINT at the limit: bench.agents ends its bots, stops the server and nginx, and keeps the phases it finished.
    timeout -s INT -k 30 "$left" python3 -m bench.agents --avatar "$avatar" --plans "$plans" "${phases[@]}" \
        --bot-python python3 "${compare[@]}" --out "$out/agents.json" 2>&1 | grep -v "warming up\|aiohttp.access" \
        | tee "$out/agents.log" | tail -30
    echo "agents: rc ${PIPESTATUS[0]} after $SECONDS s of this call"
    ;;
esac

#!/usr/bin/env bash
# Issue 45 on the lent GPU: N streams (default 12) through apps.serve alone, then through apps.serve --ray (one GPU,
# one replica), both on the torch backend's compiled packages, every stream read back over RTMP by bench.service.
# Two calls, the second straight after the first on the same warm machine (it uses the first's /tmp/site,
# /tmp/plans and /tmp/cluster-avatar: Ray and the streaming wheels do not fit in one call's 64 MiB together):
#   bash bench/gpu_cluster.sh single [MINUTES [N]]  carry .whl, .carry/glass, .carry/avatars: the streaming wheels
#                                                   into /tmp/site, the packages built into /tmp/plans unless they
#                                                   are there (6 processes), then bench.service on apps.serve alone
#   bash bench/gpu_cluster.sh ray [MINUTES [N]]     carry .carry/ray, .carry/glass (bash bench/ray_bundle.sh):
#                                                   Ray and Serve's dependencies into /tmp/site, then bench.service
#                                                   --ray on the same packages
# MINUTES (default 3) of N streams; give both calls the same. Each call ends within 9.5 minutes (give it timeout_s
# 600): when the build leaves too little time, `single` stops after it and says to call it again. Results go to
# $OUT as they come: service_MODE.json (after the phase), its .serve.log (the server's or the cluster's output) and
# .log (the benchmark's), aot_build.log, gpu.txt.
set -uo pipefail
mode=${1:?single or ray}
[[ $mode == single || $mode == ray ]] || { echo "unknown mode $mode: single or ray" >&2; exit 2; }
minutes=${2:-3}
sessions=${3:-12}
source bench/gpu_env.sh
mkdir -p /var/log/nginx /tmp/site  # the bundled nginx opens its compiled-in log folder at start
plans=/tmp/plans
avatar=/tmp/cluster-avatar/demo
limit=570
overhead=120  # seconds beside the phase: the start, the first frames, the streams' end, the server's stop
stop_margin=45  # the benchmark is told to stop this long before the limit, and killed 30 s after that

measure() {
    local name=$1 left
    shift
    left=$((limit - SECONDS))
    if ((left < minutes * 60 + overhead + stop_margin)); then
        echo "$left s left of this call, too few for $minutes min of streams: call 'bash bench/gpu_cluster.sh $mode" \
            "$minutes $sessions' again now (the machine keeps what this call made while it stays warm)"
        return 0
    fi
    # SIGINT at the limit: bench.service stops the server and nginx and keeps the server's log beside its JSON.
    timeout -s INT -k 30 $((left - stop_margin)) python3 -m bench.service --avatar "$avatar" --plans "$plans" \
        --sessions "$sessions" --minutes "$minutes" --first 0 --cycles 0 --out "$out/service_$name.json" "$@" \
        2>&1 | grep -v "warming up\|aiohttp.access" | tee "$out/service_$name.log" | tail -20
    echo "$name: rc ${PIPESTATUS[0]} after $SECONDS s of this call"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
case $mode in
single)
    mkdir -p "$(dirname "$avatar")" && rm -rf "$avatar" && cp -r .carry/avatars/demo "$avatar" || exit 1
    has_plans || build || exit 1
    python3 -c "import apps.serve, serving.service, engine.engine, bench.service"  # bytecode, as for the ray call
    measure single
    ;;
ray)
    for need in "$avatar" /tmp/site/av "$plans"; do
        [[ -e $need ]] || { echo "$need is missing: run 'bash bench/gpu_cluster.sh single' first here"; exit 1; }
    done
    has_plans || { echo "no packages in $plans: run 'bash bench/gpu_cluster.sh single' first"; exit 1; }
    tar xJf .carry/ray/ray-site.tar.xz -C /tmp/site || exit 1
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .carry/ray/*.whl || exit 1
    export RAY_USAGE_STATS_ENABLED=0  # nothing outside the machine can be reached
    python3 -c "import ray, ray.serve; print('ray', ray.__version__, 'from', ray.__file__)" || exit 1
    echo "ray installed after $SECONDS s"
    measure ray --ray
    ;;
esac

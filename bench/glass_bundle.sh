#!/usr/bin/env bash
# Bring what the live-output benchmarks need onto the lent GPU, which has no nginx, no apt and no network.
#
# Usage (here, from the repo root):  bash bench/glass_bundle.sh [--wheels]
#
# Into .carry/glass/root (ignored by git: /.carry/ is in .git/info/exclude): Debian's nginx, its
# RTMP module and the libraries nginx links against beyond glibc (OpenSSL 3, PCRE2, libcrypt),
# fetched with apt-get download and unpacked with dpkg -x; harness/nginx.py runs that nginx with
# LD_LIBRARY_PATH pointing there when the machine has no nginx of its own. It needs glibc 2.34 or
# newer (the GPU image's Python 3.12.3 is Ubuntu 24.04's, glibc 2.39).
# With --wheels it also downloads into .whl/ the streaming wheels for CPython 3.12 (av, aiortc and
# its dependencies, cffi, soxr) that are not there yet; bench/gpu_env.sh installs .whl/ on the GPU.
#
# No browser: Debian's chromium-headless-shell is a 64 MB .deb (223 MB unpacked; its binary alone
# is 56 MB with xz -9) plus chromium-common and about 80 libraries the GPU image lacks, while one
# call carries 64 MiB in all, wheels and repo included. So the GPU run uses --viewer aiortc.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
dest=.carry/glass
root=$dest/root

rm -rf "$dest"
mkdir -p "$dest/debs" "$root"
chmod 777 "$dest/debs"  # apt-get download drops privileges to _apt
apt-get update -qq
(cd "$dest/debs" && apt-get download -qq nginx libnginx-mod-rtmp libssl3 libpcre2-8-0 libcrypt1)
for deb in "$dest"/debs/*.deb; do dpkg -x "$deb" "$root"; done
rm -rf "$dest/debs" "$root/usr/share" "$root/etc" "$root/usr/lib/x86_64-linux-gnu/engines-3" "$root/usr/lib/x86_64-linux-gnu/ossl-modules"
for link in $(find "$root" -type l); do  # plain files travel more safely than links
    target=$(readlink -f "$link")
    rm "$link" && mv "$target" "$link"
done

libs="$PWD/$root/usr/lib/x86_64-linux-gnu:$PWD/$root/lib/x86_64-linux-gnu"
probe=$(mktemp -d)
printf 'daemon off;\nerror_log %s/error.log;\npid %s/nginx.pid;\nload_module %s;\nevents {}\nrtmp { server { listen 127.0.0.1:1; application live { live on; } } }\n' \
    "$probe" "$probe" "$PWD/$root/usr/lib/nginx/modules/ngx_rtmp_module.so" >"$probe/nginx.conf"
LD_LIBRARY_PATH=$libs "$root/usr/sbin/nginx" -t -p "$probe" -e "$probe/error.log" -c nginx.conf
echo "nginx resolves, from the bundle:"
LD_LIBRARY_PATH=$libs ldd "$root/usr/sbin/nginx" | grep "$root" || true
rm -rf "$probe"

if [[ "${1:-}" == "--wheels" ]]; then
    mkdir -p .whl
    for spec in av==18.1.0 aiortc==1.16.0 aioice==0.13.0 pyee==13.0.1 pylibsrtp==1.0.0 pyOpenSSL==26.4.0 \
        cryptography==50.0.2 cffi==2.0.0 pycparser==3.0 google-crc32c==1.9.0 dnspython==2.9.2 ifaddr==0.2.0 soxr==1.1.0 \
        pyzmq==27.3.0; do
        name=${spec%%==*}
        stem=$(echo "$name" | tr 'A-Z-' 'a-z_')
        if compgen -G ".whl/${stem}-*.whl" >/dev/null || compgen -G ".whl/${name}-*.whl" >/dev/null; then
            continue
        fi
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
            --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$spec"
    done
fi

mib() { echo "scale=1; $1 / 1048576" | bc; }
bundle=$(du -sb "$dest" | cut -f1)
wheels=$( (du -sb .whl 2>/dev/null || echo 0) | cut -f1)
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
echo "carry: .carry/glass $(mib "$bundle") MiB, .whl $(mib "$wheels") MiB, working tree $(mib "$tree") MiB;" \
    "total $(mib $((bundle + wheels + tree))) MiB of the 64 MiB one call carries"

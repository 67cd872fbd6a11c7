#!/usr/bin/env bash
# Install the Debian packages the streaming tests drive for real: nginx + RTMP module (RTMP sink),
# chromium (WebRTC preview), PulseAudio (a null microphone) and PortAudio (sounddevice).
# Idempotent and quick when everything is present: apt is only called for what is missing.
set -euo pipefail
PACKAGES=(nginx libnginx-mod-rtmp chromium pulseaudio pulseaudio-utils libasound2-plugins libportaudio2)
missing=()
for pkg in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
echo "installing system packages: ${missing[*]}" >&2
$SUDO apt-get update -qq
# Services are not started here (the tests start their own nginx and pulseaudio on 127.0.0.1).
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

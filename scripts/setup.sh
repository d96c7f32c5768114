#!/usr/bin/env bash
# Install what mixprec needs from Debian (idempotent; skips packages already present).
set -euo pipefail
pkgs=(build-essential cmake libdnnl-dev libgtest-dev libbenchmark-dev zlib1g-dev libcli11-dev
      nlohmann-json3-dev libfmt-dev dataset-fashion-mnist bible-kjv gnuplot-nox)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "mixprec setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

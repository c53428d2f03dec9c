#!/usr/bin/env bash
# Installs the Debian 12 packages paratrain needs to build, test, benchmark and run its demo
# (chromium: the report test renders `paratrain report`'s page headless).
# Idempotent: packages already present are skipped. Uses sudo when not root.
# Non-interactive, so it works in CI (no terminal, no stdin).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libopenblas-dev libdnnl-dev
  libgtest-dev libgmock-dev
  libcli11-dev nlohmann-json3-dev
  libsentencepiece-dev sentencepiece
  libopenmpi-dev openmpi-bin
  zlib1g-dev
  python3 python3-torch python3-numpy
  dataset-fashion-mnist wordnet-base
  iproute2 procps time
  chromium
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q < /dev/null
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" < /dev/null

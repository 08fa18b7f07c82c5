#!/usr/bin/env bash
# Installs every system package the build and the test suite need (Debian 12).
# Idempotent: a package already present costs nothing.
set -euo pipefail
PKGS=(clang-19 llvm-19 libbpf-dev bpftool iproute2 iputils-ping libelf-dev zlib1g-dev
      pkg-config protobuf-compiler libprotobuf-dev etcd-server etcd-client containernetworking-plugins
      netcat-openbsd iperf3 containerd runc libc6-dev gcc tar procps iptables)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "==> installing: ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then echo "error: installing packages needs root (run with sudo)" >&2; exit 1; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

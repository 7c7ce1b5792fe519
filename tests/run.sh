#!/bin/bash
# Install what the tests need on a fresh Debian/Ubuntu machine, then run them.
# Usage (as root): tests/run.sh [PYTEST ARGS...]
# Without arguments it runs the whole suite, the cluster tests beside the others.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    echo "tests/run.sh: the tests create OS accounts and namespaces; run it as root (sudo)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
PKGS="openssh-client openssh-server openssh-sftp-server rsync git tmux python3-venv uidmap
      util-linux iproute2 procps passwd gcc libc6-dev quota e2fsprogs faketime
      podman slirp4netns fuse-overlayfs runc busybox-static docker-registry apache2-utils skopeo"
missing=$(for p in $PKGS; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || echo "$p"; done)
if [ -n "$missing" ]; then
    apt-get update -q
    apt-get install -y -q $missing
fi
# The tests' virtualenv is built from the system Python in a world-readable place:
# tenants run MTGPU's tools from it.
VENV=${MTGPU_TEST_VENV:-/opt/mtgpu-test}
[ -x "$VENV/bin/python" ] || /usr/bin/python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check ".[test]"
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall .
# The CPU build of PyTorch, for the multi-member torchrun test (gloo over the network).
"$VENV/bin/python" -c "import torch" 2>/dev/null || "$VENV/bin/pip" install -q --disable-pip-version-check "torch==2.13.0"
chmod -R a+rX "$VENV"
if [ $# -gt 0 ]; then
    exec "$VENV/bin/python" -m pytest "$@"
fi
# The whole suite: the cluster tests (mostly waiting for elections, failovers and
# timeouts) run beside the others, each run with its own share of test UIDs and
# subnets (MTGPU_TEST_SHARE) and its own temporary directory.
OUT=$(mktemp -d /tmp/mtgpu-tests-XXXXXX)
MTGPU_TEST_SHARE=1/2 "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
    --basetemp="$OUT/cluster-tmp" tests/cluster > "$OUT/cluster.log" 2>&1 &
cluster=$!
set +e
MTGPU_TEST_SHARE=0/2 "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
    --basetemp="$OUT/rest-tmp" --ignore=tests/cluster
rest=$?
wait $cluster
clustered=$?
set -e
echo
echo "== tests/cluster (run beside the rest) =="
cat "$OUT/cluster.log"
rm -rf "$OUT"
[ $rest -eq 0 ] && [ $clustered -eq 0 ]

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
      util-linux iproute2 iptables procps passwd gcc libc6-dev quota e2fsprogs faketime
      podman slirp4netns fuse-overlayfs runc busybox-static docker-registry apache2-utils skopeo
      putty-tools dropbear-bin curl zsh man-db groff-base"
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
# Lint and types first, with the versions and settings pinned in pyproject.toml.
"$VENV/bin/ruff" check mtgpu tests benchmarks
"$VENV/bin/mypy"
# Formatting: ruff format, and import order as `ruff check --select I` sorts it. To
# fix what these report: ruff check --select I --fix mtgpu tests benchmarks &&
# ruff format mtgpu tests benchmarks
"$VENV/bin/ruff" format --check mtgpu tests benchmarks
"$VENV/bin/ruff" check --select I mtgpu tests benchmarks
if [ $# -gt 0 ]; then
    exec "$VENV/bin/python" -m pytest "$@"
fi
# The VS Code extension: Node and npm from the host's packages, its locked dependencies
# (once per lockfile) and its type check. Its Node tests, against a real server, and the
# .vsix it packs run inside the pytest run below (tests/tui/test_vscode.py).
if [ -d clients/vscode ]; then
    command -v npm >/dev/null || { apt-get update -q && apt-get install -y -q nodejs npm; }
    (cd clients/vscode && { cmp -s package-lock.json node_modules/.mtgpu-lock || { npm ci -q --no-audit \
        --no-fund && cp package-lock.json node_modules/.mtgpu-lock; }; } && npx tsc -p . --noEmit)
fi
# The whole suite in two lanes at once: the cluster tests (mostly waiting for
# elections, failovers and timeouts), with the installer's (mostly waiting for pip),
# the daemon-crash tests, the shared-homes retention tests, remotegpu-cli's and the
# VS Code extension's and the SSH client matrix, beside the others; the two take
# about as long (see MTGPU_TEST_REPORT). Each lane has its own share of test
# UIDs and subnets (MTGPU_TEST_SHARE) and its own temporary directory.
# MTGPU_TEST_REPORT=DIR keeps each lane's JUnit XML (per-test durations) there.
SIDE="tests/cluster tests/install/test_setup.py tests/install/test_bundle.py tests/faults
      tests/accounts/test_retention_activity.py tests/tui tests/sshd/test_client_matrix.py"
OUT=$(mktemp -d /tmp/mtgpu-tests-XXXXXX)
report() { [ -n "${MTGPU_TEST_REPORT:-}" ] && echo "--junitxml=$MTGPU_TEST_REPORT/$1.xml"; true; }
ignore=$(for t in $SIDE; do echo "--ignore=$t"; done)
MTGPU_TEST_SHARE=1/2 MTGPU_TEST_FAILED="$OUT/side.failed" "$VENV/bin/python" -m pytest -q \
    -p no:cacheprovider $(report side) --basetemp="$OUT/side-tmp" $SIDE > "$OUT/side.log" 2>&1 &
side=$!
set +e
MTGPU_TEST_SHARE=0/2 MTGPU_TEST_FAILED="$OUT/rest.failed" "$VENV/bin/python" -m pytest -q \
    -p no:cacheprovider $(report rest) --basetemp="$OUT/rest-tmp" $ignore
rest=$?
wait $side
sided=$?
set -e
echo
echo "== $SIDE (run beside the rest) =="
cat "$OUT/side.log"
# A test that failed with the two lanes competing for the CPUs runs once more, alone,
# with its lane's share; the run passes only if each passes then, and the summary
# names every test that needed it. Only for failed tests (pytest's status 1), and at
# most eight: a collection error, an interrupted lane or many failures stand as they are.
again() {  # LANE STATUS
    local failed="$OUT/$1.failed" share
    [ "$1" = side ] && share=1/2 || share=0/2
    [ "$2" -eq 1 ] && [ -s "$failed" ] && [ "$(wc -l < "$failed")" -le 8 ] || return "$2"
    echo
    echo "== run again alone, after failing beside the other lane: $(tr '\n' ' ' < "$failed")=="
    mapfile -t ids < "$failed"
    MTGPU_TEST_SHARE=$share "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
        --basetemp="$OUT/$1-again-tmp" "${ids[@]}"
}
set +e
again rest $rest
rest=$?
again side $sided
sided=$?
set -e
rm -rf "$OUT"
[ $rest -eq 0 ] && [ $sided -eq 0 ] || exit 1
# A fresh Debian 12 host with systemd and cgroup v2, after the suite and alone (QEMU
# emulates both cores): tests/README.md, "A fresh host". MTGPU_FRESH_GUEST=0 leaves it
# out; its exit status 77 (no guest could be had here) is said and not a failure.
if [ "${MTGPU_FRESH_GUEST:-1}" != 0 ]; then
    echo
    echo "== tests/host/fresh-guest =="
    set +e
    tests/host/fresh-guest
    guest=$?
    set -e
    [ $guest -eq 0 ] || [ $guest -eq 77 ]
fi

"""Real user quotas on a loop-mounted ext4 made with ``-O quota``.

Needs a kernel built with quota support (CONFIG_QUOTA, CONFIG_QFMT_V2); where the
kernel refuses to mount such a filesystem the test says so and is skipped, like a
missing GPU. The scan mode is what such hosts use (tests/accounts/test_policy_daemon.py).
"""

from __future__ import annotations

import subprocess

import pytest

from mtgpu.accounts.quota import detect_mode, read_usage, set_limit

pytestmark = pytest.mark.root

NOBODY = 65534


def sh(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True)


@pytest.fixture
def quota_ext4(tmp_path):
    img, mnt = tmp_path / "img", tmp_path / "mnt"
    mnt.mkdir()
    sh("truncate", "-s", "16M", str(img))
    assert sh("mkfs.ext4", "-q", "-O", "quota", "-F", str(img)).returncode == 0
    r = sh("mount", "-o", "loop,usrquota", str(img), str(mnt))
    if r.returncode != 0:
        pytest.skip(
            f"this kernel cannot mount an ext4 with quotas ({r.stderr.strip()}); it lacks CONFIG_QUOTA"
        )
    try:
        sh("quotaon", "-u", str(mnt))  # with -O quota the mount usually turned it on already
        yield mnt
    finally:
        sh("umount", "-l", str(mnt))


def test_real_quota_is_set_and_enforced(quota_ext4):
    homes = quota_ext4 / "homes"
    mode = detect_mode(str(homes))
    assert (mode.kind, mode.mount) == ("ext4", str(quota_ext4)), mode
    home = homes / "nobody"
    home.mkdir()
    sh("chown", f"{NOBODY}:{NOBODY}", str(home))
    set_limit(mode, "nobody", 1 << 20)
    r = sh(
        "setpriv",
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
        "dd",
        "if=/dev/zero",
        f"of={home / 'f'}",
        "bs=64K",
        "count=64",
        "conv=fsync",
    )
    assert r.returncode != 0 and "quota" in r.stderr.lower(), r.stderr  # EDQUOT
    used = read_usage(mode)[NOBODY]
    assert 0 < used <= (1 << 20) + 4096

"""The home scanner against du, and against a hostile tenant's tricks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mtgpu.accounts import homescan
from mtgpu.accounts.homescan import scan_home
from mtgpu.accounts.quota import detect_mode


def du(path: Path) -> int:
    out = subprocess.run(
        ["du", "-s", "-B1", "--one-file-system", str(path)], capture_output=True, text=True, check=True
    ).stdout
    return int(out.split()[0])


def tree(root: Path) -> Path:
    home = root / "home"
    (home / "a" / "b").mkdir(parents=True)
    (home / "a" / "data").write_bytes(os.urandom(100_000))
    (home / "a" / "b" / "small").write_text("x")
    os.link(home / "a" / "data", home / "a" / "b" / "data-again")  # counted once
    outside = root / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(os.urandom(1_000_000))
    (home / "link-to-outside").symlink_to(outside)  # never followed
    (home / "link-to-big").symlink_to(outside / "big")
    return home


def test_scan_matches_du_with_hard_links_and_symlinks(tmp_path):
    home = tree(tmp_path)
    u = scan_home(str(home))
    assert u.error == "" and u.skipped == 0
    assert u.bytes == du(home)
    assert 100_000 <= u.bytes < 1_000_000  # the linked-to megabyte is not there
    assert u.files == 7  # home, a, b, data, small, two links (the hard link once)


def test_a_deep_tree_is_measured_with_few_descriptors(tmp_path, monkeypatch):
    monkeypatch.setattr(homescan, "MAX_OPEN_DIRS", 8)
    home = tmp_path / "home"
    d = home
    for i in range(40):
        d = d / f"d{i}"
        (d / "side").mkdir(parents=True)
        (d / "side" / "f").write_bytes(b"y" * 5000)
    u = scan_home(str(home))
    assert (u.bytes, u.skipped) == (du(home), 0)
    assert u.files == 1 + 40 * 3


def test_a_directory_swapped_for_a_link_during_the_scan_is_not_followed(tmp_path):
    home = tree(tmp_path)
    target = tmp_path / "outside"

    class Swapping(homescan._Walk):
        swapped = False

        def _list(self, fd):
            subdirs = super()._list(fd)
            if not self.swapped:  # right after listing the home, "a" becomes a link
                self.swapped = True
                os.rename(home / "a", tmp_path / "a-moved")
                (home / "a").symlink_to(target)
            return subdirs

    w = Swapping(str(home))
    w.run()
    assert w.total < 1_000_000 and w.skipped == 1


def test_a_home_that_is_a_link_is_refused(tmp_path):
    home = tree(tmp_path)
    (tmp_path / "evil").symlink_to(home)
    u = scan_home(str(tmp_path / "evil"))
    assert u.error.startswith("cannot measure") and u.bytes == 0


@pytest.mark.root
def test_the_scan_never_leaves_the_home_filesystem(tmp_path):
    home = tree(tmp_path)
    (home / "mnt").mkdir()
    # In a private mount namespace: a tmpfs with a megabyte on it, mounted in the home.
    script = (
        f"mount -t tmpfs t {home / 'mnt'} && head -c 1000000 /dev/urandom > "
        f"{home / 'mnt' / 'f'} && exec {sys.executable} -m mtgpu.accounts.homescan {home}"
    )
    r = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["bytes"] < 1_000_000 and d["skipped"] == 1 and d["error"] == ""


def test_mode_detection_names_why_homes_are_measured(tmp_path):
    mode = detect_mode(str(tmp_path))
    if mode.kind == "scan":
        assert mode.mount and mode.detail  # says which filesystem and why
    else:
        assert mode.kind in ("ext4", "xfs") and "quotas" in mode.detail

"""Archiving and removing a home by descriptor, as root (mtgpu/accounts/homeremove.py):
real directories, real `mount --bind` of directories made here (unmounted in a
finalizer), real `chattr +i`. A victim directory outside the home is checked after
every removal."""

from __future__ import annotations

import os
import subprocess
import tarfile

import pytest

from mtgpu.accounts import homeremove
from mtgpu.accounts.homeremove import Home, HomeRefused

pytestmark = pytest.mark.root


@pytest.fixture
def tree(tmp_path):
    """(home root, home, victim): the home has files, a subtree, a link to the victim."""
    root = tmp_path / "homes"
    home = root / "alice"
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "precious").write_text("only copy\n")
    (home / "a" / "b").mkdir(parents=True)
    (home / "a" / "b" / "f").write_text("hello\n")
    os.link(home / "a" / "b" / "f", home / "a" / "hard")
    (home / "to-victim").symlink_to(victim)
    (home / "etc").symlink_to("/etc")
    (home / "project").mkdir()
    os.mkfifo(home / "fifo")
    yield root, home, victim
    subprocess.run(["chattr", "-R", "-i", str(tmp_path)], capture_output=True, check=False)


@pytest.fixture
def bind():
    made = []

    def mount(src, dst, *opts):
        subprocess.run(["mount", "--bind", str(src), str(dst)], check=True)
        made.append(dst)
        if opts:
            subprocess.run(["mount", "-o", "remount,bind," + ",".join(opts), str(dst)], check=True)

    yield mount
    for dst in reversed(made):
        subprocess.run(["umount", "-l", str(dst)], check=False)


def intact(victim):
    assert (victim / "precious").read_text() == "only copy\n" and (victim / "sub").is_dir()


def test_removal_by_descriptor_follows_no_link(tree):
    root, home, victim = tree
    with Home(str(root), "alice", os.getuid()) as h:
        h.check()
        h.remove()
    assert not home.exists()
    intact(victim)
    assert os.path.exists("/etc/passwd")


@pytest.mark.parametrize("opts", [(), ("ro",)])
def test_a_bind_mount_is_refused_before_anything_is_touched(tree, bind, opts):
    root, home, victim = tree
    bind(victim, home / "project", *opts)
    with Home(str(root), "alice", os.getuid()) as h:
        with pytest.raises(HomeRefused, match=f"{home}/project is a mount point"):
            h.check()
        # Even asked to go on, the walk stops at the mount and never enters it.
        with pytest.raises(homeremove.HomeRemoveFailed, match="mount point"):
            h.remove()
    intact(victim)


def test_the_walk_finds_a_mount_the_mount_table_does_not_name(tree, bind, monkeypatch):
    root, home, victim = tree
    bind(victim, home / "a" / "b")
    monkeypatch.setattr(homeremove, "mounts_under", lambda path: [])
    with Home(str(root), "alice", os.getuid()) as h:
        assert [p for p in h.problems() if f"{home}/a/b is a mount point" in p]
        with pytest.raises(homeremove.HomeRemoveFailed):
            h.archive(str(root / "x.tar.gz"))
    assert not (root / "x.tar.gz").exists() and not (root / "x.tar.gz.partial").exists()
    intact(victim)


def test_another_owners_home_is_refused_naming_the_owner(tree):
    root, home, _ = tree
    os.chown(home, 1, 1)
    with pytest.raises(HomeRefused, match=r"belongs to 'daemon' \(UID 1\), not to the tenant"):
        Home(str(root), "alice", 4321)
    assert (home / "a" / "b" / "f").exists()
    os.chown(home, 0, 0)
    (root / "bob").symlink_to(home)
    with pytest.raises(HomeRefused, match="not a directory"):
        Home(str(root), "bob", 0)


def test_an_immutable_file_is_found_first(tree):
    root, home, victim = tree
    subprocess.run(["chattr", "+i", str(home / "a" / "b" / "f")], check=True)
    with (
        Home(str(root), "alice", os.getuid()) as h,
        pytest.raises(HomeRefused, match="immutable or append-only"),
    ):
        h.check()
    assert (home / "a" / "hard").read_text() == "hello\n"
    intact(victim)


def test_the_archive_keeps_files_links_and_hard_links(tree):
    root, _, victim = tree
    dest = root / "alice.tar.gz"
    with Home(str(root), "alice", os.getuid()) as h:
        h.archive(str(dest))
    with tarfile.open(dest) as tar:
        m = {i.name: i for i in tar.getmembers()}
        assert tar.extractfile("alice/a/b/f").read() == b"hello\n"
        assert m["alice/to-victim"].issym() and m["alice/to-victim"].linkname == str(victim)
        assert m["alice/a/hard"].islnk() or m["alice/a/b/f"].islnk()
        assert m["alice/fifo"].isfifo() and m["alice/project"].isdir()
        assert not any(n.startswith("alice/to-victim/") for n in m)
    assert dest.stat().st_mode & 0o077 == 0


def test_a_tree_too_deep_is_refused(tree):
    root, home, _ = tree
    fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(homeremove.MAX_DEPTH + 2):
        os.mkdir("d", dir_fd=fd)
        nfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    os.close(fd)
    with Home(str(root), "alice", os.getuid()) as h, pytest.raises(HomeRefused, match="levels deep"):
        h.check()
    assert (home / "a" / "b" / "f").exists()


def test_a_home_root_that_is_a_link_is_followed_once(tree, tmp_path):
    root, home, victim = tree
    (tmp_path / "home-link").symlink_to(root)  # TENANT_HOME_ROOT: /home -> /data/home
    with Home(str(tmp_path / "home-link"), "alice", os.getuid()) as h:
        assert h.path == str(home)
        h.check()
        h.remove()
    assert not home.exists()
    intact(victim)

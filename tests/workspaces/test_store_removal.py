"""A removed tenant's container store (``CONTAINERS.storage`` on local disk) is removed
by root, by descriptor (mtgpu/workspaces/storage.py ``remove_tree``), while the tenant
has made it as hostile as it can: links to root's files and to ``/`` where directories
were, a directory swapped for a link while the removal walks, a bind mount of the
same filesystem inside it. Root's files outside are checked after every removal."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from mtgpu_testing import run_share

from mtgpu.accounts import homeremove
from mtgpu.proc import run
from mtgpu.workspaces.storage import LocalStores

pytestmark = pytest.mark.root

#: The tenant: no account is needed to own files and run a shell as it.
UID = 54300 + run_share()[0]


@pytest.fixture
def stores() -> Iterator[tuple[LocalStores, Path]]:
    """(the stores, root's directory outside them that the tenant aims at)."""
    base = Path(tempfile.mkdtemp(prefix="mtgpu-store-rm-", dir="/tmp"))
    os.chmod(base, 0o755)
    outside = base / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "precious").write_text("only copy\n")
    (outside / "sub" / "deep").write_text("also\n")
    (base / "stores").mkdir(mode=0o711)
    os.chmod(base / "stores", 0o711)
    mounted: list[Path] = []
    try:
        yield LocalStores(str(base / "stores")), outside
    finally:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4]
            if point.startswith(f"{base}/"):
                mounted.append(Path(point))
        for p in reversed(mounted):
            subprocess.run(["umount", "-l", str(p)], check=False)
        subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=False)


def as_tenant(script: str, cwd: str) -> None:
    run(["sh", "-ec", script], user=UID, group=UID, extra_groups=[], cwd=cwd, env={"PATH": "/usr/bin:/bin"})


def intact(outside: Path) -> None:
    assert (outside / "precious").read_text() == "only copy\n"
    assert (outside / "sub" / "deep").read_text() == "also\n"
    assert Path("/etc/passwd").is_file() and Path("/usr/bin").is_dir()


def test_links_in_a_store_are_removed_never_followed(stores) -> None:
    s, outside = stores
    d = s.ensure(UID, UID)
    as_tenant(
        f"""
        mkdir -p storage/overlay/l storage/vfs/dir/a/b
        echo x > storage/vfs/dir/a/b/f
        ln -s {outside} storage/overlay/l/ABC
        ln -s {outside}/precious storage/precious
        ln -s / storage/root
        ln -s ../../../../.. storage/vfs/dir/up
        """,
        d,
    )
    # What a container leaves: a sub-UID's directory it could not be entered by mode.
    os.chown(f"{d}/storage/vfs/dir/a", UID + 70000, UID + 70000)
    os.chmod(f"{d}/storage/vfs/dir/a", 0)
    os.link(outside / "precious", f"{d}/storage/hard")  # a hard link root made, as a copy would
    assert s.remove(UID) == f"{d} removed"
    assert not os.path.lexists(d)
    intact(outside)
    assert (outside / "precious").stat().st_nlink == 1


@pytest.mark.parametrize("target", ["outside", "/"])
def test_a_link_in_place_of_the_store_itself_is_unlinked(stores, target) -> None:
    s, outside = stores
    # The stores' directory is root's (0711): only root could put a link there, but
    # whatever is at DIR/UID is never followed.
    os.symlink(str(outside) if target == "outside" else "/", s.dir_of(UID))
    assert s.remove(UID) == f"{s.dir_of(UID)} removed"
    assert not os.path.lexists(s.dir_of(UID))
    intact(outside)


def test_a_directory_swapped_for_a_link_during_the_walk_is_not_entered(stores, monkeypatch) -> None:
    s, outside = stores
    d = s.ensure(UID, UID)
    as_tenant("mkdir -p storage/vfs/layer && echo x > storage/vfs/layer/f", d)
    real = homeremove.statx

    def statx_then_swap(fd: int, name: str) -> homeremove.Entry:
        e = real(fd, name)
        if name == "layer":  # listed as a directory; the tenant swaps it now
            as_tenant(f"mv storage/vfs/layer storage/vfs/old && ln -s {outside} storage/vfs/layer", d)
        return e

    monkeypatch.setattr(homeremove, "statx", statx_then_swap)
    left = s.remove(UID)
    assert left.startswith(f"{d} left: ") and "'layer' became a link" in left, left
    intact(outside)
    monkeypatch.setattr(homeremove, "statx", real)
    assert s.remove(UID) == f"{d} removed"  # the next removal unlinks the link
    assert not os.path.lexists(d)
    intact(outside)


def test_a_bind_mount_in_a_store_is_never_emptied(stores) -> None:
    s, outside = stores
    d = s.ensure(UID, UID)
    as_tenant("mkdir -p storage/overlay/merged && echo x > storage/f", d)
    # Same filesystem, same device number: `rm -rf --one-file-system` went through it.
    subprocess.run(["mount", "--bind", str(outside), f"{d}/storage/overlay/merged"], check=True)
    left = s.remove(UID)
    intact(outside)
    assert left.startswith(f"{d} left: not removed, nothing was touched: ") and (
        f"{d}/storage/overlay/merged is a mount point" in left
    ), left
    assert Path(f"{d}/storage/f").read_text() == "x\n"
    subprocess.run(["umount", f"{d}/storage/overlay/merged"], check=True)
    assert s.remove(UID) == f"{d} removed"
    assert not os.path.lexists(d)
    intact(outside)

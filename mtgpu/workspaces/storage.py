"""Where tenants' container stores live on this member: in their homes, or on local disk.

Rootless podman keeps each tenant's images and containers in
``~/.local/share/containers/storage`` by default. That cannot work when the homes are
on NFS (podman does not support its storage there), and it must not be shared
between members even where it would mount: two members' podman would keep one
container database with locks that only each member's own ``/dev/shm`` holds.

``CONTAINERS.storage`` says where the stores live:

- ``home``: podman's default, under each home;
- an absolute path: ``PATH/UID/storage`` on this member's own disk, one per tenant;
- ``auto`` (the default): ``/var/lib/mtgpu-containers`` when ``TENANT_HOME_ROOT`` is on
  a network filesystem, the homes otherwise.

With local stores the daemon writes ``PATH/storage.conf`` (root's, 0644) whose
``rootless_storage_path`` is ``PATH/$UID/storage``, and every podman it runs for a
tenant, the ``podman``/``docker`` wrappers, tenants' sessions and jobs get
``CONTAINERS_STORAGE_CONF`` pointing at it. ``PATH/UID`` is the tenant's (0700), made
before their podman first runs on this member. The storage driver is the one rootless
podman picks on this member's disk, found once when the file is written (podman wants
it named in the file).

Images then reach each member's store as the design has it: with shared homes, a job's
image is archived once under the home and loaded by whichever member runs it.
"""

from __future__ import annotations

import errno
import logging
import os
import pwd
import shutil
import signal
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtgpu.accounts.homeremove import Home
from mtgpu.errors import AccountError, CommandError
from mtgpu.fsafe import open_dir, signal_pid
from mtgpu.proc import run

log = logging.getLogger(__name__)

#: Where ``auto`` puts the stores when the homes are on a network filesystem.
DEFAULT_LOCAL_ROOT = "/var/lib/mtgpu-containers"

#: Filesystems that rootless podman cannot keep its storage on (or that are shared
#: between machines, so one store would be used by several members' podman at once).
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ceph",
        "glusterfs",
        "lustre",
        "gpfs",
        "beegfs",
        "9p",
        "afs",
        "fuse.sshfs",
        "fuse.glusterfs",
        "fuse.cephfs",
        "fuse.gcsfuse",
        "fuse.s3fs",
        "fuse.rclone",
        "fuse.juicefs",
        "fuse.mfs",
        "pvfs2",
        "orangefs",
        "ocfs2",
        "gfs2",
    }
)

CONF_NAME = "storage.conf"
_DRIVERS = ("overlay", "vfs", "btrfs", "zfs")


def filesystem_of(path: str, mountinfo: str | None = None) -> tuple[str, str]:
    """(mount point, filesystem type) of the mount that holds ``path``."""
    from mtgpu.accounts.quota import mount_of

    if mountinfo is None:
        with open("/proc/self/mountinfo") as f:
            mountinfo = f.read()
    p = path
    while not os.path.exists(p) and p not in ("/", ""):
        p = os.path.dirname(p)  # a home root not made yet is on its parent's mount
    mp, fstype, _src = mount_of(os.path.realpath(p or "/"), mountinfo)
    return mp, fstype


def local_root(setting: str, home_root: str, mountinfo: str | None = None) -> str | None:
    """The directory that holds the tenants' stores here, or None for their homes.

    >>> local_root("home", "/home")
    >>> local_root("/srv/containers", "/home")
    '/srv/containers'
    >>> info = "36 25 0:32 / /home rw - nfs4 fs:/export/home rw\\n25 1 8:1 / / rw - ext4 /dev/sda1 rw"
    >>> local_root("auto", "/home/tenants", info)
    '/var/lib/mtgpu-containers'
    >>> local_root("auto", "/srv/homes", info) is None
    True
    """
    fstype = filesystem_of(home_root, mountinfo)[1] if setting == "auto" else ""
    return root_for(setting, fstype)


def root_for(setting: str, home_fs: str) -> str | None:
    """:func:`local_root` given the filesystem type of ``TENANT_HOME_ROOT``.

    >>> root_for("auto", "nfs4"), root_for("auto", "ext4"), root_for("home", "nfs4")
    ('/var/lib/mtgpu-containers', None, None)
    """
    if setting == "home":
        return None
    if setting != "auto":
        return setting
    return DEFAULT_LOCAL_ROOT if home_fs in NETWORK_FILESYSTEMS else None


def conf_text(root: str, driver: str) -> str:
    """The ``storage.conf`` of the local stores under ``root``.

    >>> print(conf_text("/var/lib/mtgpu-containers", "overlay"), end="")
    # Written by mtgpu-server (CONTAINERS.storage): each tenant's container store is
    # on this member's disk. Tenants' podman reads it through CONTAINERS_STORAGE_CONF.
    [storage]
    driver = "overlay"
    rootless_storage_path = "/var/lib/mtgpu-containers/$UID/storage"
    """
    return (
        "# Written by mtgpu-server (CONTAINERS.storage): each tenant's container store is\n"
        "# on this member's disk. Tenants' podman reads it through CONTAINERS_STORAGE_CONF.\n"
        "[storage]\n"
        f'driver = "{driver}"\n'
        f'rootless_storage_path = "{root}/$UID/storage"\n'
    )


@dataclass
class LocalStores:
    """The tenants' container stores under ``root`` on this member."""

    root: str
    podman: str = "podman"

    @property
    def conf(self) -> str:
        return f"{self.root}/{CONF_NAME}"

    def dir_of(self, uid: int) -> str:
        return f"{self.root}/{uid}"

    def prepare(self) -> None:
        """Make ``root`` (root's, 0711) and its ``storage.conf`` (once: the driver the
        stores were made with stays)."""
        root = Path(self.root)
        if root.is_symlink():
            raise OSError(f"{root} is a symbolic link; point CONTAINERS.storage at a real directory")
        root.mkdir(parents=True, exist_ok=True)
        for parent in root.parents:
            if not parent.stat().st_mode & 0o001:
                raise OSError(
                    f"{parent} is mode {parent.stat().st_mode & 0o7777:04o}, so tenants "
                    f"cannot reach their stores under {root}; let others traverse it "
                    "(chmod o+x) or choose another directory"
                )
        st = root.stat()
        if st.st_uid != 0 and os.geteuid() == 0:
            os.chown(root, 0, 0)
        if st.st_mode & 0o7777 != 0o711:
            os.chmod(root, 0o711)
        conf = Path(self.conf)
        if conf.is_file() and _driver_in(conf.read_text()):
            return
        driver = self.probe_driver()
        tmp = conf.with_name(f".{CONF_NAME}.tmp")
        tmp.write_text(conf_text(self.root, driver))
        os.chmod(tmp, 0o644)
        os.replace(tmp, conf)
        log.info("tenants' container stores are under %s (driver %s)", self.root, driver)

    def probe_driver(self) -> str:
        """The driver rootless podman picks for a store under ``root`` (``vfs`` if it
        cannot say: it works on every filesystem)."""
        podman = shutil.which(self.podman) or self.podman
        try:
            nobody = pwd.getpwnam("nobody")
        except KeyError:
            return "vfs"
        probe = tempfile.mkdtemp(prefix=".probe-", dir=self.root)
        try:
            os.chmod(probe, 0o700)
            os.mkdir(f"{probe}/run", 0o700)  # podman's runtime files (its pause process's pid)
            if os.geteuid() == 0:
                for d in (probe, f"{probe}/run"):
                    os.chown(d, nobody.pw_uid, nobody.pw_gid)
            conf = f"{probe}/{CONF_NAME}"
            with open(conf, "w") as f:
                f.write(f'[storage]\nrootless_storage_path = "{probe}/storage"\n')
            os.chmod(conf, 0o644)
            env = {
                "HOME": probe,
                "XDG_RUNTIME_DIR": f"{probe}/run",
                "XDG_CONFIG_HOME": f"{probe}/config",
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "CONTAINERS_STORAGE_CONF": conf,
            }
            kw: dict[str, Any] = (
                {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
                if os.geteuid() == 0
                else {}
            )
            r = run(
                [podman, "info", "--format", "{{.Store.GraphDriverName}}"],
                env=env,
                cwd="/",
                timeout=60,
                check=False,
                **kw,
            )
            driver = r.stdout.strip()
            if r.returncode == 0 and driver in _DRIVERS:
                return driver
            log.warning(
                "podman could not say which storage driver it uses under %s (%s); using vfs",
                self.root,
                (r.stderr.strip().splitlines() or ["no output"])[-1],
            )
        except (OSError, CommandError) as exc:
            log.warning("probing podman's storage driver under %s: %s; using vfs", self.root, exc)
        finally:
            _stop_pause_process(f"{probe}/run", nobody.pw_uid)
            owner = nobody.pw_uid if os.geteuid() == 0 else os.geteuid()
            left = remove_tree(self.root, os.path.basename(probe), owner)
            if left:
                log.warning("the driver probe's store under %s is left: %s", self.root, left)
        return "vfs"

    def ensure(self, uid: int, gid: int) -> str:
        """``root/UID``, the tenant's (0700); returns it."""
        d = Path(self.dir_of(uid))
        if d.is_symlink():
            raise OSError(f"{d} is a symbolic link; an admin must remove it")
        try:
            st = d.stat()
        except FileNotFoundError:
            d.mkdir(mode=0o700)
            os.chown(d, uid, gid)
            return str(d)
        if st.st_uid != uid:
            os.chown(d, uid, gid)  # root's: a start cut short between mkdir and chown
        if st.st_mode & 0o777 != 0o700:
            os.chmod(d, 0o700)
        return str(d)

    def remove(self, uid: int) -> str:
        """Drop a removed tenant's store (files of the tenant's sub-UIDs too), by
        descriptor (:func:`remove_tree`). Says what became of it."""
        left = remove_tree(self.root, str(uid), uid)
        if left:
            log.warning("the container store of UID %d is left: %s", uid, left)
            return f"{self.dir_of(uid)} left: {left}"
        return f"{self.dir_of(uid)} removed"

    def env(self) -> dict[str, str]:
        return {"CONTAINERS_STORAGE_CONF": self.conf}


def remove_tree(parent: str, name: str, uid: int) -> str:
    """Remove ``parent/name``, a directory of ``uid`` (or root's) in ``parent`` (root's,
    writable by root alone), as root, never by name below ``parent``.

    The tenant writes everything below ``name``: a path-based ``rm -rf`` as root would
    follow a link swapped in for a directory, and ``--one-file-system`` does not stop at
    a bind mount of the same filesystem. So the tree is walked and removed by
    descriptor, as retention removes homes (:class:`mtgpu.accounts.homeremove.Home`):
    each directory opened with ``O_NOFOLLOW`` from its parent's descriptor and checked
    to be the inode listed, on the same mount (``statx`` mount ID); links are unlinked,
    never followed. Nothing is touched when a mount point is under it or an entry is
    immutable. A link or file at ``name`` itself is unlinked (``parent`` is root's).

    Returns "" when ``name`` is gone (or never was), otherwise why it is left.
    """
    try:
        pfd = open_dir(os.path.realpath(parent))
    except FileNotFoundError:
        return ""
    except OSError as exc:
        return f"{parent} cannot be opened without following a link: {exc.strerror or exc}"
    try:
        pst = os.fstat(pfd)
        if pst.st_uid != os.geteuid() or pst.st_mode & 0o022:
            return f"{parent} is not root's alone; nothing below it is removed"
        try:
            st = os.lstat(name, dir_fd=pfd)
        except FileNotFoundError:
            return ""
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=pfd)  # the link itself, never what it names
            return ""
        with Home(parent, name, 0 if st.st_uid == 0 else uid) as tree:  # root's: made, not yet given
            found = tree.problems()
            if found:
                return (
                    "not removed, nothing was touched: "
                    + "; ".join(found)
                    + "; unmount it or clear the attribute (chattr -i) and remove it by hand"
                )
            tree.remove()
        return ""
    except FileNotFoundError as exc:  # something below went meanwhile
        try:
            os.lstat(name, dir_fd=pfd)
        except FileNotFoundError:
            return ""
        return f"{exc.strerror} ({exc.filename or name}); stopped there"
    except AccountError as exc:  # HomeRefused, HomeRemoveFailed: say where it stopped
        return str(exc)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # O_NOFOLLOW | O_DIRECTORY refused it
            return (
                f"{exc.filename!r} became a link or a file while it was removed; not followed, stopped there"
            )
        return f"{exc.strerror or exc} ({exc.filename or name})"
    finally:
        os.close(pfd)


def _stop_pause_process(runtime_dir: str, uid: int) -> None:
    """Rootless podman leaves a pause process holding its user namespace; the probe's
    has no further use."""
    try:
        with open(f"{runtime_dir}/libpod/tmp/pause.pid") as f:
            pid = int(f.read().strip())
        signal_pid(pid, signal.SIGKILL, lambda p: os.stat(f"/proc/{p}").st_uid == uid)
    except (OSError, ValueError):
        pass


def _driver_in(text: str) -> str:
    """
    >>> _driver_in('[storage]\\ndriver = "overlay"\\n')
    'overlay'
    >>> _driver_in('[storage]\\n')
    ''
    """
    for line in text.splitlines():
        k, _, v = line.partition("=")
        if k.strip() == "driver":
            return v.strip().strip('"')
    return ""

"""A power cut for Raft members, without device-mapper: what reached each member's disk.

Each member's state directory is an ext4 of its own on a loop device backed by an
image file the test makes. While a member submits continuously, every member is
frozen (SIGSTOP through a pidfd taken at start), the acknowledged keys are read, and
each image is copied with ``O_DIRECT`` reads: the copy holds what the member's
filesystem had sent to its "disk", not what sat dirty in its page cache (the kernel
writes that back after 30 s, ``vm.dirty_expire_centisecs``). The members are then
killed, and a new cluster starts on loop devices of the copies, as after a power cut
of every machine at the moment of the freeze.

Only the images, loop devices, mounts and processes made here are touched; each is
recorded when made and released by :meth:`PowerCut.close`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "cluster"))

from raft_harness import Cluster  # noqa: E402

IMAGE_SIZE = "64M"


def _sh(*argv: str) -> str:
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip() or r.returncode}")
    return r.stdout.strip()


class PowerCut:
    """Voters on loop-mounted ext4 state directories, frozen, copied and restarted."""

    def __init__(self, root: Path, voters: list[str], **conf: Any) -> None:
        self.root, self.voters, self.conf = root, voters, conf
        self.loops: list[str] = []  # loop devices this made, in order
        self.mounts: list[Path] = []
        self.clusters: list[Cluster] = []
        self.pidfds: dict[str, int] = {}

    # ------------------------------------------------------------------ disks

    def _attach(self, image: Path, mnt: Path) -> None:
        dev = _sh("losetup", "--find", "--show", str(image))
        self.loops.append(dev)
        mnt.mkdir(parents=True, exist_ok=True)
        _sh("mount", "-t", "ext4", dev, str(mnt))
        self.mounts.append(mnt)

    def _detach_all(self) -> None:
        while self.mounts:
            mnt = self.mounts.pop()
            subprocess.run(["umount", str(mnt)], capture_output=True, timeout=60)
        while self.loops:
            subprocess.run(["losetup", "-d", self.loops.pop()], capture_output=True, timeout=60)

    def start(self, generation: int, images: dict[str, Path] | None = None) -> Cluster:
        """A cluster under ``root/gen-N`` whose state directories are loop-mounted
        ``images`` (new, empty ext4s when None)."""
        root = self.root / f"gen-{generation}"
        root.mkdir()
        for n in self.voters:
            image = images[n] if images else root / f"{n}.img"
            if images is None:
                _sh("truncate", "-s", IMAGE_SIZE, str(image))
                _sh("mkfs.ext4", "-q", "-F", str(image))
            self._attach(image, root / f"state-{n}")
        c = Cluster(root, self.voters, **self.conf)
        self.clusters.append(c)
        c.start(*self.voters)
        for n in self.voters:
            self.pidfds[n] = os.pidfd_open(c.procs[n].proc.pid)
        return c

    # ------------------------------------------------------------------ the cut

    def cut(self, c: Cluster, min_acked: int, timeout: float = 60.0) -> tuple[set[str], dict[str, Path]]:
        """Submit continuously through the leader until ``min_acked`` writes are
        acknowledged, freeze every member, and copy each disk as it is then.
        Returns the acknowledged keys and the copies."""
        leader = c.leader()
        c.call(leader, "stream", prefix="k", batch=32)
        deadline = time.monotonic() + timeout
        while len(c.acked()) < min_acked:
            assert time.monotonic() < deadline, f"only {len(c.acked())} writes acknowledged in {timeout:.0f}s"
            time.sleep(0.05)
        for n in self.voters:
            signal.pidfd_send_signal(self.pidfds[n], signal.SIGSTOP)
        # An acknowledgement is logged before it is given, so once frozen this is all.
        acked = set(c.acked())
        copies: dict[str, Path] = {}
        for n in self.voters:
            image = c.root / f"{n}.img"
            copy = self.root / f"{n}-at-cut.img"
            _sh("dd", f"if={image}", f"of={copy}", "bs=1M", "iflag=direct", "status=none")
            copies[n] = copy
        for n in self.voters:
            signal.pidfd_send_signal(self.pidfds[n], signal.SIGKILL)
            c.procs[n].proc.wait(10)
            os.close(self.pidfds.pop(n))
        self._detach_all()
        return acked, copies

    def close(self) -> None:
        for c in self.clusters:
            c.close()
        for fd in self.pidfds.values():
            os.close(fd)
        self.pidfds.clear()
        self._detach_all()


def recovered(c: Cluster, voters: list[str], acked: set[str]) -> dict[str, Any]:
    """After a restart: what each acknowledged key's presence and the applies say.

    A restarted member applies nothing from its journal until the new leader commits
    an entry of its own term (PySyncObj does not keep the commit index on disk), so
    right after the election every member holds the same empty data. One write
    through the new leader, acknowledged, commits every entry before it; the members
    are compared once each holds that write."""
    leader = c.leader(timeout=60)
    done = c.call(leader, "seq", prefix="after-cut.", n=1, timeout=60)
    assert done["ok"] == 1, f"no write committed after the restart: {done}"
    deadline = time.monotonic() + 60
    while not all(c.call(n, "has", key="after-cut.0")["has"] for n in voters):
        assert time.monotonic() < deadline, "the write after the restart did not reach every voter"
        time.sleep(0.05)
    st = c.converge(voters, timeout=60)
    miss = c.call(voters[0], "missing", keys=sorted(acked), timeout=60)
    return {"missing": miss["missing"], "sample": miss["sample"], "n": st["n"], "puts": st["puts"]}

"""A power cut for Raft members, without device-mapper: what reached each member's disk.

Each member's state directory is an ext4 of its own on a loop device backed by an
image file the test makes. While a member submits continuously, every member is
frozen (SIGSTOP through a pidfd taken at start), the acknowledged keys are read, and
each image is copied with ``O_DIRECT`` reads: the copy holds what the member's
filesystem had sent to its "disk", not what sat dirty in its page cache (the kernel
writes that back after 30 s, ``vm.dirty_expire_centisecs``). The members are then
killed, and a new cluster starts on loop devices of the copies, as after a power cut
of every machine at the moment of the freeze.

Restarting every voter lets the most complete disk win the election, which hides a
voter that acknowledged what it had not synced. :meth:`PowerCut.restart_pairs`
restarts each pair of voters alone instead (each on copies of its two images), so an
acknowledged write must be on disk on at least one voter of every pair: on a majority.
``lag`` in :meth:`PowerCut.cut` freezes one follower first, so that the writes
acknowledged after it are on the leader's disk and one follower's alone: the pair
without that follower holds them only if the leader synced its own entries before it
counted them, and the pair without the leader only if that follower synced before
acknowledging.

Only the images, loop devices, mounts and processes made here are touched; each is
recorded when made and released by :meth:`PowerCut.close`.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "cluster"))

from raft_harness import Cluster, MemberProc  # noqa: E402

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
        self.pidfds: dict[str, int] = {}  # "<generation dir>/<member>" -> pidfd
        #: Whether each member's state directory held a full dump when it was mounted.
        self.dumps: dict[str, bool] = {}
        #: What the last cut saw: the leader, the follower frozen first (if any),
        #: how many writes were acknowledged without it, and each voter's audit
        #: (``raft_harness._Member.cmd_audit``) just before it was frozen.
        self.last: dict[str, Any] = {}

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

    def _disks(self, root: Path, names: list[str], images: dict[str, Path] | None) -> None:
        """Loop-mount a state directory per member under ``root``: a new, empty ext4
        when ``images`` is None, else a copy of ``images[name]`` (the cut images stay
        as they were, for the next restart)."""
        root.mkdir()
        for n in names:
            image = root / f"{n}.img"
            if images is None:
                _sh("truncate", "-s", IMAGE_SIZE, str(image))
                _sh("mkfs.ext4", "-q", "-F", str(image))
            else:
                _sh("cp", "--sparse=always", str(images[n]), str(image))
            self._attach(image, root / f"state-{n}")
            self.dumps[f"{root.name}/{n}"] = (root / f"state-{n}" / "raft.dump").exists()

    def _pin(self, c: Cluster, names: list[str]) -> None:
        for n in names:
            self.pidfds[f"{c.root.name}/{n}"] = os.pidfd_open(c.procs[n].proc.pid)

    def start(self, generation: int, images: dict[str, Path] | None = None, **conf: Any) -> Cluster:
        """A cluster of every voter under ``root/gen-N`` whose state directories are
        loop-mounted ``images`` (new, empty ext4s when None); ``conf`` adds to the
        options given at construction."""
        root = self.root / f"gen-{generation}"
        self._disks(root, self.voters, images)
        c = Cluster(root, self.voters, **{**self.conf, **conf})
        self.clusters.append(c)
        c.start(*self.voters)
        self._pin(c, self.voters)
        return c

    def restart_pairs(self, images: dict[str, Path], **conf: Any) -> dict[tuple[str, str], Cluster]:
        """For every pair of voters, a cluster (of all the voters) of which only that
        pair runs, each member on a copy of its image: a majority without the third.
        The pairs start together."""
        pairs = list(itertools.combinations(self.voters, 2))
        out: dict[tuple[str, str], Cluster] = {}
        for pair in pairs:
            root = self.root / f"pair-{'-'.join(pair)}"
            self._disks(root, list(pair), images)
            c = Cluster(root, self.voters, **{**self.conf, **conf})
            self.clusters.append(c)
            out[pair] = c
            for n in pair:
                c.procs[n] = MemberProc(c, n, readonly=False)
        for pair, c in out.items():
            for n in pair:
                c.procs[n].wait_ready()
            self._pin(c, list(pair))
        return out

    # ------------------------------------------------------------------ the cut

    def _freeze(self, c: Cluster, names: list[str]) -> None:
        """SIGSTOP ``names`` (through their pidfds), in that order, and wait until
        each is stopped."""
        for n in names:
            signal.pidfd_send_signal(self.pidfds[f"{c.root.name}/{n}"], signal.SIGSTOP)
        deadline = time.monotonic() + 10
        for n in names:
            stat = Path(f"/proc/{c.procs[n].proc.pid}/stat")
            while stat.read_text().rsplit(")", 1)[1].split()[0] != "T":
                assert time.monotonic() < deadline, f"{n} did not stop"
                time.sleep(0.002)

    def _wait_acked(self, c: Cluster, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(c.acked()) < n:
            assert time.monotonic() < deadline, f"only {len(c.acked())} writes acknowledged in {timeout:.0f}s"
            time.sleep(0.02)

    def cut(
        self, c: Cluster, min_acked: int, timeout: float = 60.0, lag: int = 0
    ) -> tuple[set[str], dict[str, Path]]:
        """Submit continuously through the leader until ``min_acked`` writes are
        acknowledged, freeze every member, and copy each disk as it is then.
        With ``lag``, one follower is frozen at ``min_acked`` and the others go on
        until ``lag`` more are acknowledged (by the leader and the other follower).
        Returns the acknowledged keys and the copies."""
        leader = c.leader()
        self.last = {"leader": leader, "laggard": None, "audit": {}}
        c.call(leader, "stream", prefix="k", batch=32)
        self._wait_acked(c, min_acked, timeout)
        order = [n for n in self.voters if n != leader] + [leader]  # the followers first
        if lag:
            laggard = order.pop(0)
            self.last["audit"][laggard] = c.call(laggard, "audit")
            self._freeze(c, [laggard])
            before = len(c.acked())
            self._wait_acked(c, before + lag, timeout)
            self.last.update(laggard=laggard, acked_before_lag=before)
        for n in order:
            self.last["audit"][n] = c.call(n, "audit")
        # Cut right after an acknowledgement: a follower that acknowledged before its
        # fsync is then most likely still short of it.
        self._wait_acked(c, len(c.acked()) + 1, timeout)
        self._freeze(c, order)
        # An acknowledgement is logged before it is given, so once frozen this is all.
        acked = set(c.acked())
        copies: dict[str, Path] = {}
        for n in self.voters:
            image = c.root / f"{n}.img"
            copy = self.root / f"{n}-at-cut.img"
            _sh("dd", f"if={image}", f"of={copy}", "bs=1M", "iflag=direct", "status=none")
            copies[n] = copy
        for n in self.voters:
            signal.pidfd_send_signal(self.pidfds[f"{c.root.name}/{n}"], signal.SIGKILL)
            c.procs[n].proc.wait(10)
            os.close(self.pidfds.pop(f"{c.root.name}/{n}"))
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

#!/usr/bin/env python3
"""Raft over SSH channels: commit throughput and failover time, 3 members on loopback.

Each member is a separate process with its own asyncssh server, PySyncObj with
MTGPU's configuration (``make_conf``) and the SSH transport, as in the tests
(``tests/cluster/raft_harness.py``). Measured:

* asynchronous submissions with acknowledgements, on the leader and through a
  follower (DESIGN target: >= 1000/s acknowledged);
* sequential commits (each awaited before the next), i.e. commit latency;
* time to a new leader, and to its first commit, after kill -9 of the leader,
  over ``--kills`` kills (the killed member is restarted and caught up each time);
* idle CPU per member.

The same run is repeated over PySyncObj's stock TCP transport as a baseline. Failed
or unacknowledged writes and leader changes under load are reported, not hidden:
PySyncObj's apply loop can starve heartbeats when thousands of commands arrive at
once on a small machine, with either transport.

Run from the repository root:

    /opt/mtgpu-test/bin/python benchmarks/raft_transport.py [--writes 10000] [--kills 12] [--no-tcp] \
        [--fsync both|on|off] [--dir DIR]

With ``--fsync both`` (the default) the SSH transport runs twice in the same run:
with each member's journal fsynced before it counts or reports an entry (as the
daemon runs, mtgpu/state/durable.py) and without.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "cluster"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from raft_harness import Cluster  # noqa: E402

VOTERS = ["n1", "n2", "n3"]


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 1048576:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    import asyncssh
    import pysyncobj.version

    return (
        f"{cpu}, {os.cpu_count()} CPUs{mem}; {platform.system()} {platform.release()}; "
        f"Python {platform.python_version()}, asyncssh {asyncssh.__version__}, "
        f"pysyncobj {pysyncobj.version.VERSION}"
    )


def fs_of(path: str) -> str:
    """The filesystem type and device holding ``path``."""
    best, kind = "", "unknown"
    for line in Path("/proc/mounts").read_text().splitlines():
        dev, mnt, fstype = line.split()[:3]
        if os.path.realpath(path).startswith(mnt.rstrip("/") + "/") and len(mnt) > len(best):
            best, kind = mnt, f"{fstype} on {dev}"
    return kind


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * len(xs) + 0.5) - 1))]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench(args: argparse.Namespace, tcp: bool, fsync: bool = True) -> dict[str, str]:
    """Every figure for one transport, as printable strings. ``fsync``: the SSH
    transport's members sync their journal before acknowledging (as the daemon does);
    the TCP baseline is stock PySyncObj, which does not."""
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="raft-bench-", dir=args.dir) as tmp:
        c = Cluster(Path(tmp), VOTERS, tcp=tcp, **({} if tcp else {"fsync": fsync}))
        try:
            t0 = time.monotonic()
            c.start(*VOTERS)
            up = time.monotonic()
            leader = c.leader()
            out["first leader"] = (
                f"{time.monotonic() - up:.2f}s after the members were up "
                f"({time.monotonic() - t0:.2f}s from spawn)"
            )

            rates, notes = [], []
            for r in range(args.rounds):
                term = c.call(leader, "status")["term"]
                res = c.call(leader, "write", prefix=f"a{r}-", n=args.writes, wait=120, timeout=150)
                rates.append(res["ok"] / res["secs"])
                if res["ok"] != args.writes:
                    notes.append(
                        f"round {r}: {res['ok']} acked, failed {res['fail']}, {res['pending']} pending"
                    )
                if c.call(leader, "status")["term"] != term:
                    notes.append(f"round {r}: the leader changed under load")
                leader = c.leader()
            out[f"async+ack on the leader ({args.writes} at once)"] = (
                f"median {statistics.median(rates):,.0f}/s ["
                + ", ".join(f"{x:,.0f}" for x in rates)
                + "]"
                + ("; " + "; ".join(notes) if notes else "")
            )
            follower = next(n for n in VOTERS if n != leader)
            n = args.writes // 4
            res = c.call(follower, "write", prefix="f-", n=n, wait=120, timeout=150)
            out[f"async+ack through a follower ({n})"] = f"{res['ok'] / res['secs']:,.0f}/s" + (
                f" ({res['ok']} acked)" if res["ok"] != n else ""
            )
            leader = c.leader()
            res = c.call(leader, "seq", prefix="s-", n=args.seq, timeout=120)
            out[f"sequential commits on the leader ({args.seq})"] = (
                f"{res['ok'] / res['secs']:,.0f}/s ({1000 * res['secs'] / max(1, res['ok']):.2f} ms each)"
            )
            c.converge(VOTERS, timeout=60)

            time.sleep(1.0)
            pids = {n: c.procs[n].proc.pid for n in VOTERS}
            before = {n: cpu_seconds(p) for n, p in pids.items()}
            time.sleep(args.idle)
            idle = [100 * (cpu_seconds(p) - before[n]) / args.idle for n, p in pids.items()]
            out["idle CPU per member"] = ", ".join(f"{v:.1f}%" for v in idle) + " of a core"

            to_leader, to_commit = [], []
            for k in range(args.kills):
                old = c.leader()
                others = [n for n in VOTERS if n != old]
                t0 = time.monotonic()
                c.kill(old)
                new = c.leader(among=others, exclude=old, timeout=30)
                to_leader.append(time.monotonic() - t0)
                res = c.call(new, "write", prefix=f"k{k}-", n=1, wait=30, timeout=40)
                assert res["ok"] == 1, res
                to_commit.append(time.monotonic() - t0)
                c.start(old)
                c.converge(VOTERS, timeout=60)
                c.leader(among=VOTERS)
            if args.kills:
                out[f"kill -9 leader, n={args.kills}: new leader"] = (
                    f"p50 {pct(to_leader, 50):.2f}s p99 {pct(to_leader, 99):.2f}s "
                    f"[" + " ".join(f"{x:.2f}" for x in to_leader) + "]"
                )
                out[f"kill -9 leader, n={args.kills}: first commit"] = (
                    f"p50 {pct(to_commit, 50):.2f}s p99 {pct(to_commit, 99):.2f}s"
                )
        finally:
            c.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--writes", type=int, default=10000, help="async submissions per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seq", type=int, default=1000, help="sequential commits")
    ap.add_argument("--kills", type=int, default=12)
    ap.add_argument("--idle", type=float, default=5.0, help="seconds of idle CPU sampling")
    ap.add_argument(
        "--no-tcp", action="store_true", help="skip the baseline run over PySyncObj's own TCP transport"
    )
    ap.add_argument(
        "--fsync",
        choices=("both", "on", "off"),
        default="both",
        help="SSH transport runs with the journal synced before each acknowledgement "
        "(on, as the daemon runs), left to the kernel's writeback (off), or both",
    )
    ap.add_argument("--dir", default=None, help="where the members' journals go (default: $TMPDIR)")
    args = ap.parse_args()

    print(f"machine: {machine()}")
    print(
        "conf: mtgpu.state.store.make_conf (appendEntriesUseBatch=False, journal on disk, "
        "raft timeouts 0.4-1.4 s)"
    )
    print(f"journals under: {args.dir or tempfile.gettempdir()} ({fs_of(args.dir or tempfile.gettempdir())})")
    runs = [(False, f) for f in {"both": (True, False), "on": (True,), "off": (False,)}[args.fsync]]
    for tcp, fsync in runs + ([] if args.no_tcp else [(True, False)]):
        name = (
            "PySyncObj TCPTransport (baseline, no fsync)"
            if tcp
            else (f"SshRaftTransport over asyncssh, fsync {'on' if fsync else 'off'}")
        )
        print(f"\n== {name}")
        for k, v in bench(args, tcp, fsync).items():
            print(f"  {k}: {v}")


if __name__ == "__main__":
    main()

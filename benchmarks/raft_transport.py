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

    /opt/mtgpu-test/bin/python benchmarks/raft_transport.py [--writes 10000] [--kills 12] [--no-tcp]
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

    return (f"{cpu}, {os.cpu_count()} CPUs{mem}; {platform.system()} {platform.release()}; "
            f"Python {platform.python_version()}, asyncssh {asyncssh.__version__}, "
            f"pysyncobj {pysyncobj.version.VERSION}")


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * len(xs) + 0.5) - 1))]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench(args: argparse.Namespace, tcp: bool) -> dict[str, str]:
    """Every figure for one transport, as printable strings."""
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="raft-bench-") as tmp:
        c = Cluster(Path(tmp), VOTERS, tcp=tcp)
        try:
            t0 = time.monotonic()
            c.start(*VOTERS)
            up = time.monotonic()
            leader = c.leader()
            out["first leader"] = (f"{time.monotonic() - up:.2f}s after the members were up "
                                   f"({time.monotonic() - t0:.2f}s from spawn)")

            rates, notes = [], []
            for r in range(args.rounds):
                term = c.call(leader, "status")["term"]
                res = c.call(leader, "write", prefix=f"a{r}-", n=args.writes, wait=120, timeout=150)
                rates.append(res["ok"] / res["secs"])
                if res["ok"] != args.writes:
                    notes.append(f"round {r}: {res['ok']} acked, failed {res['fail']}, "
                                 f"{res['pending']} pending")
                if c.call(leader, "status")["term"] != term:
                    notes.append(f"round {r}: the leader changed under load")
                leader = c.leader()
            out[f"async+ack on the leader ({args.writes} at once)"] = (
                f"median {statistics.median(rates):,.0f}/s [" + ", ".join(f"{x:,.0f}" for x in rates)
                + "]" + ("; " + "; ".join(notes) if notes else ""))
            follower = next(n for n in VOTERS if n != leader)
            n = args.writes // 4
            res = c.call(follower, "write", prefix="f-", n=n, wait=120, timeout=150)
            out[f"async+ack through a follower ({n})"] = f"{res['ok'] / res['secs']:,.0f}/s" + (
                f" ({res['ok']} acked)" if res["ok"] != n else "")
            leader = c.leader()
            res = c.call(leader, "seq", prefix="s-", n=args.seq, timeout=120)
            out[f"sequential commits on the leader ({args.seq})"] = (
                f"{res['ok'] / res['secs']:,.0f}/s ({1000 * res['secs'] / max(1, res['ok']):.2f} ms each)")
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
                    f"[" + " ".join(f"{x:.2f}" for x in to_leader) + "]")
                out[f"kill -9 leader, n={args.kills}: first commit"] = (
                    f"p50 {pct(to_commit, 50):.2f}s p99 {pct(to_commit, 99):.2f}s")
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
    ap.add_argument("--no-tcp", action="store_true",
                    help="skip the baseline run over PySyncObj's own TCP transport")
    args = ap.parse_args()

    print(f"machine: {machine()}")
    print("conf: mtgpu.state.store.make_conf (appendEntriesUseBatch=False, journal on disk, "
          "raft timeouts 0.4-1.4 s)")
    for tcp in ([False] if args.no_tcp else [False, True]):
        print(f"\n== {'PySyncObj TCPTransport (baseline)' if tcp else 'SshRaftTransport over asyncssh'}")
        for k, v in bench(args, tcp).items():
            print(f"  {k}: {v}")


if __name__ == "__main__":
    main()

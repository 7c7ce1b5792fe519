#!/usr/bin/env python3
"""Scheduler failover and replicated submission throughput, on real members.

Three real mtgpu-server members, each in a network namespace of its own, form a
cluster. Then, repeatedly: kill -9 the scheduler (the Raft leader), measure the time
until the survivors agree on a new scheduler and until the first write commits
through it, and restart the killed member. Finally, measure acknowledged job
submissions per second through the scheduler's API socket from many concurrent
clients (a tenant's, identified by SO_PEERCRED).

Run as root from the repository root:

    /opt/mtgpu-test/bin/python benchmarks/failover.py [--kills 20] [--submissions 2000]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from mtgpu_testing import Host, Network  # noqa: E402
from mtgpu_testing import agreed_scheduler as leader_of

KEY = "benchmark-cluster-key-0123456789"


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


SUBMITTER = r"""
import json, socket, sys, threading, time
path, n, conns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
script = "#!/bin/bash\n#MTGPU cpus=1 ram=20G\nsleep 600\n"
done = [0]
def worker(k):
    s = socket.socket(socket.AF_UNIX); s.connect(path)
    f = s.makefile("rb")
    for i in range(k):
        req = {"op": "job.submit", "args": {"script": script, "workdir": "/tmp"}, "id": i}
        s.sendall(json.dumps(req).encode() + b"\n")
        ans = json.loads(f.readline())
        assert ans["ok"], ans
        done[0] += 1
t0 = time.perf_counter()
ts = [threading.Thread(target=worker, args=(n // conns,)) for _ in range(conns)]
[t.start() for t in ts]; [t.join() for t in ts]
print(json.dumps({"acked": done[0], "seconds": time.perf_counter() - t0}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--submissions", type=int, default=2000)
    ap.add_argument("--connections", type=int, default=16)
    args = ap.parse_args()
    net = Network()
    hosts = [
        net.add(
            Host(
                {
                    "CLUSTER_MODE": "cluster",
                    "CLUSTER_ID": "bench",
                    "CLUSTER_KEY": KEY,
                    "SIMULATED_CPUS": 8,
                    "USAGE_SAMPLE_INTERVAL": 1,
                    "USER_SUBMIT_RATE": None,
                },
                name=f"m{i}",
            )
        )
        for i in range(1, 4)
    ]
    for h in hosts:
        h.config["CLUSTER_PEERS"] = [f"{o.address}:{o.port}" for o in hosts if o is not h]
        h.write_config()
    try:
        threads = [threading.Thread(target=h.start, kwargs={"timeout": 120}) for h in hosts]
        [t.start() for t in threads]
        [t.join() for t in threads]
        while leader_of(hosts) is None:
            time.sleep(0.2)
        to_leader, to_write = [], []
        for k in range(args.kills):
            leader = leader_of(hosts)
            while leader is None:
                time.sleep(0.1)
                leader = leader_of(hosts)
            victim = next(h for h in hosts if h.config["SERVER_NAME"] == leader)
            survivors = [h for h in hosts if h is not victim]
            t0 = time.perf_counter()
            victim.stop(signal.SIGKILL)
            new = None
            while new is None or new == leader:
                time.sleep(0.02)
                new = leader_of(survivors)
            t1 = time.perf_counter()
            entry = survivors[0]
            while True:
                r = entry.api("invite", name=f"bench{k}")
                if r.get("ok"):
                    break
                time.sleep(0.02)
            t2 = time.perf_counter()
            to_leader.append(t1 - t0)
            to_write.append(t2 - t0)
            victim.start(timeout=120)
            while True:
                st = victim.api("cluster.status")
                if st.get("ok") and sum(m["state"] == "up" for m in st["result"]["members"]) == 3:
                    break
                time.sleep(0.2)
        print(f"# failover: {args.kills} kill -9 of the scheduler, 3 members in network namespaces")
        print(
            f"new scheduler     p50 {statistics.median(to_leader):.2f} s  p99 {pct(to_leader, 99):.2f} s  "
            f"max {max(to_leader):.2f} s"
        )
        print(
            f"first commit      p50 {statistics.median(to_write):.2f} s  p99 {pct(to_write, 99):.2f} s  "
            f"max {max(to_write):.2f} s"
        )
        leader = next(h for h in hosts if h.config["SERVER_NAME"] == leader_of(hosts))
        key = leader.add_user("benchy")
        leader.ssh("benchy", key, "true")
        uid = leader.passwd("benchy")[2]
        out = subprocess.run(
            [
                "nsenter",
                "-t",
                str(leader._server_pid()),
                "-m",
                "setpriv",
                f"--reuid={uid}",
                f"--regid={uid}",
                "--clear-groups",
                sys.executable,
                "-c",
                SUBMITTER,
                str(leader.run_dir / "api.sock"),
                str(args.submissions),
                str(args.connections),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        r = json.loads(out.stdout or "{}") if out.returncode == 0 else None
        if r:
            print(
                f"replicated submissions: {r['acked']} acknowledged in {r['seconds']:.2f} s = "
                f"{r['acked'] / r['seconds']:.0f}/s ({args.connections} connections, "
                "each submission committed to a majority of 3 voters)"
            )
        else:
            print("submission run failed:", out.stderr[-2000:])
        cpu = Path("/proc/cpuinfo").read_text().split("model name")[1].split("\n")[0].strip(" :\t")
        print(f"machine: {cpu}, {len(Path('/proc/cpuinfo').read_text().split('processor')) - 1} cores")
        return 0
    finally:
        for h in hosts:
            h.cleanup()
        net.close()


if __name__ == "__main__":
    sys.exit(main())

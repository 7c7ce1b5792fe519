#!/usr/bin/env python3
"""Start-up cost of the two mt-job clients: the Python one and the C fast path
(``mtgpu/cli/fastjob.c``, which mtgpu-setup installs as ``mt-job`` where a C compiler
exists).

A real daemon (the test harness's: private mount namespace and /etc, root) with one
tenant and a few jobs in the queue. Over ONE ssh session, as the tenant, each client
runs ``mt-job list --json`` N times in a shell loop, timed by the session's own clock,
so the figure is the per-call cost of a poller (start-up plus one API request), not
ssh's. Also ``mt-job list`` (the table: the C client hands it to the Python one, so it
costs both) and ``mt-job submit --parsable -``, the other command the C client does
itself.

    sudo /opt/mtgpu-test/bin/python benchmarks/mtjob_startup.py [-n 200] [--json]

Timings are printed with the machine they ran on; nothing here is asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

JOB = "#!/bin/sh\n#MTGPU cpus=1 ram=10M name=bench\nsleep 600\n"


def _loop(cmd: str, n: int, stdin_file: str | None = None) -> str:
    redirect = f" < {shlex.quote(stdin_file)}" if stdin_file else ""
    return (
        f"s=$(date +%s%N); i=0; while [ $i -lt {n} ]; do {cmd}{redirect} >/dev/null || exit 9; "
        f"i=$((i+1)); done; e=$(date +%s%N); echo $(( (e - s) / {n} ))"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=200, help="calls per client and command (default 200)")
    p.add_argument("--submit-n", type=int, default=50, help="submissions per client (default 50)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("mtjob_startup.py starts a real daemon: run it as root", file=sys.stderr)
        return 2
    import mtgpu_testing
    from mtgpu_testing import Host

    fast = mtgpu_testing.fast_mtjob()
    py = Path(sys.executable).parent / "mt-job"
    host = Host({"SIMULATED_CPUS": 2, "USER_SUBMIT_RATE": None, "USER_MAX_QUEUED_JOBS": 100000})
    results: dict[str, dict[str, float]] = {}
    try:
        host.start()
        key = host.add_user("bench")
        assert host.ssh("bench", key, "true").returncode == 0
        job_file = "job.sh"  # in the tenant's home, where its sessions start
        r = host.ssh("bench", key, f"cat > {job_file}", input=JOB.encode())
        assert r.returncode == 0, r.stderr
        for _ in range(5):  # a queue to list: one running, the rest pending
            assert host.ssh("bench", key, f"{py} submit --parsable {job_file}").returncode == 0
        clients = (("python", py), ("c", fast))
        # The lists first, each client in turn, so both list the same queue.
        for what in ("list --json", "list"):
            for client, exe in clients:
                r = host.ssh("bench", key, _loop(f"{exe} {what}", args.n), timeout=1800)
                assert r.returncode == 0, (client, what, r.stderr)
                results.setdefault(client, {})[what] = int(r.stdout.decode().split()[-1]) / 1e6
        for client, exe in clients:
            what = "submit --parsable -"
            r = host.ssh("bench", key, _loop(f"{exe} {what}", args.submit_n, job_file), timeout=1800)
            assert r.returncode == 0, (client, what, r.stderr)
            results[client][what] = int(r.stdout.decode().split()[-1]) / 1e6
    finally:
        host.cleanup()
    machine = f"{platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}"
    if args.json:
        print(json.dumps({"machine": machine, "n": args.n, "ms_per_call": results}, indent=2))
        return 0
    print(
        f"mt-job start-up, ms per call over one ssh session ({machine}; n={args.n}, submit n={args.submit_n})"
    )
    print(f"{'command':<22}{'Python':>10}{'C':>10}{'C/Python':>10}")
    for what in results["python"]:  # ms per call
        a, b = results["python"][what], results["c"][what]
        print(f"{what:<22}{a:>10.1f}{b:>10.1f}{b / a:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

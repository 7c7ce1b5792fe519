"""A year of usage for 1,000 tenants: how big the replicated state's usage sums get.

Feeds the job table's usage sums (:mod:`mtgpu.schedd.usage`, what every replica keeps
in its state and in each dump PySyncObj writes) with the ends of synthetic jobs: each
tenant (all of them, every day) runs ``--jobs-per-day`` jobs a day, each on one of ``--members`` members with one
of ``--gpu-types`` GPU types (seeded random), some across midnight, for ``--days`` days.
Each simulated day starts with what the server's retention pass does: days older than
DAILY_DAYS rolled into months, rows older than ``--retention-days`` dropped. The job
records themselves are gone after JOB_RETENTION_DAYS and are not counted here.
Then it prints the rows kept, the size of the pickled state and of its gzip'd dump
(level 1, as MTGPU writes them), the time to sum one month's report for everyone, and
checks the figure against ``--limit-mib`` (exit 1 when over).

    /opt/mtgpu-test/bin/python benchmarks/usage_state.py
    /opt/mtgpu-test/bin/python benchmarks/usage_state.py --tenants 1000 --days 365 --jobs-per-day 20
"""

from __future__ import annotations

import argparse
import calendar
import gzip
import io
import os
import pickle
import platform
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from mtgpu.schedd import usage  # noqa: E402
from mtgpu.schedd.jobtable import JobTable  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tenants", type=int, default=1000)
    ap.add_argument("--days", type=int, default=365)
    ap.add_argument("--jobs-per-day", type=int, default=4)
    ap.add_argument("--members", type=int, default=8, help="members a tenant's jobs spread over")
    ap.add_argument("--retention-days", type=float, default=400, help="USAGE_RETENTION_DAYS")
    ap.add_argument("--gpu-types", type=int, default=2)
    ap.add_argument("--limit-mib", type=float, default=64.0, help="the stated bound on the dump")
    a = ap.parse_args()
    rnd = random.Random(33)
    t = JobTable()
    day0 = calendar.timegm((2026, 1, 1, 0, 0, 0))
    types = [f"gpu{i}" for i in range(a.gpu_types)]
    started = time.perf_counter()
    n = 0
    for d in range(a.days):
        # What the server's retention pass does each hour: old days rolled into months.
        now = day0 + d * 86400
        t.purge_usage(
            usage.day_of(now - a.retention_days * 86400),
            usage.day_of(now - usage.DAILY_DAYS * 86400)[:8] + "01",
            _doApply=True,
        )
        for u in range(a.tenants):
            for _ in range(a.jobs_per_day):
                start = day0 + d * 86400 + rnd.uniform(0, 86400)
                end = start + rnd.uniform(10, 4 * 3600)
                node = f"n{rnd.randrange(a.members)}"
                gpus = rnd.choice((0, 1, 1, 2, 4))
                job = {
                    "user": f"tenant{u:04d}",
                    "state": rnd.choice(("COMPLETED", "COMPLETED", "COMPLETED", "FAILED")),
                    "start_time": start,
                    "end_time": end,
                    "placement": {
                        "members": [
                            {"node": node, "gpu_indices": list(range(gpus)), "cpus": rnd.choice((1, 4, 8))}
                        ]
                    },
                    "gpu_info": {node: [{"type": rnd.choice(types)}] * gpus},
                    "usage": {node: {"cpu_user": rnd.uniform(0, 1000), "cpu_system": rnd.uniform(0, 50)}},
                }
                usage.charge(t.usage, job)
                n += 1
    fed = time.perf_counter() - started
    state = t._serialize()
    raw = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=1) as gz:
        gz.write(raw)
    dumped = len(buf.getvalue())
    t0 = time.perf_counter()
    first, last = usage.this_month(day0 + 40 * 86400)
    rows = usage.summarize(t.usage, first, last, ("user",))
    report_s = time.perf_counter() - t0
    mib = 1 << 20
    print(
        f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    print(
        f"fed {n:,} job ends ({a.tenants} tenants x {a.days} days x {a.jobs_per_day} jobs, "
        f"{a.members} members, {a.gpu_types} GPU types) in {fed:.1f} s"
    )
    daily = sum(1 for k in t.usage if k[7] == "-")
    print(
        f"usage rows kept: {len(t.usage):,} ({daily:,} by day for the last {usage.DAILY_DAYS} days or "
        f"fewer, {len(t.usage) - daily:,} by month)"
    )
    print(f"pickled state: {len(raw) / mib:.1f} MiB ({len(raw) / max(1, len(t.usage)):.0f} bytes a row)")
    print(f"gzip'd dump (level 1): {dumped / mib:.1f} MiB")
    print(f"one month's report for all {len(rows)} tenants: {report_s * 1000:.0f} ms")
    ok = len(raw) / mib <= a.limit_mib
    print(f"bound {a.limit_mib:g} MiB pickled: {'kept' if ok else 'EXCEEDED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

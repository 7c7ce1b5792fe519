"""What measuring a million-file home costs (USER_DISK_LIMIT in scan mode).

Run from the repository root::

    python benchmarks/home_scan.py [--files 1000000] [--dir /var/tmp] [--runs 3] [--keep]

It builds a tenant-like home of ``--files`` entries in a fresh directory under
``--dir`` (on the real disk, not tmpfs): 1,000 files per directory, 1 in 50 with
8 KiB of data, 1 in 1,000 a hard link and 1 in 1,000 a symbolic link. Then it times

- the scanner in this process (``mtgpu.accounts.homescan.scan_home``),
- the scanner as the daemon runs it (``python -m mtgpu.accounts.homescan``, a nice'd
  child process), and
- ``du -s`` on the same tree, the reference,

warm (the tree was just written, so its inodes are cached), and with ``--cold`` also
after dropping the page cache (this disturbs other work on the machine). It prints
entries per second, CPU seconds (user+system) and, for the default 60 s
USER_DISK_SCAN_INTERVAL, the share of one core one such home costs (the daemon
stretches the interval to ten times a round's duration). The targets: the scanner
costs at most twice the CPU of ``du`` (a C program), and a million-file home stays
under 5% of one core at the default interval.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mtgpu.accounts.homescan import scan_home  # noqa: E402


def build(root: str, n: int) -> int:
    per_dir = 1000
    data = b"z" * 8192
    made = 0
    d = 0
    while made < n:
        sub = os.path.join(root, f"proj{d // 100}", f"d{d}")
        os.makedirs(sub)
        made += 1 + (d % 100 == 0)
        for i in range(min(per_dir, n - made)):
            p = os.path.join(sub, f"f{i}")
            if i % 1000 == 999 and i:
                os.link(os.path.join(sub, "f0"), p)
            elif i % 1000 == 998:
                os.symlink("/etc/passwd", p)
            else:
                fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
                if i % 50 == 0:
                    os.write(fd, data)
                os.close(fd)
            made += 1
        d += 1
    return made


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(fn):
    c0, w0 = time.process_time(), time.perf_counter()
    k0 = children_cpu()
    out = fn()
    return out, time.perf_counter() - w0, (time.process_time() - c0) + (children_cpu() - k0)


def drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=1_000_000)
    ap.add_argument("--dir", default="/var/tmp", help="where to build the tree (a real disk)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="also measure after dropping caches")
    ap.add_argument("--keep", action="store_true", help="keep the tree afterwards")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    root = tempfile.mkdtemp(prefix="mtgpu-homescan-", dir=args.dir)
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}")
    print(f"building {args.files:,} entries under {root} ...", flush=True)
    t0 = time.perf_counter()
    made = build(root, args.files)
    print(f"  built {made:,} entries in {time.perf_counter() - t0:.1f}s")
    results: dict[str, list[dict[str, float]]] = {}

    def record(name: str, entries: int, wall: float, cpu: float) -> None:
        results.setdefault(name, []).append({"entries": entries, "wall": wall, "cpu": cpu})

    def one_round(tag: str) -> None:
        u, wall, cpu = timed(lambda: scan_home(root))
        record(f"scan_home{tag}", u.files, wall, cpu)
        r, wall, cpu = timed(
            lambda: subprocess.run(
                [sys.executable, "-m", "mtgpu.accounts.homescan", root],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "PYTHONPATH": os.getcwd()},
            )
        )
        record(f"child process{tag}", json.loads(r.stdout)["files"], wall, cpu)
        d, wall, cpu = timed(
            lambda: subprocess.run(["du", "-s", "-B1", root], capture_output=True, text=True, check=True)
        )
        record(f"du -s{tag}", u.files, wall, cpu)
        du_bytes = int(d.stdout.split()[0])
        assert u.bytes == du_bytes, (u.bytes, du_bytes)

    try:
        for _ in range(args.runs):
            one_round("")
        if args.cold:
            for _ in range(args.runs):
                drop_caches()
                one_round(" (cold)")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    print(f"\n{'what':<26}{'entries/s':>12}{'wall s':>9}{'CPU s':>8}{'CPU vs du':>11}{'core share @60s':>17}")
    summary = {}
    for name, runs in results.items():
        best = min(runs, key=lambda r: r["wall"])
        ref = min(results["du -s" + (" (cold)" if "cold" in name else "")], key=lambda r: r["wall"])
        share = best["cpu"] / max(60.0, 10 * best["wall"])
        summary[name] = {
            **best,
            "entries_per_s": best["entries"] / best["wall"],
            "cpu_vs_du": best["cpu"] / ref["cpu"],
            "core_share_60s": share,
        }
        print(
            f"{name:<26}{best['entries'] / best['wall']:>12,.0f}{best['wall']:>9.2f}"
            f"{best['cpu']:>8.2f}{best['cpu'] / ref['cpu']:>10.2f}x{100 * share:>16.1f}%"
        )
    if args.json:
        print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

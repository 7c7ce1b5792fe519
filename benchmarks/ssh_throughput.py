#!/usr/bin/env python3
"""SSH throughput and login latency: mtgpu-server against OpenSSH's sshd, side by side.

Both servers run on loopback on the same machine, with the same host key and the
same tenant account (created by MTGPU's first login; sshd gets the same public key in
the tenant's ~/.ssh/authorized_keys). The client is OpenSSH's ssh/sftp, told the
cipher with ``-c`` so both servers are measured on the same one, in the same run:
each cipher both servers offer (aes128-gcm, aes256-gcm, aes128-ctr,
chacha20-poly1305). Every transfer is checked by sha256.

Targets: every throughput at least 0.9x OpenSSH's on the same cipher; login to
command (``ssh host true``, the client's default algorithms) at most 0.5x OpenSSH's
time.

Run as root from the repository root:

    /opt/mtgpu-test/bin/python benchmarks/ssh_throughput.py [--size-mib 1024] [--sftp-mib 512] [--logins 20]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from mtgpu_testing import SSH_OPTS, Host, authorize_for_openssh, start_openssh  # noqa: E402


def zeros_sha256(n: int) -> str:
    h = hashlib.sha256()
    block = bytes(1 << 20)
    for _ in range(n >> 20):
        h.update(block)
    return h.hexdigest()


CIPHERS = ["aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "chacha20-poly1305@openssh.com"]
THROUGHPUT_TARGET = 0.9  # mtgpu/openssh, at least
LOGIN_TARGET = 0.5  # mtgpu's time / openssh's, at most


class Target:
    def __init__(self, name: str, port: int, user: str, key: Path, cipher: str | None = None) -> None:
        self.name, self.port, self.user, self.key, self.cipher = name, port, user, key, cipher

    def _opts(self) -> list[str]:
        return [*SSH_OPTS, "-i", str(self.key), *(["-c", self.cipher] if self.cipher else [])]

    def with_cipher(self, cipher: str | None) -> Target:
        return Target(self.name, self.port, self.user, self.key, cipher)

    def ssh(self, *cmd: str) -> list[str]:
        return ["ssh", *self._opts(), "-p", str(self.port), f"{self.user}@127.0.0.1", *cmd]

    def sftp(self, batch: Path) -> list[str]:
        return ["sftp", *self._opts(), "-P", str(self.port), "-b", str(batch), f"{self.user}@127.0.0.1"]


def timed(argv: list[str], **kw) -> tuple[float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, **kw)
    return time.perf_counter() - t, r


def download(t: Target, size: int, expect: str) -> float:
    cmd = f"head -c {size} /dev/zero"
    start = time.perf_counter()
    p = subprocess.Popen(t.ssh(cmd), stdout=subprocess.PIPE)
    h = hashlib.sha256()
    n = 0
    while chunk := p.stdout.read(1 << 20):
        h.update(chunk)
        n += len(chunk)
    p.wait()
    dt = time.perf_counter() - start
    assert n == size and h.hexdigest() == expect, f"{t.name}: download corrupted ({n} bytes)"
    return size / dt


def upload(t: Target, size: int, expect: str, workdir: Path) -> float:
    src = workdir / "up.bin"
    if not src.exists() or src.stat().st_size != size:
        with open(src, "wb") as f:
            f.truncate(size)
    with open(src, "rb") as f:
        dt, r = timed(t.ssh("cat > upload.bin"), stdin=f)
    assert r.returncode == 0, r.stderr
    got = subprocess.run(
        t.ssh("sha256sum upload.bin; rm -f upload.bin"), capture_output=True, text=True
    ).stdout.split()[0]
    assert got == expect, f"{t.name}: upload corrupted"
    return size / dt


def sftp_get_put(t: Target, size: int, expect: str, workdir: Path) -> tuple[float, float]:
    subprocess.run(t.ssh(f"head -c {size} /dev/zero > sftp.bin"), check=True)
    local = workdir / f"sftp-{t.name}.bin"
    batch = workdir / "get.batch"
    batch.write_text(f"get sftp.bin {local}\n")
    dt_get, r = timed(t.sftp(batch))
    assert r.returncode == 0, r.stderr
    assert hashlib.sha256(local.read_bytes()).hexdigest() == expect
    batch.write_text(f"put {local} sftp-up.bin\n")
    dt_put, r = timed(t.sftp(batch))
    assert r.returncode == 0, r.stderr
    got = subprocess.run(
        t.ssh("sha256sum sftp-up.bin; rm -f sftp.bin sftp-up.bin"), capture_output=True, text=True
    ).stdout.split()[0]
    assert got == expect
    local.unlink()
    return size / dt_get, size / dt_put


def login_latency(t: Target, n: int) -> float:
    times = []
    for _ in range(n):
        dt, r = timed(t.ssh("true"))
        assert r.returncode == 0, r.stderr
        times.append(dt)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--sftp-mib", type=int, default=512)
    ap.add_argument("--logins", type=int, default=20)
    ap.add_argument("--reps", type=int, default=2, help="best of N for each transfer")
    args = ap.parse_args()
    size, ssize = args.size_mib << 20, args.sftp_mib << 20
    host = Host(name="bench")
    host.start()
    workdir = Path(tempfile.mkdtemp(prefix="mtgpu-bench-"))
    sshd = None
    try:
        key = host.add_user("bench")
        authorize_for_openssh(host, "bench", key)
        sshd, sport = start_openssh(host)
        targets = [Target("mtgpu", host.port, "bench", key), Target("openssh", sport, "bench", key)]
        expect, sexpect = zeros_sha256(size), zeros_sha256(ssize)
        # rows[metric] = {server: value}; servers alternate within each cipher so a
        # change in the machine's load falls on both.
        rows: dict[str, dict[str, float]] = {}
        for cipher in CIPHERS:
            short = cipher.split("@")[0]
            for base in targets:
                t = base.with_cipher(cipher)

                def get(m: str, short: str = short) -> dict:
                    return rows.setdefault(f"{short} {m}", {})

                get("exec download MB/s")[t.name] = (
                    max(download(t, size, expect) for _ in range(args.reps)) / 1e6
                )
                get("exec upload MB/s")[t.name] = (
                    max(upload(t, size, expect, workdir) for _ in range(args.reps)) / 1e6
                )
                gets, puts = zip(*(sftp_get_put(t, ssize, sexpect, workdir) for _ in range(args.reps)))
                get("sftp get MB/s")[t.name] = max(gets) / 1e6
                get("sftp put MB/s")[t.name] = max(puts) / 1e6
        login = {t.name: login_latency(t, args.logins) * 1e3 for t in targets}
        cpu = Path("/proc/cpuinfo").read_text().split("model name")[1].split("\n")[0].strip(" :\t")
        load = Path("/proc/loadavg").read_text().split()[0]
        print(
            f"# ssh_throughput: {args.size_mib} MiB exec, {args.sftp_mib} MiB sftp, best of {args.reps}, "
            f"{args.logins} logins; sha256 verified; {cpu}, {os.cpu_count()} CPUs, load {load} at the end"
        )
        print(f"| {'cipher, metric':34} | {'mtgpu':>8} | {'openssh':>8} | {'ratio':>6} | target |")
        print(f"| {'-' * 34} | {'-' * 8} | {'-' * 8} | {'-' * 6} | ------ |")
        missed = 0
        for metric, v in rows.items():
            ratio = v["mtgpu"] / v["openssh"]
            ok = ratio >= THROUGHPUT_TARGET
            missed += not ok
            print(
                f"| {metric:34} | {v['mtgpu']:8.1f} | {v['openssh']:8.1f} | {ratio:6.2f} | {'met' if ok else 'NOT MET'} |"
            )
        ratio = login["mtgpu"] / login["openssh"]
        ok = ratio <= LOGIN_TARGET
        missed += not ok
        print(
            f"| {'login to command ms (median)':34} | {login['mtgpu']:8.1f} | {login['openssh']:8.1f} | "
            f"{ratio:6.2f} | {'met' if ok else 'NOT MET'} |"
        )
        print(
            f"targets: throughput mtgpu/openssh >= {THROUGHPUT_TARGET} on the same cipher; "
            f"login mtgpu/openssh time <= {LOGIN_TARGET}; {missed} not met"
        )
        return 0
    finally:
        if sshd is not None:
            sshd.terminate()
        host.cleanup()
        subprocess.run(["rm", "-rf", str(workdir)])


if __name__ == "__main__":
    sys.exit(main())

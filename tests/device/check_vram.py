"""Check VRAM enforcement on a host with a real NVIDIA GPU, and print PASS or FAIL.

Run as root from the repository root, once the test dependencies are installed
(``tests/run.sh`` installs them; the MTGPU virtualenv is its ``MTGPU_TEST_VENV``)::

    /opt/mtgpu-test/bin/python tests/device/check_vram.py

It starts a real ``mtgpu-server`` on this host's real GPUs (the test harness's private
mount namespace and /etc copy), adds a tenant and submits two ``gpu_mode=shared`` jobs
with ``vram=2G`` on GPU 0. Each allocates device memory through the CUDA driver API
(ctypes on ``libcuda.so.1``; no toolkit or framework): the greedy one 1 GiB at a time
up to 8 GiB, the neighbour 1 GiB once. It then checks that the greedy job ends
``OUT_OF_MEMORY`` with "of GPU 0's memory, over its vram=2G" in its reason and in
its standard error, while the neighbour is still RUNNING several watchdog readings
later. Without an NVIDIA GPU it prints SKIP and exits 0. Exit 0 on PASS, 1 on FAIL.

pytest does not collect this file (its name does not start with ``test_``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, ROOT)

# One job: allocate STEP bytes at a time up to TOTAL with cuMemAlloc, say how far it
# got after each step, then hold it all.
_ALLOC = r"""
import ctypes, sys, time
total, step = int(sys.argv[1]), 1 << 30
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0, "cuInit failed"
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0, "cuCtxCreate failed"
held = []
while len(held) * step < total:
    p = ctypes.c_uint64()
    rc = cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(step))
    if rc:
        print("cuMemAlloc failed with CUDA error", rc, flush=True)
        break
    held.append(p)
    print("holding", len(held), "GiB", flush=True)
    time.sleep(0.5)
time.sleep(600)
"""


def job(total: int) -> str:
    return (
        "#!/bin/bash\n#MTGPU gpus=nvidia:1 gpu_mode=shared vram=2G cpus=1 ram=2G time=15m\n"
        f"exec /usr/bin/python3 -c '{_ALLOC}' {total}\n"
    )


def main() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception as exc:  # noqa: BLE001 - no library, no driver: nothing to check
        print(f"SKIP: no NVIDIA GPU here ({exc})")
        return 0
    if not count:
        print("SKIP: no NVIDIA GPU here")
        return 0
    if os.geteuid() != 0 or not shutil.which("ssh"):
        print("FAIL: run as root on a host with the test dependencies (tests/run.sh installs them)")
        return 1
    from mtgpu_testing import Host

    host = Host({"VRAM_WATCH_INTERVAL": 0.5, "VRAM_TOLERANCE": 5})
    failures: list[str] = []
    try:
        host.start()
        key = host.add_user("vramcheck")

        def call(*argv: str, data: bytes | None = None) -> str:
            r = host.ssh("vramcheck", key, "mt-job", *argv, input=data)
            if r.returncode:
                raise RuntimeError(f"mt-job {' '.join(argv)}: {r.stderr.decode().strip()}")
            return r.stdout.decode()

        def state(jid: str) -> dict:
            return json.loads(call("show", jid, "--json"))

        greedy = call("submit", "--parsable", "-", data=job(8 << 30).encode()).strip()
        neighbour = call("submit", "--parsable", "-", data=job(1 << 30).encode()).strip()
        deadline = time.time() + 180
        g = state(greedy)
        while g["state"] in ("PENDING", "RUNNING") and time.time() < deadline:
            time.sleep(0.5)
            g = state(greedy)
        print(json.dumps({"greedy": {k: g.get(k) for k in ("job_id", "state", "reason", "gpus")}}))
        if g["state"] != "OUT_OF_MEMORY":
            failures.append(f"the greedy job ended {g['state']}, not OUT_OF_MEMORY: {g.get('reason')}")
        if "of GPU 0's memory, over its vram=2G" not in (g.get("reason") or ""):
            failures.append(f"the reason does not name the GPU, use and limit: {g.get('reason')!r}")
        err = Path(g["stderr"]).read_text() if g.get("stderr") and os.path.exists(g["stderr"]) else ""
        out = Path(g["stdout"]).read_text() if g.get("stdout") and os.path.exists(g["stdout"]) else ""
        print("greedy stdout:", out.strip().replace("\n", " | "))
        print("greedy stderr:", err.strip().replace("\n", " | "))
        if "over its vram=2G" not in err:
            failures.append("the greedy job's standard error has no line naming its use and limit")
        time.sleep(5)  # ten watchdog readings
        n = state(neighbour)
        print(json.dumps({"neighbour": {k: n.get(k) for k in ("job_id", "state", "reason")}}))
        if n["state"] != "RUNNING":
            failures.append(f"the neighbour within its share is {n['state']}: {n.get('reason')}")
        call("cancel", neighbour)
    except Exception as exc:  # noqa: BLE001 - reported as the failure it is
        failures.append(f"{type(exc).__name__}: {exc}")
    finally:
        host.cleanup()
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print("PASS: the job past its vram was stopped with the reason; its neighbour kept running")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

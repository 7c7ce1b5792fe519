"""MIG devices are GPUs on a real daemon: a job asking for a profile lands on one, sees
it by its MIG UUID, and its device cgroup gives it the card's device file and its own
instance's capability file only. The card itself is never given out whole.

The daemon's simulated GPUs are one whole H100 (GPU 0) and one in MIG mode (GPU 1) cut
into 3g.40gb, 2g.20gb and 1g.10gb: MIG devices 10, 13 and 15 (see
mtgpu.gpuinfo.simulated). Stand-in device files (NVIDIA's major 195, no driver behind
them) stand for /dev/nvidia0, /dev/nvidia1 and each MIG device's
/dev/nvidia-caps/nvidia-capN: the devices cgroup refuses an open with EPERM before any
driver is asked, while an allowed open reaches the kernel's lookup (ENXIO/ENODEV).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import uuid
from pathlib import Path

import pytest
from mtgpu_testing import Host, wait_for

from mtgpu.schedd import cgroups

pytestmark = pytest.mark.root

SYSTEM = cgroups.detect()
needs_devices = pytest.mark.skipif(
    "devices" not in SYSTEM.v1, reason="this kernel has no cgroup v1 devices controller"
)
PY = "/usr/bin/python3"
MIG = {"h100-3g.40gb": 10, "h100-2g.20gb": 13, "h100-1g.10gb": 15}
# Opens each path and prints its name and the errno name (or "opened"), then the
# visibility variable.
PROBE = (
    f"{PY} -c 'import errno, os, sys\n"
    "for p in sys.argv[1:]:\n"
    "    try:\n"
    '        os.close(os.open(p, os.O_RDWR)); print(os.path.basename(p), "opened")\n'
    "    except OSError as e:\n"
    "        print(os.path.basename(p), errno.errorcode[e.errno])\n"
    'print("CUDA", os.environ.get("CUDA_VISIBLE_DEVICES", "-"))\n\''
)


@pytest.fixture(scope="module")
def devdir():
    d = Path(f"/dev/mtgpu-t-{uuid.uuid4().hex[:8]}")
    (d / "nvidia-caps").mkdir(parents=True, mode=0o755)
    try:
        for minor in (0, 1):
            os.mknod(d / f"nvidia{minor}", 0o666 | 0o020000, os.makedev(195, minor))
        for index in MIG.values():
            os.mknod(d / f"nvidia-caps/nvidia-cap{index}", 0o666 | 0o020000, os.makedev(195, 100 + index))
        for p in d.rglob("nvidia*"):
            os.chmod(p, 0o755 if p.is_dir() else 0o666)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def host(devdir):
    h = Host(
        {
            "SIMULATED_GPUS": [
                {"type": "h100", "vram": "80G", "device_dir": str(devdir)},
                {
                    "type": "h100",
                    "vram": "80G",
                    "device_dir": str(devdir),
                    "mig": ["3g.40gb", "2g.20gb", "1g.10gb"],
                },
            ]
        }
    )
    h.start()
    try:
        h.ann = h.add_user("ann")
        yield h
    finally:
        h.cleanup()


def sh(h: Host, cmd: str, **kw):
    return h.ssh("ann", h.ann, cmd, **kw)


def submit(h: Host, script: str) -> str:
    r = sh(h, "mt-job submit --parsable -", input=script.encode())
    assert r.returncode == 0, r.stderr
    return r.stdout.decode().strip()


def show(h: Host, jid: str) -> dict:
    r = sh(h, f"mt-job show {jid} --json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def finished(h: Host, jid: str) -> dict:
    return wait_for(
        lambda: (j := show(h, jid)).get("state") in ("COMPLETED", "FAILED", "CANCELLED") and j,
        120,
        f"job {jid} to end",
    )


def output(h: Host, job: dict) -> dict[str, str]:
    text = sh(h, f"cat {job['stdout']}").stdout.decode()
    return dict(line.split(None, 1) for line in text.splitlines() if line.strip())


def test_the_inventory_shows_mig_devices_under_their_card(host: Host) -> None:
    r = sh(host, "mt-job nodes --json")
    gpus = {g["index"]: g for g in json.loads(r.stdout)[0]["gpus"]}
    assert sorted(gpus) == [0, 1, 10, 13, 15]
    assert gpus[1]["mig_mode"] is True and gpus[1].get("parent") is None
    assert [(gpus[i]["type"], gpus[i]["parent"]) for i in (10, 13, 15)] == [
        ("h100-3g.40gb", 1),
        ("h100-2g.20gb", 1),
        ("h100-1g.10gb", 1),
    ]
    table = host.admin("nodes").stdout
    shown = re.findall(r"\s(\d+)  (\u2514 )?(h100\S*)( MIG)?\s", table)
    assert shown == [
        ("0", "", "h100", ""),
        ("1", "", "h100", " MIG"),
        ("10", "\u2514 ", "h100-3g.40gb", ""),
        ("13", "\u2514 ", "h100-2g.20gb", ""),
        ("15", "\u2514 ", "h100-1g.10gb", ""),
    ], table


@needs_devices
def test_a_profile_job_gets_its_mig_device_by_uuid_and_only_its_capability(host: Host, devdir: Path) -> None:
    """Hostile: the job on the 2g.20gb device tries the card's other instances'
    capability files and the whole H100 next to it; all are walled off."""
    caps = " ".join(f"{devdir}/nvidia-caps/nvidia-cap{i}" for i in MIG.values())
    jid = submit(
        host, f"#!/bin/sh\n#MTGPU gpus=h100-2g.20gb:1\n{PROBE} {devdir}/nvidia0 {devdir}/nvidia1 {caps}\n"
    )
    job = finished(host, jid)
    assert job["state"] == "COMPLETED", job
    assert [g["index"] for g in job["gpus"]] == [13]
    got = output(host, job)
    reached = (errno.errorcode[errno.ENXIO], errno.errorcode[errno.ENODEV])
    assert got["CUDA"] == f"MIG-SIM-{host.config['SERVER_NAME']}-13", got
    assert got["nvidia1"] in reached and got["nvidia-cap13"] in reached, got
    assert (got["nvidia0"], got["nvidia-cap10"], got["nvidia-cap15"]) == ("EPERM",) * 3, got


def test_a_whole_card_request_never_gets_the_card_in_mig_mode(host: Host) -> None:
    first = submit(host, "#!/bin/sh\n#MTGPU gpus=h100:1\nsleep 60\n")
    wait_for(lambda: show(host, first)["state"] == "RUNNING", 60, "the first whole-card job")
    assert [g["index"] for g in show(host, first)["gpus"]] == [0]
    second = submit(host, "#!/bin/sh\n#MTGPU gpus=h100:1\ntrue\n")
    # Card 1 is an idle h100, but in MIG mode: the second whole-card job waits for card 0.
    wait_for(lambda: show(host, second).get("reason"), 30, "the second job's pending reason")
    assert show(host, second)["state"] == "PENDING"
    r = sh(host, "mt-job submit -", input=b"#!/bin/sh\n#MTGPU gpus=h100:2\ntrue\n")
    assert r.returncode != 0 and b"\n" not in r.stderr.strip() and b"Traceback" not in r.stderr, r.stderr
    sh(host, f"mt-job cancel {first} {second}")
    finished(host, first)

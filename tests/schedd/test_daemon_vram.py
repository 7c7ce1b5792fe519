"""VRAM enforcement end to end: real jobs on a real daemon with SIMULATED_GPUS, their
use set with ``mtgpu-admin simulate --job``; a tenant tries to get around it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from mtgpu_testing import show_job, wait_job

pytestmark = pytest.mark.root

CONFIG = {
    "SIMULATED_GPUS": [{"type": "rtx4090", "count": 1, "vram": "24G"}],
    "SIMULATED_CPUS": 16,
    "VRAM_WATCH_INTERVAL": 0.5,
    "VRAM_TOLERANCE": 5,
}


def submit(host, key, user, script):
    r = host.ssh(user, key, "mt-job", "submit", "--parsable", "-", input=script.encode())
    assert r.returncode == 0, r.stderr
    return r.stdout.decode().strip()


def show(host, key, user, jid):
    return show_job(host, user, key, jid)


def wait_state(host, key, user, jid, states, timeout=60):
    return wait_job(host, user, key, jid, lambda j: j["state"] in states, f"one of {sorted(states)}", timeout)


def wait_file(path, timeout=30):
    deadline = time.time() + timeout
    while not (path.exists() and path.read_text().strip()):
        if time.time() > deadline:
            raise AssertionError(f"{path} never written")
        time.sleep(0.2)
    return path.read_text().strip()


@pytest.fixture(scope="module")
def vram_host():
    from mtgpu_testing import Host

    h = Host(CONFIG)
    h.start()
    key = h.add_user("vera")
    yield h, key
    h.cleanup()


SHARED = "#!/bin/bash\n#MTGPU gpus=1 gpu_mode=shared vram=8G cpus=1 ram=200M\n"


def test_shared_job_over_its_vram_stopped_neighbour_keeps_running(vram_host):
    host, key = vram_host
    env_dump = 'env | grep -E "^(XLA_|TF_FORCE|MTGPU_GPU_MEMORY)" | sort; '
    greedy = submit(host, key, "vera", SHARED + env_dump + "sleep 300\n")
    neighbour = submit(host, key, "vera", SHARED + "sleep 300\n")
    wait_state(host, key, "vera", greedy, {"RUNNING"})
    wait_state(host, key, "vera", neighbour, {"RUNNING"})
    # The neighbour holds its whole share, the greedy job 12.5G of its 8G.
    host.admin("simulate", "--job", neighbour, "--used", "8G")
    r = host.admin("simulate", "--job", greedy, "--used", "12.5G", "--json")
    assert json.loads(r.stdout)["gpus"] == [0]
    j = wait_state(host, key, "vera", greedy, {"OUT_OF_MEMORY", "FAILED", "COMPLETED", "CANCELLED"})
    assert j["state"] == "OUT_OF_MEMORY", j
    assert "used 12.5G of GPU 0's memory, over its vram=8G" in j["reason"], j["reason"]
    err = Path(j["stderr"]).read_text()
    assert "used 12.5G of GPU 0's memory, over its vram=8G" in err and "SIGTERM" in err, err
    out = Path(j["stdout"]).read_text().split()
    # Frameworks were told the share: 8G of a 24G card.
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION=0.33" in out and "TF_FORCE_GPU_ALLOW_GROWTH=true" in out
    assert f"MTGPU_GPU_MEMORY={8 << 30}" in out
    time.sleep(2)  # several watchdog readings later
    assert show(host, key, "vera", neighbour)["state"] == "RUNNING"
    host.ssh("vera", key, "mt-job", "cancel", neighbour)
    wait_state(host, key, "vera", neighbour, {"CANCELLED"})


def test_job_cannot_escape_by_a_new_session_or_fake_its_readings(vram_host, tmp_path):
    host, key = vram_host
    home = host.passwd("vera")[5]
    # The job's child starts a session of its own, leaves its parent behind and tries
    # to leave the job's cgroups; the child is the process that holds the VRAM.
    body = (
        "setsid bash -c 'for f in /sys/fs/cgroup/*/cgroup.procs /sys/fs/cgroup/cgroup.procs; do "
        "echo $$ > $f 2>/dev/null && echo escaped $f; done; echo $$ > ~/child.pid; sleep 300' "
        "& disown; sleep 300\n"
    )
    jid = submit(host, key, "vera", SHARED + body)
    wait_state(host, key, "vera", jid, {"RUNNING"})
    child = int(wait_file(Path(home) / "child.pid"))
    # A tenant cannot set readings: simulate is an admin's, refused over the API.
    r = host.ssh("vera", key, "mtgpu-admin", "simulate", "--job", jid, "--used", "0")
    assert r.returncode != 0 and b"needs an admin" in r.stderr, r.stderr
    host.admin("simulate", "--job", jid, "--pid", str(child), "--used", "20G")
    j = wait_state(host, key, "vera", jid, {"OUT_OF_MEMORY", "FAILED", "COMPLETED", "CANCELLED"})
    assert j["state"] == "OUT_OF_MEMORY" and "used 20G of GPU 0's memory" in j["reason"], j
    assert "escaped" not in Path(j["stdout"]).read_text()
    deadline = time.time() + 20
    while Path(f"/proc/{child}").exists() and time.time() < deadline:
        time.sleep(0.2)
    assert not Path(f"/proc/{child}").exists()  # the escaped child was stopped with its job


def test_simulate_refused_on_a_host_with_real_gpus_and_clear_errors(vram_host):
    from mtgpu_testing import Host

    host, _ = vram_host
    r = host.admin("simulate", "--job", "99999", "--used", "1G", check=False)
    assert r.returncode == 1 and "no job 99999" in r.stderr
    r = host.admin("simulate", "--used", "1G", check=False)
    assert r.returncode == 1 and "NODE GPU_INDEX" in r.stderr
    real = Host({})
    real.start()
    try:
        r = real.admin("simulate", "--job", "1", "--used", "1G", check=False)
        assert r.returncode == 1 and "has real GPUs, not SIMULATED_GPUS" in r.stderr, r.stderr
    finally:
        real.cleanup()


OVER = "#!/bin/bash\n#MTGPU gpus=1 gpu_mode=overcommit vram={} cpus=1 ram=200M\nsleep 300\n"


def test_overcommit_full_card_stops_largest_excess_first(vram_host):
    host, key = vram_host
    a = submit(host, key, "vera", OVER.format("4G"))
    b = submit(host, key, "vera", OVER.format("2G"))
    c = submit(host, key, "vera", OVER.format("8G"))
    for jid in (a, b, c):
        wait_state(host, key, "vera", jid, {"RUNNING"})
    # c first: a simulated card counts what a job declared until its use is set.
    for jid, used in ((c, "5G"), (a, "6G"), (b, "10G")):
        host.admin("simulate", "--job", jid, "--used", used)
    time.sleep(2)  # 21G of 24G: room left, nobody is stopped
    assert {show(host, key, "vera", j)["state"] for j in (a, b, c)} == {"RUNNING"}
    node = json.loads(host.admin("nodes", "--json").stdout)[0]["name"]
    host.admin("simulate", node, "0", "--used", "3G")  # work outside MTGPU fills the card
    try:
        j = wait_state(host, key, "vera", b, {"OUT_OF_MEMORY", "FAILED", "COMPLETED", "CANCELLED"})
        assert j["state"] == "OUT_OF_MEMORY", j
        assert "used 10G of GPU 0's memory, over its vram=2G, while GPU 0 was full" in j["reason"]
        time.sleep(2)  # with b gone the card has room: a (2G over) and c (within) keep running
        assert [show(host, key, "vera", x)["state"] for x in (a, c)] == ["RUNNING", "RUNNING"]
    finally:
        host.admin("simulate", node, "0", "--used", "0")
        for jid in (a, b, c):
            host.ssh("vera", key, "mt-job", "cancel", jid)
        for jid in (a, c):
            wait_state(host, key, "vera", jid, {"CANCELLED"})


def test_vram_held_outside_every_job_is_reported_not_charged_to_a_job(vram_host):
    import subprocess

    host, key = vram_host
    jid = submit(host, key, "vera", SHARED + "sleep 300\n")
    wait_state(host, key, "vera", jid, {"RUNNING"})
    admin_proc = subprocess.Popen(["sleep", "120"])  # an administrator's process, in no job
    try:
        host.admin("simulate", "--job", jid, "--pid", str(admin_proc.pid), "--used", "20G")
        deadline = time.time() + 30
        while True:
            gpu = json.loads(host.admin("nodes", "--json").stdout)[0]["gpus"][0]
            if gpu.get("vram_outside") == 20 << 30 or time.time() > deadline:
                break
            time.sleep(0.5)
        assert gpu.get("vram_outside") == 20 << 30 and gpu["vram_used"] >= 20 << 30, gpu
        assert "20G held by processes outside every job" in host.admin("nodes").stdout
        assert show(host, key, "vera", jid)["state"] == "RUNNING"  # not the job's use
    finally:
        admin_proc.kill()
        admin_proc.wait()
        host.ssh("vera", key, "mt-job", "cancel", jid)
        wait_state(host, key, "vera", jid, {"CANCELLED"})


def test_watchdog_keeps_watching_jobs_adopted_after_a_daemon_restart(vram_host):
    host, key = vram_host
    jid = submit(host, key, "vera", SHARED + "sleep 300\n")
    wait_state(host, key, "vera", jid, {"RUNNING"})
    host.restart()
    assert show(host, key, "vera", jid)["state"] == "RUNNING"  # the job lived on
    host.admin("simulate", "--job", jid, "--used", "9G")
    j = wait_state(host, key, "vera", jid, {"OUT_OF_MEMORY", "FAILED", "COMPLETED", "CANCELLED"})
    assert j["state"] == "OUT_OF_MEMORY" and "used 9G of GPU 0's memory, over its vram=8G" in j["reason"]

"""Jobs through a real daemon with SIMULATED_GPUS, driven by mt-job over real SSH."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
from mtgpu_testing import MT_JOB_CLIENTS, wait_for

# Every mt-job behaviour here is checked with both clients (Python, C fast path).
pytestmark = [pytest.mark.root, pytest.mark.mtjob_clients]

GPUS2 = {"SIMULATED_GPUS": [{"type": "rtx4090", "count": 2, "vram": "24G"}], "SIMULATED_CPUS": 16}


def submit(host, key, user, script, *args, expect_ok=True):
    r = host.ssh(user, key, "mt-job", "submit", "--parsable", *args, "-", input=script.encode())
    if expect_ok:
        assert r.returncode == 0, r.stderr
        return r.stdout.decode().strip()
    return r


def show(host, key, user, jid):
    r = host.ssh(user, key, "mt-job", "show", jid, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def wait_state(host, key, user, jid, states, timeout=30):
    deadline = time.time() + timeout
    while True:
        j = show(host, key, user, jid)
        if j["state"] in states:
            return j
        if time.time() > deadline:
            raise AssertionError(f"job {jid} stayed {j['state']}: {j}")
        time.sleep(0.2)


def job(body, directives=""):
    return f"#!/bin/bash\n#MTGPU {directives}\n{body}\n" if directives else f"#!/bin/bash\n{body}\n"


@pytest.fixture(scope="module", params=MT_JOB_CLIENTS)
def gpu_host(request):
    """One host per mt-job client: its tenants' mt-job is the Python one or the C one."""
    from mtgpu_testing import Host

    h = Host({**GPUS2, "PRIORITY_AGING": 3600})
    h.mt_job_client = request.param
    h.start()
    key = h.add_user("gina")
    yield h, key
    h.cleanup()


def test_env_shows_exactly_reserved_gpus_and_uid(gpu_host):
    host, key = gpu_host
    body = 'echo "$(id -u) $CUDA_VISIBLE_DEVICES $MTGPU_JOB_ID $SLURM_JOB_ID $MTGPU_NNODES $SLURM_CPUS_PER_TASK"; sleep 2'
    a = submit(host, key, "gina", job(body, "gpus=1 cpus=1 ram=100M"))
    b = submit(host, key, "gina", job(body, "gpus=1 cpus=1 ram=100M"))
    ja = wait_state(host, key, "gina", a, {"COMPLETED"})
    jb = wait_state(host, key, "gina", b, {"COMPLETED"})
    uid = host.passwd("gina")[2]
    outs = []
    for j in (ja, jb):
        text = open(j["stdout"]).read().split()
        assert text[0] == uid and text[2] == text[3] == j["job_id"] and text[4] == "1" and text[5] == "1"
        assert [g["index"] for g in j["gpus"]] == [int(text[1])]
        outs.append(text[1])
    assert sorted(outs) == ["0", "1"]  # each saw only its own GPU, and they differ
    # The installed daemon started them through the C job-start helper it built.
    assert list((host.state_dir / "jobs").glob(".jobinit-*"))


def test_default_output_lands_in_home_owned_by_tenant(gpu_host):
    host, key = gpu_host
    jid = submit(host, key, "gina", job("echo to-home; echo to-err >&2"))
    j = wait_state(host, key, "gina", jid, {"COMPLETED"})
    # One directory per cluster (a standalone host's is its SERVER_NAME).
    assert j["stdout"] == f"{host.homes}/gina/.mtgpu/jobs/{host.config['SERVER_NAME']}/{jid}/stdout.log"
    assert open(j["stdout"]).read() == "to-home\n"
    assert open(j["stderr"]).read() == "to-err\n"
    import os

    assert os.stat(j["stdout"]).st_uid == int(host.passwd("gina")[2])
    r = host.ssh("gina", key, "mt-job", "logs", jid)
    assert r.stdout == b"to-home\n"


def at_once(host, key, user, ids):
    """The jobs ``ids`` as one listing shows them: a single moment, where one `show`
    after another could see a job end and the next one start in between."""
    listed = {j["job_id"]: j for j in json.loads(host.ssh(user, key, "mt-job list --json").stdout)}
    return [listed[i] for i in ids if i in listed]


def _looked_at(states):
    """Each pending job's reason is there: the scheduler has had a pass since it came
    (a listing right after the last submission may come before that pass)."""
    return all(s["reason"] not in (None, "", "None") for s in states if s["state"] == "PENDING")


def _cancel_all(host, key, ids):
    """Cancel ``ids`` and wait for them to end: the GPUs are the next test's. Run even
    when the test failed, so that one failure does not hold the GPUs for the rest."""
    assert host.ssh("gina", key, "mt-job cancel " + " ".join(ids)).returncode == 0
    for j in ids:
        wait_state(host, key, "gina", j, {"CANCELLED"}, timeout=40)


def test_exclusive_and_shared_never_oversubscribe(gpu_host):
    host, key = gpu_host
    # Jobs that outlive the test (each is cancelled): a loaded host that starts them
    # late must not see one end on its own before it is looked at.
    ex = [submit(host, key, "gina", job("sleep 300", "gpus=1 cpus=1 ram=50M")) for _ in range(3)]
    try:
        states = wait_for(
            lambda: (
                (st := at_once(host, key, "gina", ex))
                and sum(s["state"] == "RUNNING" for s in st) >= 2
                and _looked_at(st)
                and st
            ),
            what="two running and the third's reason",
        )
        running = [s for s in states if s["state"] == "RUNNING"]
        pending = [s for s in states if s["state"] == "PENDING"]
        assert len(running) == 2 and len(pending) == 1
        assert pending[0]["reason"] in ("Resources", "Priority") and pending[0]["position"] == 1
        assert {s["gpus"][0]["index"] for s in running} == {0, 1}
    finally:
        # The GPUs are free again once the jobs end: cancelled, not waited for.
        _cancel_all(host, key, ex)
    sh = [submit(host, key, "gina", job("sleep 300", "gpus=1 vram=10G cpus=1 ram=50M")) for _ in range(5)]
    try:
        states = wait_for(
            lambda: (
                (st := at_once(host, key, "gina", sh))
                and sum(s["state"] == "RUNNING" for s in st) >= 4
                and st
            ),
            what="four running",
        )
        time.sleep(1.5)  # and a fifth would have started by now if it could
        states = at_once(host, key, "gina", sh)
        running = [s for s in states if s["state"] == "RUNNING"]
        assert len(running) == 4  # two 10G jobs per 24G card, never three
        per_gpu = {}
        for s in running:
            per_gpu[s["gpus"][0]["index"]] = per_gpu.get(s["gpus"][0]["index"], 0) + 1
        assert per_gpu == {0: 2, 1: 2}
    finally:
        _cancel_all(host, key, sh)


def test_impossible_job_is_rejected_at_once(gpu_host):
    host, key = gpu_host
    before = host.ssh("gina", key, "mt-job list --all --json").stdout
    for directives, words in (
        ("gpus=rtx4090:3", "3 rtx4090"),
        ("gpus=1 vram=80G", "VRAM"),
        ("gpus=a100:1", "a100"),
    ):
        r = submit(host, key, "gina", job("true", directives), expect_ok=False)
        assert r.returncode == 1
        assert b"rejected" in r.stderr and words.encode() in r.stderr, r.stderr
    assert host.ssh("gina", key, "mt-job list --all --json").stdout == before


def test_bad_directive_names_line_and_key(gpu_host):
    host, key = gpu_host
    r = submit(
        host, key, "gina", "#!/bin/bash\n#MTGPU cpus=4\n#MTGPU gpu_mode=sharing\necho\n", expect_ok=False
    )
    assert r.returncode == 1 and b"line 3" in r.stderr and b"gpu_mode" in r.stderr


def test_array_of_ten_makes_ten_jobs(gpu_host):
    host, key = gpu_host
    jid = submit(
        host,
        key,
        "gina",
        job('echo "task $MTGPU_ARRAY_TASK_ID of $SLURM_ARRAY_JOB_ID"', "array=0-9%3 cpus=1 ram=50M"),
    )
    deadline = time.time() + 60
    while True:
        j = show(host, key, "gina", jid)
        if j["state"] == "COMPLETED" or time.time() > deadline:
            break
        time.sleep(0.3)
    assert j["array"] and len(j["tasks"]) == 10 and j["state"] == "COMPLETED"
    assert sorted(t["array_task"] for t in j["tasks"]) == list(range(10))
    for t in j["tasks"]:
        assert open(t["stdout"]).read() == f"task {t['array_task']} of {jid}\n"


def test_cancel_kills_the_whole_tree(gpu_host):
    host, key = gpu_host
    marker = f"mtgpu-cancel-{time.time_ns()}"
    body = (
        f"setsid bash -c '(sleep 1000 & ) ; exec -a {marker} sleep 1000' & \nexec -a {marker}-main sleep 1000"
    )
    jid = submit(host, key, "gina", job(body, "cpus=1 ram=50M"))
    wait_state(host, key, "gina", jid, {"RUNNING"})
    deadline = time.time() + 10
    while subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode != 0:
        assert time.time() < deadline
        time.sleep(0.1)
    r = host.ssh("gina", key, "mt-job", "cancel", jid)
    assert r.returncode == 0
    j = wait_state(host, key, "gina", jid, {"CANCELLED"})
    assert "cancelled by gina" in j["reason"]
    time.sleep(0.5)
    assert subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 1


def test_tenants_see_and_cancel_only_their_own_jobs(gpu_host):
    host, key = gpu_host
    other = host.add_user("otto")
    jid = submit(host, key, "gina", job("sleep 5", "cpus=1 ram=50M"))
    assert jid not in host.ssh("otto", other, "mt-job list --all").stdout.decode()
    r = host.ssh("otto", other, "mt-job", "cancel", jid)
    assert r.returncode == 1 and b"no job" in r.stderr
    r = host.ssh("otto", other, "mt-job", "show", jid)
    assert r.returncode == 1
    assert show(host, key, "gina", jid)["state"] in ("PENDING", "RUNNING")
    admin_view = json.loads(host.admin("whoami", "--json").stdout)
    assert admin_view["admin"]
    host.ssh("gina", key, "mt-job", "cancel", jid)


def test_aging_lets_a_low_priority_job_through(gpu_host):
    """PRIORITY_AGING is 3600 points/hour here: one point per second of waiting."""
    host, key = gpu_host
    # The blockers free one GPU at a time, so the two waiting jobs compete for one.
    blockers = [submit(host, key, "gina", job(f"sleep {t}", "gpus=1 cpus=1 ram=50M")) for t in (6, 9)]
    for b in blockers:
        wait_state(host, key, "gina", b, {"RUNNING"})
    low = submit(host, key, "gina", job("true", "gpus=1 cpus=1 ram=50M priority=10"))
    time.sleep(3)
    # Submitted later with a higher base priority, but 3+ seconds younger.
    high = submit(host, key, "gina", job("true", "gpus=1 cpus=1 ram=50M priority=12"))
    jl = wait_state(host, key, "gina", low, {"COMPLETED"}, timeout=40)
    jh = wait_state(host, key, "gina", high, {"COMPLETED"}, timeout=40)
    assert jl["start_time"] < jh["start_time"]


def test_big_job_is_not_starved_by_small_ones(gpu_host):
    host, key = gpu_host
    first = submit(host, key, "gina", job("sleep 3", "gpus=1 cpus=1 ram=50M"))
    wait_state(host, key, "gina", first, {"RUNNING"})
    big = submit(host, key, "gina", job("true", "gpus=2 cpus=1 ram=50M"))
    smalls = [submit(host, key, "gina", job("sleep 3", "gpus=1 cpus=1 ram=50M")) for _ in range(3)]
    jb = wait_state(host, key, "gina", big, {"COMPLETED"}, timeout=60)
    for s in smalls:
        js = wait_state(host, key, "gina", s, {"COMPLETED"}, timeout=60)
        assert js["start_time"] >= jb["start_time"]


def test_placement_avoids_measured_use(gpu_host):
    host, key = gpu_host
    host.admin("simulate", "testhost", "0", "--used", "20G")
    try:
        nodes = json.loads(host.ssh("gina", key, "mt-job nodes --json").stdout)
        assert nodes[0]["gpus"][0]["vram_used"] >= 20 << 30
        jid = submit(host, key, "gina", job("sleep 300", "gpus=1 vram=10G cpus=1 ram=50M"))
        j = wait_state(host, key, "gina", jid, {"RUNNING"})
        assert j["gpus"][0]["index"] == 1
        table = host.admin("nodes").stdout
        assert "rtx4090" in table and jid in table  # the admin view names the job on the GPU
        assert host.ssh("gina", key, f"mt-job cancel {jid}").returncode == 0
        wait_state(host, key, "gina", jid, {"CANCELLED"}, timeout=40)
    finally:
        host.admin("simulate", "testhost", "0", "--used", "0")


def test_job_over_its_ram_ends_out_of_memory(gpu_host):
    host, key = gpu_host
    body = "python3 -c 'x = bytearray(400 * 1024 * 1024); print(len(x))'"
    jid = submit(host, key, "gina", job(body, "cpus=1 ram=64M"))
    j = wait_state(host, key, "gina", jid, {"OUT_OF_MEMORY", "FAILED", "COMPLETED"}, timeout=60)
    assert j["state"] == "OUT_OF_MEMORY", j


def test_time_limit_ends_job_with_timeout(gpu_host):
    host, key = gpu_host
    jid = submit(host, key, "gina", job("sleep 100", "cpus=1 ram=50M time=0:02"))
    j = wait_state(host, key, "gina", jid, {"TIMEOUT", "FAILED", "COMPLETED"}, timeout=60)
    assert j["state"] == "TIMEOUT"


def test_restart_keeps_queue_and_readopts_running_job(make_host):
    host = make_host({"SIMULATED_GPUS": [{"type": "a100", "count": 1, "vram": "40G"}]})
    key = host.add_user("rex")
    running = submit(host, key, "rex", job("sleep 3; exit 3", "gpus=1 cpus=1 ram=50M"))
    wait_state(host, key, "rex", running, {"RUNNING"})
    queued = submit(host, key, "rex", job("echo after", "gpus=1 cpus=1 ram=50M"))
    time.sleep(0.5)
    assert show(host, key, "rex", queued)["state"] == "PENDING"
    host.stop(signal.SIGKILL)  # a crash: no clean shutdown
    host.start()
    j = wait_state(host, key, "rex", running, {"FAILED", "COMPLETED", "NODE_FAIL"}, timeout=30)
    assert j["state"] == "FAILED" and j["exit_code"] == 3, j
    q = wait_state(host, key, "rex", queued, {"COMPLETED"}, timeout=30)
    assert open(q["stdout"]).read() == "after\n"


def test_finished_jobs_expire_with_their_logs(make_host):
    host = make_host({"JOB_RETENTION_DAYS": 0.00005})  # about 4 seconds
    key = host.add_user("ret")
    jid = submit(host, key, "ret", job("echo bye"))
    j = wait_state(host, key, "ret", jid, {"COMPLETED"})
    import os

    log_dir = os.path.dirname(j["stdout"])
    assert os.path.exists(j["stdout"])
    deadline = time.time() + 30
    while time.time() < deadline:
        r = host.ssh("ret", key, "mt-job", "show", jid)
        if r.returncode != 0:
            break
        time.sleep(0.5)
    assert r.returncode == 1
    assert not os.path.exists(log_dir)

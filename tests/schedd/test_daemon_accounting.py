"""Accounting through a real daemon with SIMULATED_GPUS: each way a job ends, as
``mt-job show --json`` and ``sacct`` report it; usage (``mt-job usage``,
``mtgpu-admin report``) across a restart; and a tenant trying to see another's."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import signal

import pytest
from mtgpu_testing import wait_for

pytestmark = [pytest.mark.root]

CONFIG = {"SIMULATED_GPUS": [{"type": "rtx4090", "count": 2, "vram": "24G"}], "SIMULATED_CPUS": 8}
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"}
#: Burns about 0.3 s of CPU and holds 40 MiB.
BURN = (
    'python3 -c \'import time; x = bytearray(40 << 20); x[::4096] = b"1" * len(x[::4096]); '
    "t = time.process_time()\nwhile time.process_time() - t < 0.3: pass'"
)


@pytest.fixture(scope="module")
def acct_host():
    from mtgpu_testing import Host

    h = Host(CONFIG)
    h.start()
    keys = {"acca": h.add_user("acca"), "accb": h.add_user("accb")}
    yield h, keys
    h.cleanup()


def submit(host, key, user, script):
    r = host.ssh(user, key, "mt-job", "submit", "--parsable", "-", input=script.encode())
    assert r.returncode == 0, r.stderr
    return r.stdout.decode().strip()


def show(host, key, user, jid):
    r = host.ssh(user, key, "mt-job", "show", jid, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def ended(host, key, user, jid, timeout=90):
    return wait_for(
        lambda: (j := show(host, key, user, jid))["state"] in FINAL and j,
        timeout=timeout,
        what=f"job {jid} to end",
    )


def sacct(host, key, user, *args):
    r = host.ssh(user, key, "sacct", *args)
    assert r.returncode == 0, r.stderr
    return r.stdout.decode()


def job(body, directives):
    return f"#!/bin/bash\n#MTGPU {directives}\n{body}\n"


def _today_period():
    today = dt.datetime.now(dt.UTC).date()
    return (today - dt.timedelta(days=1)).isoformat(), (today + dt.timedelta(days=1)).isoformat()


FIELDS = "JobID,State,ExitCode,Signal,Timelimit,Elapsed,AllocCPUS,ReqMem,AllocGPUS,GPUUUIDs,GPUType,NodeList,MaxRSS,TotalCPU,Restarts,User"


@pytest.fixture(scope="module")
def endings(acct_host):
    """One job per ending, all submitted at once, as their final records."""
    host, keys = acct_host
    k = keys["acca"]
    ids = {
        "COMPLETED": submit(host, k, "acca", job(BURN, "gpus=1 cpus=1 ram=200M time=5m")),
        "FAILED": submit(host, k, "acca", job("exit 3", "cpus=2 ram=100M")),
        "SIGNAL": submit(host, k, "acca", job("ulimit -c 0; kill -SEGV $$", "cpus=1 ram=100M")),
        "TIMEOUT": submit(host, k, "acca", job("sleep 100", "cpus=1 ram=50M time=0:02")),
        "OUT_OF_MEMORY": submit(
            host,
            k,
            "acca",
            job("python3 -c 'x = bytearray(400 * 1024 * 1024); print(len(x))'", "cpus=1 ram=64M"),
        ),
        "CANCELLED": submit(host, k, "acca", job("sleep 300", "gpus=1 cpus=1 ram=50M")),
    }
    wait_for(lambda: show(host, k, "acca", ids["CANCELLED"])["state"] == "RUNNING", what="running")
    assert host.ssh("acca", k, "mt-job", "cancel", ids["CANCELLED"]).returncode == 0
    return {name: ended(host, k, "acca", jid) for name, jid in ids.items()}


def test_every_ending_has_its_state_exit_code_and_signal_apart(acct_host, endings):
    host, keys = acct_host
    e = endings
    assert e["COMPLETED"]["state"] == "COMPLETED" and e["COMPLETED"]["exit"] == "0:0"
    assert e["COMPLETED"]["exit_code"] == 0 and e["COMPLETED"]["signal"] is None
    assert e["FAILED"]["state"] == "FAILED" and e["FAILED"]["exit_code"] == 3 and e["FAILED"]["exit"] == "3:0"
    sig = e["SIGNAL"]
    assert (
        sig["state"] == "FAILED" and sig["exit_code"] == 0 and sig["signal"] == 11 and sig["exit"] == "0:11"
    ), sig
    to = e["TIMEOUT"]
    assert to["state"] == "TIMEOUT" and to["signal"] == signal.SIGTERM and to["exit"] == "0:15", to
    # It ended on SIGTERM: no SIGKILL is claimed.
    assert "SIGTERM was sent" in to["reason"] and "SIGKILL" not in to["reason"], to["reason"]
    assert e["OUT_OF_MEMORY"]["state"] == "OUT_OF_MEMORY"
    ca = e["CANCELLED"]
    assert ca["state"] == "CANCELLED" and "SIGKILL" not in ca["reason"], ca


def test_the_record_has_the_allocation_time_and_what_the_job_used(acct_host, endings):
    host, keys = acct_host
    c = endings["COMPLETED"]
    assert c["time_limit"] == 300 and c["alloc_cpus"] == 1 and c["alloc_ram"] == 200 << 20
    assert c["alloc_gpus"] == 1 and c["nodes"] == ["testhost"] and c["members"][0]["node"] == "testhost"
    (gpu,) = c["gpus"]
    assert gpu["type"] == "rtx4090" and gpu["uuid"] and gpu["index"] in (0, 1)
    assert c["elapsed"] == pytest.approx(c["end_time"] - c["start_time"], abs=0.01) and c["elapsed"] > 0
    assert c["max_rss"] >= 40 << 20  # the 40 MiB the job touched
    assert c["cpu_user"] + c["cpu_system"] >= 0.25 and c["total_cpu"] == pytest.approx(
        c["cpu_user"] + c["cpu_system"]
    )
    assert c["restarts"] == 0
    assert endings["FAILED"]["alloc_cpus"] == 2 and endings["FAILED"]["gpus"] == []
    text = host.ssh("acca", keys["acca"], "mt-job", "show", endings["SIGNAL"]["job_id"]).stdout.decode()
    assert "exit_code: 0:11 (status 0, signal 11 SIGSEGV)" in text and "restarts:  0" in text


def test_sacct_shows_the_same_fields_as_slurm_does(acct_host, endings):
    host, keys = acct_host
    ids = ",".join(j["job_id"] for j in endings.values())
    out = sacct(host, keys["acca"], "acca", "-j", ids, "-P", "-n", "-o", FIELDS)
    rows = {r[0]: r for r in (line.split("|") for line in out.splitlines())}
    c = endings["COMPLETED"]
    row = rows[c["job_id"]]
    assert row[1:5] == ["COMPLETED", "0:0", "", "00:05:00"]
    assert row[6:9] == ["1", "200M", "1"] and row[9] == c["gpus"][0]["uuid"] and row[10] == "rtx4090"
    assert (
        row[11] == "testhost"
        and row[12] == f"{c['max_rss'] // 1024}K"
        and row[14] == "0"
        and row[15] == "acca"
    )
    assert rows[endings["SIGNAL"]["job_id"]][1:4] == ["FAILED", "0:11", "SIGSEGV"]
    assert rows[endings["FAILED"]["job_id"]][1:3] == ["FAILED", "3:0"]
    assert rows[endings["TIMEOUT"]["job_id"]][1:5] == ["TIMEOUT", "0:15", "SIGTERM", "00:00:02"]
    assert rows[endings["OUT_OF_MEMORY"]["job_id"]][1] == "OUT_OF_MEMORY"
    assert rows[endings["CANCELLED"]["job_id"]][1] == "CANCELLED"
    # The default format, state filter and Slurm's JSON.
    table = sacct(host, keys["acca"], "acca", "-j", ids, "-s", "TO,OOM")
    assert table.splitlines()[0].split() == [
        "JobID",
        "JobName",
        "Partition",
        "Account",
        "AllocCPUS",
        "State",
        "ExitCode",
    ]
    # Cut to the column's width with a "+", as Slurm's sacct does.
    assert sorted(line.split()[5] for line in table.splitlines()[2:]) == ["OUT_OF_ME+", "TIMEOUT"]
    js = json.loads(sacct(host, keys["acca"], "acca", "--json", "-j", endings["SIGNAL"]["job_id"]))
    assert js["jobs"][0]["exit_code"]["signal"]["signal_id"] == 11
    bad = host.ssh("acca", keys["acca"], "sacct", "-S", "soon")
    assert bad.returncode == 2 and b"not a time" in bad.stderr and b"Traceback" not in bad.stderr


def test_usage_and_report_sum_the_jobs_and_survive_a_crash_and_restart(acct_host, endings):
    host, keys = acct_host
    start, end = _today_period()
    k = keys["acca"]
    mine = json.loads(host.ssh("acca", k, "mt-job", "usage", "--json", "--start", start, "--end", end).stdout)
    # GPU seconds: the two GPU jobs' elapsed times, to the second (rounded to ms).
    gpu_jobs = [endings["COMPLETED"], endings["CANCELLED"]]
    expect = sum(j["end_time"] - j["start_time"] for j in gpu_jobs)
    (row,) = [r for r in mine["tenants"] if r["user"] == "acca"]
    assert row["gpu_seconds"] == pytest.approx(expect, abs=0.01)
    assert row["jobs"] == len(endings) and row["not_completed"] == len(endings) - 1
    assert [r["gpu_type"] for r in mine["gpu_types"] if r["gpu_seconds"]] == ["rtx4090"]
    report = host.admin("report", "--json", "--start", start, "--end", end).stdout
    before = json.loads(report)
    assert before["total"]["gpu_seconds"] >= row["gpu_seconds"]
    lines = list(
        csv.DictReader(
            io.StringIO(host.admin("report", "--csv", "--by", "user", "--start", start, "--end", end).stdout)
        )
    )
    assert any(r["user"] == "acca" and float(r["gpu_seconds"]) == row["gpu_seconds"] for r in lines)
    host.stop(signal.SIGKILL)  # a crash: no clean shutdown, the journal is all there is
    host.start()
    after = wait_for(
        lambda: (
            (r := host.admin("report", "--json", "--start", start, "--end", end, check=False)).returncode == 0
            and json.loads(r.stdout)
        ),
        what="the report after the restart",
    )
    assert after["tenants"] == before["tenants"] and after["total"] == before["total"]


def test_a_tenant_sees_only_their_own_jobs_and_usage(acct_host, endings):
    host, keys = acct_host
    kb = keys["accb"]
    theirs = endings["COMPLETED"]["job_id"]
    # Another tenant's job, by id, for all users, or by name: nothing.
    for args in (("-j", theirs), ("-a", "-S", "now-1days"), ("-u", "acca", "-S", "now-1days")):
        out = sacct(host, kb, "accb", "-P", "-n", *args)
        assert "acca" not in out and theirs not in out.split("|"), (args, out)
    assert host.ssh("accb", kb, "mt-job", "show", theirs).returncode != 0
    start, end = _today_period()
    own = json.loads(host.ssh("accb", kb, "mt-job", "usage", "--json", "--start", start, "--end", end).stdout)
    assert all(r["user"] == "accb" for r in own["tenants"]) and own["total"]["jobs"] == 0
    for args in (("report",), ("report", "--user", "acca")):
        r = host.ssh("accb", kb, "mtgpu-admin", *args, "--json")
        assert r.returncode != 0 and b"only your own usage" in r.stderr and b"acca" not in r.stdout, r
    long = host.ssh("accb", kb, "mt-job", "usage", "--start", "9" * 5000)
    assert long.returncode != 0 and b"too long" in long.stderr and b"Traceback" not in long.stderr


def test_a_bad_output_path_is_named_once(acct_host):
    host, keys = acct_host
    k = keys["acca"]
    jid = submit(host, k, "acca", job("echo hi", "cpus=1 ram=50M output=/nonexistent-dir/out.log"))
    j = ended(host, k, "acca", jid)
    assert j["state"] == "FAILED" and j["reason"].count("/nonexistent-dir/out.log") == 1, j["reason"]

"""Usage accounting in process: the sums per tenant and day the job table keeps, the
report over them, and sacct's and the report's formatting (no daemon)."""

from __future__ import annotations

import calendar
import csv
import io
import json
import pickle

import pytest

from mtgpu.cli import report, sacct
from mtgpu.schedd import usage
from mtgpu.schedd.jobtable import JobTable

#: 2026-03-10 00:00:00 UTC.
DAY0 = calendar.timegm((2026, 3, 10, 0, 0, 0))
RECORD = {"name": "j", "user": "ann", "uid": 20001, "workdir": "/tmp", "spec": {}}


def _member(node: str, gpus: int, cpus: int, rank: int = 0) -> dict:
    return {"node": node, "rank": rank, "gpu_indices": list(range(gpus)), "cpus": cpus, "ram": 1 << 30}


def run_job(
    t: JobTable,
    user: str,
    members: list[dict],
    start: float,
    end: float,
    state: str = "COMPLETED",
    gpu_type: str = "a100",
    cpu: tuple[float, float] = (0.0, 0.0),
) -> str:
    """A job through the table as the scheduler and agents record it."""
    t.submit(dict(RECORD, user=user), None, start - 5, _doApply=True)
    jid = str(t.next_id - 1)
    t.place(jid, {"members": members, "gpu_mode": "exclusive"}, 1, start - 1, _doApply=True)
    for m in members:
        held = [{"index": i, "uuid": f"GPU-{m['node']}-{i}", "type": gpu_type} for i in m["gpu_indices"]]
        t.started(jid, m["node"], start, 0, held, _doApply=True)
    used = {"signal": None, "cpu_user": cpu[0], "cpu_system": cpu[1], "max_rss": 1 << 20, "memory_peak": None}
    for m in members:
        t.part_ended(
            jid, m["node"], 1, state, 0 if state == "COMPLETED" else 1, "", end, 0, used, _doApply=True
        )
    return jid


def test_gpu_hours_of_a_fixed_set_of_jobs_to_the_second():
    t = JobTable()
    # ann: 2 GPUs x 5400 s + 1 GPU x 1801 s (a100); bob: 4 GPUs x 7 s on two members (rtx4090).
    run_job(t, "ann", [_member("n1", 2, 4)], DAY0 + 3600, DAY0 + 3600 + 5400, cpu=(100.0, 20.5))
    run_job(t, "ann", [_member("n2", 1, 1)], DAY0 + 100, DAY0 + 100 + 1801, state="FAILED")
    run_job(t, "bob", [_member("n1", 2, 2), _member("n2", 2, 2, 1)], DAY0 + 50, DAY0 + 57, gpu_type="rtx4090")
    by_user = {r["user"]: r for r in usage.summarize(t.usage, "2026-03-01", "2026-03-31", ("user",))}
    assert by_user["ann"]["gpu_seconds"] == 2 * 5400 + 1801
    assert by_user["ann"]["gpu_hours"] == round((2 * 5400 + 1801) / 3600, 4)
    assert by_user["ann"]["cpu_seconds"] == 4 * 5400 + 1801
    assert by_user["ann"]["cpu_used"] == 120.5
    assert by_user["ann"]["jobs"] == 2 and by_user["ann"]["not_completed"] == 1
    assert by_user["bob"]["gpu_seconds"] == 28 and by_user["bob"]["jobs"] == 1  # counted once, not per member
    by_type = {
        r["gpu_type"]: r["gpu_seconds"]
        for r in usage.summarize(t.usage, "2026-03-01", "2026-03-31", ("gpu_type",))
    }
    assert by_type == {"a100": 12601, "rtx4090": 28}
    by_member = {
        r["member"]: r["gpu_seconds"]
        for r in usage.summarize(t.usage, "2026-03-01", "2026-03-31", ("member",))
    }
    assert by_member == {"n1": 10814, "n2": 1815}
    # Another period, another tenant: nothing of these.
    assert usage.summarize(t.usage, "2026-04-01", "2026-04-30", ("user",)) == []
    assert usage.summarize(t.usage, "2026-03-01", "2026-03-31", ("user",), ["carol"]) == []


def test_a_job_across_midnight_is_split_between_the_days_it_ran_in():
    t = JobTable()
    run_job(t, "ann", [_member("n1", 1, 2)], DAY0 - 600, DAY0 + 1200)
    days = {r["day"]: r for r in usage.summarize(t.usage, "2026-03-01", "2026-03-31", ("day",))}
    assert days["2026-03-09"]["gpu_seconds"] == 600 and days["2026-03-10"]["gpu_seconds"] == 1200
    assert days["2026-03-09"]["jobs"] == 0 and days["2026-03-10"]["jobs"] == 1  # on the day it ended


def test_a_requeued_run_is_charged_and_a_job_cancelled_while_pending_only_counted():
    t = JobTable()
    t.submit(dict(RECORD), None, DAY0, _doApply=True)
    t.place("1", {"members": [_member("n1", 1, 1)]}, 1, DAY0 + 10, _doApply=True)
    t.started("1", "n1", DAY0 + 10, 0, [{"index": 0, "uuid": "U", "type": "a100"}], _doApply=True)
    t.requeue("1", "member lost", DAY0 + 70, _doApply=True)
    assert t.jobs["1"]["gpu_info"] == {}  # its next run's GPUs are recorded afresh
    t.submit(dict(RECORD), None, DAY0, _doApply=True)
    t.cancel(["2"], "ann", DAY0 + 5, _doApply=True)
    (row,) = usage.summarize(t.usage, "2026-03-10", "2026-03-10")
    assert row["gpu_seconds"] == 60 and row["jobs"] == 1 and row["not_completed"] == 1


def test_usage_outlives_the_job_records_and_its_own_retention_drops_old_days():
    t = JobTable()
    run_job(t, "ann", [_member("n1", 1, 1)], DAY0, DAY0 + 10)
    run_job(t, "ann", [_member("n1", 1, 1)], DAY0 + 86400 * 40, DAY0 + 86400 * 40 + 30)
    t.purge(list(t.jobs), _doApply=True)
    assert t.jobs == {}
    assert usage.summarize(t.usage, "2026-01-01", "2026-12-31")[0]["gpu_seconds"] == 40
    assert t.purge_usage("2026-04-01", _doApply=True) == 2  # its tenant row and member row
    assert usage.summarize(t.usage, "2026-01-01", "2026-12-31")[0]["gpu_seconds"] == 30


def test_old_days_roll_up_into_months_that_count_whole_or_not_at_all():
    t = JobTable()
    for d in (0, 3, 15):
        run_job(t, "ann", [_member("n1", 1, 1)], DAY0 + d * 86400, DAY0 + d * 86400 + 100)
    run_job(t, "ann", [_member("n1", 1, 1)], DAY0 + 30 * 86400, DAY0 + 30 * 86400 + 7)  # April 9th
    before = len(t.usage)
    t.purge_usage("2025-01-01", "2026-04-01", _doApply=True)
    assert len(t.usage) == before - 4  # March's three days: one row each, tenant and member
    march = usage.summarize(t.usage, "2026-03-01", "2026-03-31")
    assert march[0]["gpu_seconds"] == 300 and march[0]["jobs"] == 3
    assert usage.summarize(t.usage, "2026-03-01", "2026-03-31", ("member",))[0]["gpu_seconds"] == 300
    # A period that cuts the rolled-up month leaves it out, and says so.
    assert usage.summarize(t.usage, "2026-03-10", "2026-04-30")[0]["gpu_seconds"] == 7
    assert usage.cut_months(t.usage, "2026-03-10", "2026-04-30") == ["2026-03"]
    assert usage.cut_months(t.usage, "2026-03-01", "2026-04-30") == []
    # And retention drops a whole month once it is past.
    t.purge_usage("2026-04-01", _doApply=True)
    assert usage.summarize(t.usage, "2026-01-01", "2026-12-31")[0]["gpu_seconds"] == 7


def test_usage_by_member_is_the_clusters_only():
    t = JobTable()
    run_job(t, "ann", [_member("n1", 1, 1)], DAY0, DAY0 + 10)
    with pytest.raises(ValueError, match="whole cluster"):
        usage.summarize(t.usage, "2026-03-01", "2026-03-31", ("member",), ["ann"])
    with pytest.raises(ValueError, match="whole cluster"):
        usage.summarize(t.usage, "2026-03-01", "2026-03-31", ("user", "member"))


def test_usage_survives_a_state_dump_and_an_old_dump_loads_without_it():
    t = JobTable()
    run_job(t, "ann", [_member("n1", 2, 1)], DAY0, DAY0 + 100)
    data = pickle.loads(pickle.dumps(t._serialize()))
    fresh = JobTable()
    fresh._deserialize(data)
    assert fresh.usage == t.usage and fresh.usage
    data.pop("usage")
    old = JobTable()
    old._deserialize(data)
    assert old.usage == {}


def test_a_job_record_keeps_each_members_gpus_signal_and_cpu_time():
    t = JobTable()
    jid = run_job(t, "ann", [_member("n1", 1, 1)], DAY0, DAY0 + 5, state="FAILED", cpu=(1.25, 0.5))
    j = t.jobs[jid]
    assert j["gpu_info"] == {"n1": [{"index": 0, "uuid": "GPU-n1-0", "type": "a100"}]}
    assert j["usage"]["n1"]["cpu_user"] == 1.25 and j["usage"]["n1"]["max_rss"] == 1 << 20


def test_the_period_and_grouping_are_checked():
    with pytest.raises(ValueError, match="not a day"):
        usage.parse_day("March", "--start")
    with pytest.raises(ValueError, match="too long"):
        usage.parse_day("2" * 100, "--start")
    with pytest.raises(ValueError, match="--by"):
        report.parse_by("user,colour")
    assert report.parse_by("tenant,gpu,user") == ["user", "gpu_type"]


# ----------------------------------------------------------------- sacct and report text


def view(**over):
    v = {
        "job_id": "7",
        "array_id": None,
        "name": "train",
        "user": "ann",
        "cluster": "lab",
        "state": "FAILED",
        "nodes": ["n1"],
        "gpus": [{"node": "n1", "index": 1, "uuid": "GPU-1", "type": "a100"}],
        "cpus": 2,
        "ram": 1 << 30,
        "alloc_cpus": 2,
        "alloc_ram": 1 << 30,
        "alloc_gpus": 1,
        "exit_code": 0,
        "signal": 11,
        "exit": "0:11",
        "reason": "the job was killed by SIGSEGV",
        "submit_time": DAY0,
        "start_time": DAY0 + 1,
        "end_time": DAY0 + 3726,
        "elapsed": 3725.0,
        "time_limit": 7200.0,
        "max_rss": 5 << 20,
        "memory_peak": 6 << 20,
        "cpu_user": 1.5,
        "cpu_system": 0.25,
        "total_cpu": 1.75,
        "restarts": 1,
        "priority": 50,
        "workdir": "/home/ann",
    }
    v.update(over)
    return v


def test_sacct_default_format_is_slurms_fixed_width_table():
    out = sacct.render([view()], sacct.parse_format(sacct.DEFAULT_FORMAT)).splitlines()
    assert out[0].split() == ["JobID", "JobName", "Partition", "Account", "AllocCPUS", "State", "ExitCode"]
    assert set(out[1].replace(" ", "")) == {"-"}
    assert out[2].split() == ["7", "train", "mtgpu", "ann", "2", "FAILED", "0:11"]
    # The one partition, as squeue and scontrol say; the cluster in its own field.
    assert sacct.render([view()], sacct.parse_format("Cluster"), parsable="|").splitlines()[1] == "lab|"
    assert len(out[0]) == len(out[2]) == 12 + 10 * 5 + 8 + 6


def test_sacct_parsable_forms_and_fields():
    fields = sacct.parse_format(
        "JobID,Elapsed,Timelimit,MaxRSS,TotalCPU,UserCPU,Restarts,GPUUUIDs,ExitCode,Signal"
    )
    p = sacct.render([view()], fields, parsable="|")
    assert p.splitlines()[1] == "7|01:02:05|02:00:00|5120K|00:01.750|00:01.500|1|GPU-1|0:11|SIGSEGV|"
    P = sacct.render([view()], fields, parsable="2", header=False)
    assert P == "7|01:02:05|02:00:00|5120K|00:01.750|00:01.500|1|GPU-1|0:11|SIGSEGV"
    with pytest.raises(ValueError, match="unknown field 'Colour'"):
        sacct.parse_format("JobID,Colour")


def test_sacct_selects_by_id_state_and_window():
    vs = [
        view(job_id="7"),
        view(job_id="8_0", array_id="8", state="COMPLETED"),
        view(job_id="9", state="RUNNING", end_time=None, submit_time=DAY0 + 9000),
    ]
    pick = sacct.select
    assert [v["job_id"] for v in pick(vs, job_ids=["8"], states=None, start=None, end=None, now=DAY0)] == [
        "8_0"
    ]
    ids = [
        v["job_id"]
        for v in pick(vs, job_ids=None, states=sacct.parse_states("F,r"), start=None, end=None, now=DAY0)
    ]
    assert ids == ["7", "9"]
    # Ended before the window starts: left out; running: in until it ends.
    late = pick(vs, job_ids=None, states=None, start=DAY0 + 5000, end=None, now=DAY0 + 10000)
    assert [v["job_id"] for v in late] == ["9"]
    early = pick(vs, job_ids=None, states=None, start=None, end=DAY0 + 100, now=DAY0 + 10000)
    assert [v["job_id"] for v in early] == ["7", "8_0"]
    with pytest.raises(ValueError, match="unknown state"):
        sacct.parse_states("F,BOGUS")
    with pytest.raises(ValueError, match="not a job id"):
        sacct.parse_job_ids("7,../x")


def test_sacct_times_and_json_shape():
    assert sacct.parse_when("2026-03-10", 0) == pytest.approx(
        __import__("datetime").datetime(2026, 3, 10).timestamp()
    )
    assert sacct.parse_when("now-2days", 500000.0) == 500000.0 - 172800
    with pytest.raises(ValueError, match="not a time"):
        sacct.parse_when("soon", 0)
    j = sacct.slurm_json([view()])["jobs"][0]
    assert j["job_id"] == 7  # an integer, as Slurm's
    task = sacct.slurm_json([view(job_id="8_0", array_id="8", numeric_id="12")])["jobs"][0]
    assert (task["job_id"], task["array"]["job_id"]) == (12, 8)
    # Slurm 22.05's shape (dbv0.0.38): one-word status and state, signal_id, strsignal's name.
    assert j["exit_code"] == {
        "status": "SIGNALED",
        "return_code": None,
        "signal": {"signal_id": 11, "name": "Segmentation fault"},
    }
    assert j["state"] == {"current": "FAILED", "reason": "the job was killed by SIGSEGV"}
    assert j["restart_cnt"] == 1 and j["array"]["job_id"] == 0 and j["array"]["task_id"] is None
    assert {"type": "gres", "name": "gpu", "id": 1001, "count": 1} in j["tres"]["allocated"]
    assert j["time"]["limit"] == 120 and j["time"]["elapsed"] == 3725
    assert j["time"]["user"] == {"seconds": 1, "microseconds": 500000}
    failed = sacct.slurm_json([view(exit="3:0", exit_code=3, signal=None)])["jobs"][0]
    assert failed["exit_code"] == {"status": "ERROR", "return_code": 3}
    assert sacct.slurm_json([view(time_limit=None)])["jobs"][0]["time"]["limit"] is None


def test_show_lines_give_exit_status_and_signal_apart():
    lines = "\n".join(sacct.show_lines(view()))
    assert "exit_code: 0:11 (status 0, signal 11 SIGSEGV)" in lines
    assert "n1:1 (a100, GPU-1)" in lines and "limit 02:00:00, elapsed 01:02:05" in lines
    assert "restarts:  1" in lines


def test_report_table_csv_and_json():
    t = JobTable()
    run_job(t, "ann", [_member("n1", 2, 4)], DAY0, DAY0 + 1800)
    rows = usage.summarize(t.usage, "2026-03-01", "2026-03-31", ("user", "gpu_type"))
    data = {
        "cluster": "lab",
        "start": "2026-03-01",
        "end": "2026-03-31",
        "by": ["user", "gpu_type"],
        "rows": rows,
    }
    got = list(csv.DictReader(io.StringIO(report.render(data, "csv"))))
    assert got[0]["user"] == "ann" and got[0]["gpu_type"] == "a100" and float(got[0]["gpu_hours"]) == 1.0
    assert json.loads(report.render(data, "json"))["rows"][0]["cpu_seconds"] == 7200
    text = report.render(data, "table")
    assert "TENANT" in text and "GPU-HOURS" in text and "ann" in text


def test_a_running_jobs_elapsed_is_counted_to_now_by_the_clients_not_the_record():
    running = view(state="RUNNING", elapsed=None, end_time=None, start_time=1000.0)
    assert sacct.elapsed(running, now=1060.0) == 60.0
    assert sacct.elapsed(view(state="PENDING", elapsed=None, start_time=None)) is None
    assert sacct.elapsed(view(), now=1e12) == 3725.0  # an ended job's is its record's

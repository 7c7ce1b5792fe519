"""Slurm's commands against a real daemon over real SSH: each command's main path and
exit codes, srun steps inside a job, and a hostile tenant."""

from __future__ import annotations

import json
import re
import shlex

import pytest
from mtgpu_testing import wait_for

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def host():
    from mtgpu_testing import Host

    h = Host({"SIMULATED_GPUS": [{"type": "rtx4090", "count": 2, "vram": "24G"}], "SIMULATED_CPUS": 8})
    h.start()
    keys = {"sam": h.add_user("sam"), "eve": h.add_user("eve")}
    yield h, keys
    h.cleanup()


def run(host, user, *argv, input=None):
    h, keys = host
    r = h.ssh(user, keys[user], shlex.join(argv), input=input)
    return r.returncode, r.stdout.decode(), r.stderr.decode()


def show(host, user, jid):
    rc, out, err = run(host, user, "mt-job", "show", jid, "--json")
    assert rc == 0, err
    return json.loads(out)


def wait_end(host, user, jid, timeout=60):
    final = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
    return wait_for(
        lambda: (j := show(host, user, jid))["state"] in final and j, timeout, f"job {jid} to end"
    )


def sbatch(host, user, script, *opts):
    rc, out, err = run(host, user, "sbatch", "--parsable", *opts, "-", input=script.encode())
    assert rc == 0, err
    return out.strip()


def test_sbatch_prints_slurms_line_and_parsable_the_id_and_refuses_a_bad_option(host) -> None:
    rc, out, err = run(host, "sam", "sbatch", "-", input=b"#!/bin/sh\n#SBATCH -J hello\necho hi\n")
    assert rc == 0, err
    assert out.startswith("Submitted batch job ")
    jid = out.split()[-1]
    j = wait_end(host, "sam", jid)
    assert j["name"] == "hello" and j["state"] == "COMPLETED"
    rc, out, err = run(host, "sam", "sbatch", "--parsable", "--wrap", "echo wrapped-$SLURM_JOB_ID")
    wrapped = out.strip()
    assert rc == 0 and wrapped.isdigit(), err
    j = wait_end(host, "sam", wrapped)
    assert j["state"] == "COMPLETED" and j["name"] == "wrap", j  # Slurm's name for it
    rc, out, err = run(host, "sam", "mt-job", "logs", wrapped)
    assert out.strip() == f"wrapped-{wrapped}"
    rc, out, err = run(host, "sam", "sbatch", "--bogus-option", "x.sh")
    assert rc == 255 and "--bogus-option" in err
    # What sbatch says is sbatch's, not mt-job's.
    rc, out, err = run(host, "sam", "sbatch", "--parsable", "-", input=b"#!/bin/sh\n#SBATCH -p gpu\ntrue\n")
    assert rc == 0 and err.startswith("sbatch: warning: line 2: #SBATCH -p gpu"), err
    wait_end(host, "sam", out.strip())


def test_srun_in_a_job_runs_ntasks_with_distinct_ranks_as_a_listed_step(host) -> None:
    script = (
        "#!/bin/bash\n#MTGPU cpus=2 ram=64M\n"
        "srun -n 3 --overcommit sh -c 'echo task=$SLURM_PROCID local=$SLURM_LOCALID node=$SLURM_NODEID step=$SLURM_STEP_ID'\n"
        "srun -l echo labelled\n"
    )
    jid = sbatch(host, "sam", script)
    j = wait_end(host, "sam", jid)
    assert j["state"] == "COMPLETED", j
    rc, out, err = run(host, "sam", "mt-job", "logs", jid)
    tasks = sorted(line for line in out.splitlines() if line.startswith("task="))
    assert tasks == [f"task={i} local={i} node=0 step=0" for i in range(3)]
    assert "0: labelled" in out.splitlines()
    steps = j["steps"]
    assert [(s["step_id"], s["ntasks"], s["state"], s["exit_code"]) for s in steps] == [
        (f"{jid}.0", 3, "COMPLETED", 0),
        (f"{jid}.1", 1, "COMPLETED", 0),
    ]
    rc, out, err = run(host, "sam", "mt-job", "show", jid)
    assert f"{jid}.0" in out and "COMPLETED" in out


def test_a_failing_step_fails_the_job_with_its_exit_code(host) -> None:
    jid = sbatch(host, "sam", "#!/bin/bash\n#MTGPU ram=64M\nsrun sh -c 'exit 3'\n")
    j = wait_end(host, "sam", jid)
    assert j["state"] == "FAILED" and j["exit_code"] == 3, j
    assert j["steps"][0]["state"] == "FAILED" and j["steps"][0]["exit_code"] == 3
    # Handled by the script (`|| true`): the job goes on and completes.
    jid = sbatch(host, "sam", "#!/bin/bash\n#MTGPU ram=64M\nsrun false || echo handled\n")
    assert wait_end(host, "sam", jid)["state"] == "COMPLETED"


def test_srun_outside_a_job_is_a_blocking_job_with_its_output_and_exit_code(host) -> None:
    rc, out, err = run(
        host,
        "sam",
        "srun",
        "--mem=64",
        "sh",
        "-c",
        "echo out-$SLURM_PROCID job-$SLURM_JOB_ID; echo err >&2; exit 4",
    )
    assert rc == 4, err
    assert "out-0" in out and "err" in err
    # Started at once (within srun's second): as Slurm's, srun says nothing of a queue.
    j = show(host, "sam", out.split("job-")[1].split()[0])
    if j["start_time"] - j["submit_time"] < 0.8:
        assert "queued" not in err and "allocated resources" not in err, err


def test_squeue_scontrol_scancel_main_paths_and_exit_codes(host) -> None:
    jid = sbatch(host, "sam", "#!/bin/bash\n#SBATCH -J sleeper\n#MTGPU ram=64M\nsleep 300\n")
    wait_for(lambda: show(host, "sam", jid)["state"] == "RUNNING", 60, "the job to run")
    rc, out, err = run(host, "sam", "squeue")
    assert rc == 0, err
    assert out.splitlines()[0].split() == "JOBID PARTITION NAME USER ST TIME NODES NODELIST(REASON)".split()
    row = next(line.split() for line in out.splitlines()[1:] if line.split()[0] == jid)
    assert row[2:5] == ["sleeper", "sam", "R"] and row[-1] == "testhost"
    rc, out, _ = run(host, "sam", "squeue", "-h", "-t", "R", "-o", "%i %T %j")
    assert f"{jid} RUNNING sleeper" in out.splitlines()
    rc, out, err = run(host, "sam", "squeue", "-t", "BOGUS")
    assert rc == 1 and "Invalid job state specified: BOGUS" in err
    rc, out, err = run(host, "sam", "squeue", "-j", "999999")
    assert rc == 1 and "Invalid job id specified" in err
    rc, out, err = run(host, "sam", "squeue", "--json")
    assert [j["job_state"] for j in json.loads(out)["jobs"] if j["job_id"] == int(jid)] == ["RUNNING"]
    rc, out, err = run(host, "sam", "scontrol", "show", "job", jid)
    assert rc == 0 and out.startswith(f"JobId={jid} JobName=sleeper") and "JobState=RUNNING" in out
    rc, out, err = run(host, "sam", "scontrol", "show", "job", "999999")
    assert rc == 1 and "Invalid job id specified" in err
    rc, out, err = run(host, "sam", "scontrol", "show", "node")
    assert rc == 0 and out.startswith("NodeName=testhost") and "Gres=gpu:rtx4090:2" in out
    rc, out, err = run(host, "sam", "sinfo", "-h", "-N", "-o", "%N %G")
    assert out.split() == ["testhost", "gpu:rtx4090:2"]
    rc, out, err = run(host, "sam", "scancel", jid)
    assert rc == 0, err
    assert wait_end(host, "sam", jid)["state"] == "CANCELLED"
    rc, out, err = run(host, "sam", "scancel", "999999")
    assert rc == 1 and "Invalid job id specified" in err


def test_mt_job_list_state_format_elapsed_and_collapsed_pending_array(host) -> None:
    script = "#!/bin/bash\n#MTGPU ram=64M array=0-11%1\nsleep 300\n"
    jid = sbatch(host, "sam", script)
    wait_for(lambda: show(host, "sam", f"{jid}_0")["state"] == "RUNNING", 60, "task 0 to run")
    rc, out, err = run(host, "sam", "mt-job", "list", "--state", "PD", "--format", "%i %t")
    assert rc == 0, err
    assert out.splitlines() == ["JOBID ST", f"{jid}_[1-11] PD"]
    rc, out, err = run(host, "sam", "mt-job", "list")
    assert "TIME" in out.splitlines()[0] and f"{jid}_[1-11]" in out
    rc, out, err = run(host, "sam", "mt-job", "list", "--json")
    ids = [j["job_id"] for j in json.loads(out) if j.get("array_id") == jid]
    assert ids == [f"{jid}_{i}" for i in range(12)]  # natural order: _2 before _10
    rc, out, err = run(host, "sam", "mt-job", "list", "--state", "nope")
    assert rc == 2 and "nope" in err.lower()
    run(host, "sam", "scancel", jid)


def test_a_hostile_tenant_cannot_see_cancel_or_inspect_anothers_job(host) -> None:
    jid = sbatch(host, "sam", "#!/bin/bash\n#SBATCH -J secret-plan\n#MTGPU ram=64M\nsleep 300\n")
    wait_for(lambda: show(host, "sam", jid)["state"] == "RUNNING", 60, "the job to run")
    rc, out, err = run(host, "eve", "scancel", jid)
    assert rc == 1 and "Invalid job id specified" in err and "secret" not in out + err
    rc, out, err = run(host, "eve", "scancel", "-u", "sam")
    rc, out, err = run(host, "eve", "scontrol", "show", "job", jid)
    assert rc == 1 and "secret" not in out + err
    rc, out, err = run(host, "eve", "squeue", "-u", "sam")
    assert rc == 0 and "secret" not in out and jid not in out.split()
    rc, out, err = run(host, "eve", "squeue", "--json")
    assert json.loads(out)["jobs"] == []
    # A step of another tenant's job cannot be recorded.
    rc, out, err = run(host, "eve", "env", f"MTGPU_JOB_ID={jid}", "MTGPU_NNODES=1", "srun", "true")
    assert rc == 0 and "not recorded" in err
    j = show(host, "sam", jid)
    assert j["state"] == "RUNNING" and j["steps"] == []
    run(host, "sam", "scancel", jid)


def test_salloc_and_srun_pty_run_a_command_inside_an_allocation(host) -> None:
    rc, out, err = run(
        host, "sam", "salloc", "--mem=64M", "-t", "5", "--", "sh", "-c", "echo in-$SLURM_JOB_ID"
    )
    assert rc == 0, err
    assert "granted job allocation" in err and out.strip().startswith("in-")
    jid = out.strip().removeprefix("in-")
    j = wait_end(host, "sam", jid)
    # Left with status 0: COMPLETED, as Slurm records it (not CANCELLED).
    assert (j["name"], j["state"], j["exit_code"]) == ("interactive", "COMPLETED", 0), j
    rc, out, err = run(host, "sam", "srun", "--pty", "--mem=64M", "sh", "-c", "exit 5")
    assert rc == 5 and "granted job allocation" in err
    jid = err.split("granted job allocation ")[1].split()[0]
    j = wait_end(host, "sam", jid)
    assert (j["state"], j["exit_code"]) == ("FAILED", 5), j
    rc, out, err = run(host, "sam", "sacct", "-X", "-j", jid, "-n", "-P", "-o", "State,ExitCode")
    assert out.strip() == "FAILED|5:0", out
    # Inside, the variables a batch job of it has, not the job id alone.
    rc, out, err = run(
        host,
        "sam",
        "salloc",
        "--mem=64M",
        "-c",
        "2",
        "--",
        "sh",
        "-c",
        "echo $SLURM_JOB_NODELIST $SLURM_CPUS_ON_NODE $SLURM_MEM_PER_NODE $SLURM_NNODES",
    )
    assert rc == 0 and out.split() == [host[0].config["SERVER_NAME"], "2", "64", "1"], (out, err)
    rc, out, err = run(host, "sam", "srun")
    assert rc == 1 and "No command given" in err


def test_array_tasks_have_numeric_slurm_job_ids_that_scancel_and_the_commands_accept(host) -> None:
    h, _ = host
    script = (
        "#!/bin/bash\n#SBATCH -J numbered --array=0-2\n#MTGPU ram=64M\n"
        'echo "id=$SLURM_JOB_ID array=$SLURM_ARRAY_JOB_ID task=$SLURM_ARRAY_TASK_ID"\nsleep 300\n'
    )
    jid = sbatch(host, "sam", script)
    tasks = [f"{jid}_{i}" for i in range(3)]
    for t in tasks:
        wait_for(lambda t=t: show(host, "sam", t)["state"] == "RUNNING", 60, f"task {t} to run")

    def printed(t):
        rc, out, _ = run(host, "sam", "cat", show(host, "sam", t)["stdout"])
        return out.split() if rc == 0 and out.endswith("\n") else None

    lines = {t: wait_for(lambda t=t: printed(t), 60, f"task {t}'s line") for t in tasks}
    numeric = {t: lines[t][0].removeprefix("id=") for t in tasks}
    # Each task's SLURM_JOB_ID is a number of its own, neither the array's nor another's.
    assert all(n.isdigit() for n in numeric.values()), lines
    assert len(set(numeric.values()) | {jid}) == 4, lines
    assert [lines[t][1:] for t in tasks] == [[f"array={jid}", f"task={i}"] for i in range(3)]
    assert all(show(host, "sam", t)["numeric_id"] == numeric[t] for t in tasks)
    n1 = numeric[tasks[1]]
    j = show(host, "sam", n1)
    assert j["job_id"] == tasks[1] and not j.get("array")
    rc, out, err = run(host, "sam", "scontrol", "show", "job", n1)
    assert rc == 0 and out.startswith(f"JobId={tasks[1]} ") and f"ArrayJobId={jid}" in out, err
    rc, out, err = run(host, "sam", "sacct", "-j", n1, "-n", "-o", "JobID,JobIDRaw")
    assert rc == 0 and out.split() == [tasks[1], n1], err
    rc, out, err = run(host, "sam", "squeue", "-h", "-j", n1, "-o", "%i %A")
    assert rc == 0 and out.split() == [tasks[1], n1], err

    # Another tenant naming a task by its numeric id learns nothing: the answer is the
    # one for an id that does not exist.
    for argv in (["scancel"], ["scontrol", "show", "job"], ["mt-job", "show"], ["mt-job", "cancel"]):
        rc, out, err = run(host, "eve", *argv, n1)
        rc_none, out_none, err_none = run(host, "eve", *argv, "999999")
        assert rc == rc_none != 0 and "numbered" not in out + err, (argv, out, err)
        assert err.replace(n1, "ID") == err_none.replace("999999", "ID"), (argv, err, err_none)
    assert show(host, "sam", n1)["state"] == "RUNNING"

    # scancel with a task's numeric id cancels that task only.
    rc, out, err = run(host, "sam", "scancel", n1)
    assert rc == 0, err
    assert wait_end(host, "sam", tasks[1])["state"] == "CANCELLED"
    assert [show(host, "sam", t)["state"] for t in (tasks[0], tasks[2])] == ["RUNNING", "RUNNING"]
    run(host, "sam", "scancel", jid)
    assert all(wait_end(host, "sam", t)["state"] == "CANCELLED" for t in tasks)


def test_exclusive_holds_the_member_whole_and_only_while_its_job_runs(host) -> None:
    # eve runs a small job; sam's --exclusive job waits for the member to be idle
    # (it takes no member from a running job, of anyone).
    small = "#!/bin/bash\n#MTGPU ram=64M\nsleep 300\n"
    holder = sbatch(host, "eve", small)
    wait_for(lambda: show(host, "eve", holder)["state"] == "RUNNING", 60, "eve's job to run")
    rc, out, err = run(host, "sam", "sbatch", "--exclusive=user", "-", input=small.encode())
    assert rc != 0 and "--exclusive=user" in err and "not supported" in err, (rc, out, err)
    whole = sbatch(
        host,
        "sam",
        "#!/bin/bash\n#SBATCH --exclusive -t 1 --gres=gpu:1\n#MTGPU ram=64M\nsleep 300\n",
    )
    j = wait_for(
        lambda: (
            (v := show(host, "sam", whole))["state"] == "PENDING"
            and "run other jobs" in (v.get("reason_detail") or "")
            and v
        ),
        60,
        "the exclusive job's reason",
    )
    assert j["exclusive"] is True and show(host, "eve", holder)["state"] == "RUNNING"
    run(host, "eve", "scancel", holder)
    j = wait_for(lambda: (v := show(host, "sam", whole))["state"] == "RUNNING" and v, 60, "the exclusive job")
    # Every CPU of the member is its, GPUs only as asked; scontrol says it shares nothing.
    (member,) = j["members"]
    assert member["cpus"] == 8 and len(member["gpus"]) == 1, j["members"]
    rc, out, _ = run(host, "sam", "scontrol", "show", "job", whole)
    assert "OverSubscribe=NO" in out
    # Nothing else is placed there while it runs, though a GPU and CPUs' worth of RAM
    # are left: not eve's job, not another of sam's.
    other = sbatch(host, "eve", small)
    mine = sbatch(host, "sam", small)
    for who, jid in (("eve", other), ("sam", mine)):
        v = wait_for(
            lambda who=who, jid=jid: (
                (v := show(host, who, jid))["state"] == "PENDING"
                and "held whole by another job" in (v.get("reason_detail") or "")
                and v
            ),
            60,
            f"{who}'s job's reason",
        )
        assert f"job {whole}" not in v["reason_detail"], v["reason_detail"]
    # It holds the member no longer than its own time limit: then the others start.
    assert wait_end(host, "sam", whole, timeout=120)["state"] == "TIMEOUT"
    for who, jid in (("eve", other), ("sam", mine)):
        wait_for(
            lambda who=who, jid=jid: show(host, who, jid)["state"] == "RUNNING", 60, f"{who}'s job to run"
        )
        run(host, who, "scancel", jid)


def logs(host, user, jid):
    rc, out, err = run(host, user, "mt-job", "logs", jid)
    assert rc == 0, err
    return out


def test_sbatch_gives_the_script_its_arguments_reads_stdin_and_prints_slurms_line(host) -> None:
    script = '#!/bin/bash\n#MTGPU ram=64M\nprintf "[%s]" "$@"; echo\n'
    rc, _, err = run(host, "sam", "sh", "-c", "cat > args.sh", input=script.encode())
    assert rc == 0, err
    # Options stop at the script: what follows is its $1..., passed as words, no shell.
    rc, out, err = run(
        host, "sam", "sbatch", "--nice", "--parsable", "args.sh", "200", "a b", "--gpus=1", "$HOME"
    )
    assert rc == 0, err
    jid = out.strip()
    assert wait_end(host, "sam", jid)["state"] == "COMPLETED"
    assert logs(host, "sam", jid) == "[200][a b][--gpus=1][$HOME]\n"
    rc, out, err = run(host, "sam", "mt-job", "submit", "--parsable", "args.sh", "x;y")
    assert rc == 0, err
    assert wait_end(host, "sam", out.strip())["state"] == "COMPLETED"
    assert logs(host, "sam", out.strip()) == "[x;y]\n"
    # No script named and standard input not a terminal: the script is read from it.
    rc, out, err = run(host, "sam", "sbatch", input=b"#!/bin/sh\n#MTGPU ram=64M\necho from-stdin\n")
    assert rc == 0 and out.startswith("Submitted batch job "), err
    jid = out.split()[-1]
    assert wait_end(host, "sam", jid)["state"] == "COMPLETED"
    assert logs(host, "sam", jid) == "from-stdin\n"
    # An array's line is Slurm's, exactly; mt-job keeps its count of tasks.
    rc, out, err = run(host, "sam", "sbatch", "--array=0-2", "args.sh", "t")
    assert rc == 0 and re.fullmatch(r"Submitted batch job \d+\n", out), (out, err)
    arr = out.split()[-1]
    assert len(show(host, "sam", arr)["tasks"]) == 3
    rc, out, err = run(host, "sam", "mt-job", "submit", "--array=0-1", "args.sh")
    assert rc == 0 and re.fullmatch(r"Submitted job \d+ \(2 array tasks\)\n", out), (out, err)
    for t in (f"{arr}_0", f"{out.split()[2]}_1"):
        assert wait_end(host, "sam", t)["state"] == "COMPLETED"
    assert logs(host, "sam", f"{arr}_2") == "[t]\n"


def test_scontrol_show_hostnames_in_a_job_and_of_a_list(host) -> None:
    script = (
        "#!/bin/bash\n#MTGPU ram=64M\n"
        "scontrol show hostnames $SLURM_JOB_NODELIST\n"
        "scontrol show hostnames\n"
        'MASTER_ADDR=$(scontrol show hostnames | head -n 1); echo "master=$MASTER_ADDR"\n'
    )
    jid = sbatch(host, "sam", script)
    assert wait_end(host, "sam", jid)["state"] == "COMPLETED"
    assert logs(host, "sam", jid) == "testhost\ntesthost\nmaster=testhost\n"
    rc, out, err = run(host, "sam", "scontrol", "show", "hostnames", "node[01-03,07],gpu1")
    assert rc == 0 and out.split() == ["node01", "node02", "node03", "node07", "gpu1"], err
    rc, out, err = run(host, "sam", "scontrol", "show", "hostlist", "node01,node02,gpu1")
    assert rc == 0 and out == "node[01-02],gpu1\n", err
    rc, out, err = run(host, "sam", "scontrol", "show", "hostnames", "node[1-")
    assert rc == 1 and out == "" and err.count("\n") == 1 and "node[1-" in err


def test_scancel_cancels_a_range_of_array_tasks(host) -> None:
    jid = sbatch(host, "sam", "#!/bin/bash\n#SBATCH --array=0-3\n#MTGPU ram=64M\nsleep 300\n")
    rc, out, err = run(host, "sam", "scancel", f"{jid}_[1-2]")
    assert rc == 0, err
    assert [wait_end(host, "sam", f"{jid}_{i}")["state"] for i in (1, 2)] == ["CANCELLED"] * 2
    assert all(show(host, "sam", f"{jid}_{i}")["state"] in ("PENDING", "RUNNING") for i in (0, 3))
    rc, out, err = run(host, "sam", "scancel", f"{jid}_[3")
    assert rc == 1 and err.count("\n") == 1 and "Invalid job id" in err
    assert show(host, "sam", f"{jid}_3")["state"] in ("PENDING", "RUNNING")
    rc, out, err = run(host, "sam", "scancel", f"{jid}_[0,3]")
    assert rc == 0, err
    assert [wait_end(host, "sam", f"{jid}_{i}")["state"] for i in (0, 3)] == ["CANCELLED"] * 2


def test_scontrol_hold_and_release_a_pending_job_and_not_anothers(host) -> None:
    """``scontrol hold|release`` as Slurm's (quiet on success, ids apart by spaces or
    commas); another tenant's hold is "Invalid job id" and changes nothing."""
    first = sbatch(host, "sam", "#!/bin/sh\n#MTGPU cpus=1 ram=64M\nsleep 300\n")
    after = sbatch(host, "sam", "#!/bin/sh\n#MTGPU cpus=1 ram=64M\ntrue\n", f"--dependency=afterok:{first}")
    try:
        assert show(host, "sam", after)["state"] == "PENDING"
        rc, out, err = run(host, "eve", "scontrol", "hold", after)
        assert rc == 1 and "Invalid job id specified" in err and not show(host, "sam", after).get("held"), err
        rc, out, err = run(host, "sam", "scontrol", "hold", after)
        assert (rc, out, err) == (0, "", "") and show(host, "sam", after).get("held") is True
        rc, out, err = run(host, "sam", "scontrol", "-o", "show", "job", after)
        assert rc == 0 and " JobState=PENDING " in out, out + err
        rc, out, err = run(host, "sam", "scontrol", "release", f"{after},{first}")
        assert rc == 1 and f"Job {first} is no longer pending" in err, err
        assert not show(host, "sam", after).get("held")
        rc, out, err = run(host, "sam", "scontrol", "requeue", after)
        assert rc == 1 and "`requeue` is not available" in err and "hold" in err, err
    finally:
        run(host, "sam", "scancel", first, after)


def test_sacct_shows_steps_derived_exit_codes_and_slurms_fields_and_options(host) -> None:
    script = (
        "#!/bin/bash\n#SBATCH -J stepped\n#MTGPU cpus=2 ram=64M\n"
        "srun true\nsrun -n 2 sh -c 'exit 5' || true\nexit 2\n"
    )
    jid = sbatch(host, "sam", script)
    assert wait_end(host, "sam", jid)["state"] == "FAILED"
    fmt = "JobID,JobName,State,ExitCode,DerivedExitCode,NTasks"
    rc, out, err = run(host, "sam", "sacct", "-j", jid, "-P", "-n", "-o", fmt)
    assert rc == 0, err
    assert out.splitlines() == [
        f"{jid}|stepped|FAILED|2:0|5:0|1",
        f"{jid}.0|true|COMPLETED|0:0||1",
        f"{jid}.1|sh|FAILED|5:0||2",
    ], out
    rc, out, err = run(host, "sam", "sacct", "-X", "-j", jid, "-P", "-n", "-o", "JobID")
    assert rc == 0 and out.split() == [jid], (out, err)
    rc, out, err = run(host, "sam", "sacct", "-b", "-X", "-j", jid, "-P")
    assert rc == 0 and out.splitlines() == ["JobID|State|ExitCode", f"{jid}|FAILED|2:0"], (out, err)
    # Fields scripts ask for, and -l, all answer; what is not measured is blank.
    rc, out, err = run(
        host,
        "sam",
        "sacct",
        "-X",
        "-j",
        jid,
        "-P",
        "-n",
        "-o",
        "NCPUS,ReqTRES,AveRSS,MaxVMSize,MaxRSS",
        "--units=M",
    )
    assert rc == 0, err
    ncpus, req, ave, vms, rss = out.strip().split("|")
    assert ncpus == "2" and req == "cpu=2,mem=64M,node=1" and vms == "", out
    assert ave == rss and (rss == "" or rss.endswith("M")), out
    rc, out, err = run(host, "sam", "sacct", "-l", "-X", "-j", jid, "-P")
    assert rc == 0 and out.splitlines()[0].startswith("JobID|JobIDRaw|JobName|Partition|MaxVMSize"), err
    # --name and a relative start as users type it.
    rc, out, err = run(
        host, "sam", "sacct", "-X", "--name", "stepped", "-S", "now-1hour", "-P", "-n", "-o", "JobID"
    )
    assert rc == 0 and jid in out.split(), (out, err)
    rc, out, err = run(host, "sam", "sacct", "-X", "--name", "nosuchname", "-P", "-n", "-o", "JobID")
    assert rc == 0 and out.strip() == "", out
    # Another tenant's steps stay out of reach: eve's sacct names none of sam's job.
    rc, out, err = run(host, "eve", "sacct", "-j", jid, "-P", "-n", "-o", "JobID")
    assert rc == 0 and jid not in out, out


def test_squeue_format_names_sort_start_nodelist_iterate_and_version(host) -> None:
    h, _ = host
    running = sbatch(host, "sam", "#!/bin/sh\n#SBATCH -J runner\n#MTGPU ram=64M\nsleep 300\n")
    wait_for(lambda: show(host, "sam", running)["state"] == "RUNNING", 60, "the runner to run")
    held = [sbatch(host, "sam", f"#!/bin/sh\n#SBATCH -J waiter{i}\ntrue\n", "--hold") for i in range(2)]
    try:
        rc, out, err = run(host, "sam", "squeue", "-h", "-O", "jobid:10,name:12,state:.9")
        assert rc == 0, err
        assert f"{running:<10}{'runner':<12}{'RUNNING':>9}" in out.splitlines(), out
        rc, out, err = run(host, "sam", "squeue", "-h", "-S", "-i", "-o", "%i")
        assert rc == 0 and out.split() == sorted([running, *held], key=int, reverse=True), (out, err)
        rc, out, err = run(host, "sam", "squeue", "--start", "-h", "-o", "%i %S %t")
        assert rc == 0 and sorted(out.splitlines()) == sorted(f"{j} N/A PD" for j in held), (out, err)
        server = h.config["SERVER_NAME"]
        rc, out, err = run(host, "sam", "squeue", "-h", "-w", server, "-o", "%i")
        assert rc == 0 and out.split() == [running], (out, err)
        rc, out, err = run(host, "sam", "squeue", "-h", "-w", "nosuchhost", "-o", "%i")
        assert rc == 0 and out.strip() == "", out
        # -i prints again every N seconds, each time after a blank line and the time.
        rc, out, err = run(host, "sam", "timeout", "3.5", "squeue", "-i", "1", "-h", "-o", "%i")
        stamps = [
            ln for ln in out.splitlines() if ln[:3] in ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
        ]
        assert rc == 124 and len(stamps) >= 2 and "" in out.splitlines(), (rc, out, err)
        rc, out, err = run(host, "sam", "squeue", "-O", "jobid,bogus")
        assert rc == 1 and "unknown field 'bogus' in --Format" in err and len(err.splitlines()) == 1, err
        for cmd in ("squeue", "sinfo", "sbatch", "scancel", "scontrol", "sacct", "srun", "salloc"):
            rc, out, err = run(host, "sam", cmd, "--version")
            assert rc == 0 and out.startswith("slurm 22.05.8 (MTGPU "), (cmd, out, err)
        rc, out, err = run(host, "sam", "squeue", "-V")
        assert rc == 0 and out.split()[:2] == ["slurm", "22.05.8"], out
    finally:
        run(host, "sam", "scancel", running, *held)


def test_sbatch_writes_slurm_jobid_out_where_it_was_submitted_and_mt_job_keeps_its_own(host) -> None:
    h, _ = host
    script = "#!/bin/sh\n#MTGPU ram=64M\necho to-out\necho to-err >&2\n"
    run(host, "sam", "mkdir", "-p", "subdir")
    rc, out, err = run(host, "sam", "sh", "-c", "cd subdir && sbatch --parsable -", input=script.encode())
    assert rc == 0, err
    jid = out.strip()
    j = wait_end(host, "sam", jid)
    home = h.homes / "sam"
    assert j["stdout"] == j["stderr"] == f"{home}/subdir/slurm-{jid}.out", j
    rc, text, _ = run(host, "sam", "cat", f"subdir/slurm-{jid}.out")
    assert sorted(text.split()) == ["to-err", "to-out"], text
    # -e alone: stdout stays in slurm-%j.out, stderr goes where -e says.
    rc, out, err = run(
        host, "sam", "sh", "-c", "cd subdir && sbatch --parsable -e err-%j.txt -", input=script.encode()
    )
    jid = out.strip()
    j = wait_end(host, "sam", jid)
    assert (j["stdout"], j["stderr"]) == (f"{home}/subdir/slurm-{jid}.out", f"{home}/subdir/err-{jid}.txt"), j
    # An #SBATCH -o in the script wins; an array's default names its task.
    rc, out, err = run(
        host, "sam", "sbatch", "--parsable", "-", input=b"#!/bin/sh\n#SBATCH -o mine.txt\ntrue\n"
    )
    assert wait_end(host, "sam", out.strip())["stdout"] == f"{home}/mine.txt"
    rc, out, err = run(host, "sam", "sbatch", "--parsable", "--array=0-1", "--wrap", "true")
    arr = out.strip()
    assert wait_end(host, "sam", f"{arr}_1")["stdout"] == f"{home}/slurm-{arr}_1.out"
    # mt-job submit keeps MTGPU's default place.
    rc, out, err = run(host, "sam", "mt-job", "submit", "--parsable", "-", input=script.encode())
    j = wait_end(host, "sam", out.strip())
    assert "/.mtgpu/jobs/" in j["stdout"] and j["stdout"] != j["stderr"], j


def test_srun_in_a_job_takes_the_options_real_scripts_use(host) -> None:
    h, _ = host
    script = (
        "#!/bin/bash\n#MTGPU cpus=2 ram=64M gpus=2\n"
        "srun --mpi=pmix --cpu-bind=cores -u --kill-on-bad-exit=1 --exclusive --overlap "
        "--distribution=block -n 2 sh -c 'echo t=$SLURM_PROCID'\n"
        "srun -n 2 --export=ALL,FOO=bar sh -c 'echo foo=$FOO'\n"
        "HIDDEN=x srun -n 1 --export=NONE sh -c 'echo hidden=${HIDDEN:-none} job=$SLURM_JOB_ID'\n"
        "srun -n 2 -o out-%j-%t.txt sh -c 'echo o=$SLURM_PROCID; echo e=$SLURM_PROCID >&2'\n"
        "srun -n 2 --gpus-per-task=1 sh -c 'echo g$SLURM_PROCID=$CUDA_VISIBLE_DEVICES'\n"
        "srun -n 2 --gpus-per-task=0 true\n"
        "srun -n 3 -O --gpus-per-task=1 true || echo refused=$?\n"
    )
    jid = sbatch(host, "sam", script)
    j = wait_end(host, "sam", jid)
    assert j["state"] == "COMPLETED", j
    rc, out, _ = run(host, "sam", "cat", j["stdout"])
    lines = out.splitlines()
    assert sorted(ln for ln in lines if ln.startswith("t=")) == ["t=0", "t=1"], out
    assert [ln for ln in lines if ln.startswith("foo=")] == ["foo=bar", "foo=bar"], out
    assert f"hidden=none job={jid}" in lines, out
    gpus = sorted(ln for ln in lines if ln.startswith("g"))
    assert len(gpus) == 2 and len({g.split("=")[1] for g in gpus}) == 2, out  # one GPU each, not shared
    assert "refused=1" in lines and "needs 3 GPUs; the job holds 2" in out, out
    assert "--mpi=pmix: tasks start without a PMI server" in out, out
    for t in (0, 1):
        rc, text, _ = run(host, "sam", "cat", f"out-{jid}-{t}.txt")
        assert sorted(text.split()) == [f"e={t}", f"o={t}"], text


def test_a_step_gets_its_own_gpus_and_cannot_ask_past_the_job(host) -> None:
    """Steps are allocations inside the job: a step's GPUs are its own while it runs
    (two at once never share one), and more CPUs or memory than the job has is refused
    as Slurm refuses it, before anything runs."""
    script = (
        "#!/bin/bash\n#MTGPU cpus=2 ram=64M gpus=2\n"
        "srun -n 1 --gres=gpu:1 sh -c 'echo one=$CUDA_VISIBLE_DEVICES'\n"
        "srun -n 4 true || echo four=$?\n"
        "srun -n 4 --overcommit true && echo overcommit=ok\n"
        "srun --mem=50G true || echo mem=$?\n"
        "srun -n1 -G 1 sh -c 'echo a=$CUDA_VISIBLE_DEVICES; sleep 2' &\n"
        "srun -n1 -G 1 sh -c 'echo b=$CUDA_VISIBLE_DEVICES; sleep 2' &\n"
        "wait\n"
        "srun -n1 --gres=gpu:1 sleep 3 &\n"
        "sleep 1\n"
        "srun -n1 --gres=gpu:2 sh -c 'echo later=$CUDA_VISIBLE_DEVICES'\n"
        "wait\n"
    )
    jid = sbatch(host, "sam", script)
    j = wait_end(host, "sam", jid, timeout=90)
    assert j["state"] == "COMPLETED", j
    rc, out, _ = run(host, "sam", "cat", j["stdout"])
    got = dict(ln.split("=", 1) for ln in out.splitlines() if "=" in ln and ln.split("=")[0].isalpha())
    assert len(got["one"].split(",")) == 1, out
    assert got["four"] == "1" and "More processors requested than permitted" in out, out
    assert got["overcommit"] == "ok", out
    assert got["mem"] == "1" and "Memory required by task is not available" in out, out
    assert got["a"] != got["b"] and len(got["a"].split(",")) == len(got["b"].split(",")) == 1, out
    assert len(got["later"].split(",")) == 2, out
    assert "Job step creation temporarily disabled, retrying" in out, out
    assert [s["gpus"] for s in j["steps"][:1]] == [[0]], j["steps"]


def test_squeue_start_shows_when_the_next_job_in_line_should_start(host) -> None:
    """The scheduler holds resources back for the next job in line and knows when they
    free up (the running job's time limit): squeue --start says so, as Slurm's backfill
    estimate; a job waiting on a dependency has no place in the queue yet."""
    import datetime as dt

    running = sbatch(host, "sam", "#!/bin/sh\n#SBATCH --gres=gpu:2 -t 10\n#MTGPU ram=64M\nsleep 300\n")
    j = wait_for(lambda: (v := show(host, "sam", running))["state"] == "RUNNING" and v, 60, "the runner")
    nxt = sbatch(host, "sam", "#!/bin/sh\n#SBATCH --gres=gpu:2\n#MTGPU ram=64M\ntrue\n")
    after = sbatch(host, "sam", "#!/bin/sh\n#MTGPU ram=64M\ntrue\n", f"--dependency=afterok:{running}")
    try:

        def expected() -> str | None:
            rc, out, _ = run(host, "sam", "squeue", "--start", "-h", "-j", nxt, "-o", "%i %S")
            when = out.split()[1] if rc == 0 and len(out.split()) == 2 else "N/A"
            return None if when == "N/A" else when

        when = wait_for(expected, 30, "an expected start for the next job")
        start = dt.datetime.fromisoformat(when).timestamp()
        assert abs(start - (j["start_time"] + 600)) < 5, (when, j["start_time"])
        waiting = wait_for(lambda: (v := show(host, "sam", after))["reason"] == "Dependency" and v, 30, "dep")
        assert waiting["position"] is None, waiting
    finally:
        run(host, "sam", "scancel", running, nxt, after)


def test_json_of_squeue_scontrol_and_sacct_has_slurm_22_05s_shapes(host) -> None:
    """``job_id`` a number and ``job_state`` one word in all three (sacct's as
    ``state.current``, dbv0.0.38); sacct nests the job's steps in ``steps`` and gives
    ``exit_code`` as ``{"status", "return_code", "signal": {"signal_id", "name"}}``."""
    jid = sbatch(host, "sam", "#!/bin/sh\n#SBATCH -J shaped\n#MTGPU ram=64M\nsrun true\nsleep 300\n")
    wait_for(lambda: show(host, "sam", jid).get("steps"), 60, "the job's first step")
    try:
        rc, out, err = run(host, "sam", "squeue", "-j", jid, "--json")
        (sq,) = json.loads(out)["jobs"]
        rc, out, err = run(host, "sam", "scontrol", "show", "job", jid, "--json")
        (sc,) = json.loads(out)["jobs"]
        rc, out, err = run(host, "sam", "sacct", "-j", jid, "--json")
        (sa,) = json.loads(out)["jobs"]
        assert sq["job_id"] == sc["job_id"] == sa["job_id"] == int(jid)
        assert sq["job_state"] == sc["job_state"] == sa["state"]["current"] == "RUNNING", (sq, sa)
        assert sq["array_job_id"] == 0 and sa["array"] == {**sa["array"], "job_id": 0, "task_id": None}
        assert [(s["step"]["job_id"], s["step"]["id"], s["state"]) for s in sa["steps"]] == [
            (int(jid), 0, "COMPLETED")
        ]
        assert sa["steps"][0]["exit_code"] == {"status": "SUCCESS", "return_code": 0}
    finally:
        run(host, "sam", "scancel", jid)
    wait_end(host, "sam", jid)
    rc, out, err = run(host, "sam", "sacct", "-j", jid, "--json")
    (sa,) = json.loads(out)["jobs"]
    assert sa["state"]["current"] == "CANCELLED" and sa["exit_code"]["status"] == "SIGNALED", sa
    assert sa["exit_code"]["signal"] == {"signal_id": 15, "name": "Terminated"}


def test_sinfo_cpus_summary_long_nodes_and_scontrol_allocs_of_a_running_job(host) -> None:
    """A running 2-CPU, 64M job: scontrol show node's CPUAlloc=2 and AllocMem=64,
    sinfo's %C 2/6/0/8, ``-s`` NODES(A/I/O/T) and ``-N -l`` as Slurm 22.05's."""
    jid = sbatch(host, "sam", "#!/bin/sh\n#MTGPU cpus=2 ram=64M\nsleep 300\n")
    wait_for(lambda: show(host, "sam", jid)["state"] == "RUNNING", 60, "the job to run")
    try:
        rc, out, err = run(host, "sam", "scontrol", "-o", "show", "node")
        assert rc == 0, err
        fields = dict(f.split("=", 1) for f in out.split())
        assert (fields["CPUAlloc"], fields["CPUTot"], fields["AllocMem"]) == ("2", "8", "64"), out
        rc, out, err = run(host, "sam", "sinfo", "-h", "-o", "%C")
        assert (rc, out) == (0, "2/6/0/8\n"), err
        rc, out, err = run(host, "sam", "sinfo", "-s")
        assert rc == 0 and out.splitlines()[0].split() == [
            "PARTITION",
            "AVAIL",
            "TIMELIMIT",
            "NODES(A/I/O/T)",
            "NODELIST",
        ]
        assert out.splitlines()[1].split()[3] == "1/0/0/1", out
        rc, out, err = run(host, "sam", "sinfo", "-N", "-l")
        lines = out.splitlines()
        assert rc == 0 and len(lines) == 3 and lines[0][:3].isalpha(), out  # the date first, as Slurm's
        assert lines[1].split()[:6] == ["NODELIST", "NODES", "PARTITION", "STATE", "CPUS", "S:C:T"], out
        assert lines[2].split()[3:5] == ["mixed", "8"], out
    finally:
        run(host, "sam", "scancel", jid)


def test_mem_0_gives_the_job_all_of_its_members_memory(host) -> None:
    """``sbatch --mem=0``: all of the member's memory, as Slurm's (it was refused):
    the job is allocated the member's RealMemory and holds the member whole."""
    rc, out, err = run(host, "sam", "scontrol", "-o", "show", "node")
    real = int(dict(f.split("=", 1) for f in out.split())["RealMemory"])
    jid = sbatch(host, "sam", "#!/bin/sh\necho MEM=$SLURM_MEM_PER_NODE\n", "--mem=0")
    j = wait_end(host, "sam", jid)
    assert j["state"] == "COMPLETED" and j["alloc_ram"] >> 20 == real, j
    # As Slurm's: the job's memory is the member's, in MiB.
    rc, out, err = run(host, "sam", "cat", j["stdout"])
    assert f"MEM={real}" in out, (out, err)
    rc, out, err = run(host, "sam", "scontrol", "-o", "show", "job", jid)
    assert "MinMemoryNode=0" in out and "OverSubscribe=NO" in out, out

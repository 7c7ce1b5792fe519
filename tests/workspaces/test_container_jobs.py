"""Containerized jobs on a real host: ``container=`` runs the job file in a rootless
podman container as the tenant, and the container is gone when the job ends, however
it ends (completion, cancel, a daemon killed with SIGKILL and started again)."""

from __future__ import annotations

import json
import shlex
import signal
import time
from typing import Any

import pytest

pytestmark = [pytest.mark.root, pytest.mark.podman]


def submit(w: Any, body: str, *opts: str) -> str:
    _, out, _ = w.run(shlex.join(["mt-job", "submit", "--parsable", *opts, "-"]), input=body.encode())
    return out.strip()


def show(w: Any, jid: str) -> dict[str, Any]:
    return json.loads(w.run(f"mt-job show {jid} --json")[1])


def wait_job(w: Any, jid: str, states: set[str], timeout: float = 60) -> dict[str, Any]:
    deadline = time.time() + timeout
    while True:
        v = show(w, jid)
        tasks = v["tasks"] if v.get("array") else [v]
        if all(t["state"] in states for t in tasks):
            return v
        assert time.time() < deadline, f"job {jid} is not {states}: {v}\n{w.host.log()[-3000:]}"
        time.sleep(0.2)


def job_containers(w: Any) -> list[str]:
    _, out, _ = w.run("podman ps --all --filter label=mtgpu.job --format '{{.Names}}'")
    return out.split()


def wait_container(w: Any, jid: str) -> None:
    """Until the job runs and its container exists."""
    wait_job(w, jid, {"RUNNING"})
    deadline = time.time() + 30
    while f"mtgpu-job-{jid}" not in job_containers(w):
        assert time.time() < deadline, show(w, jid)
        time.sleep(0.2)


def test_a_container_job_runs_as_the_tenant_with_the_job_variables(ws_host) -> None:
    w = ws_host
    jid = submit(
        w,
        "#!/bin/sh\n#MTGPU container=busybox name=inbox\n"
        "id -u; echo $MTGPU_JOB_ID $SLURM_JOB_ID; pwd; echo $HOME; "
        "tr '\\0' ' ' < /proc/1/cmdline; echo; echo made-in-job > $HOME/from-job.txt; "
        "cat "
        + str(w.datasets)
        + "/imagenet/labels.txt /datasets/"
        + w.datasets.name
        + "/imagenet/labels.txt\n",
    )
    v = wait_job(w, jid, {"COMPLETED", "FAILED"})
    out = w.home / f".mtgpu/jobs/{w.host.config['SERVER_NAME']}/{jid}/stdout.log"
    text = open(v["stdout"]).read() if v["stdout"] else out.read_text()
    log = w.home / ".mtgpu/podman-policy.log"
    assert v["state"] == "COMPLETED", (
        v["reason"],
        open(v["stderr"]).read()[-500:],
        log.exists() and log.read_text(),
    )
    lines = text.splitlines()
    assert lines[0] == str(w.uid)
    assert lines[1] == f"{jid} {jid}"
    assert lines[2] == lines[3] == str(w.home)  # the working directory, the home
    assert lines[4].strip() == "/bin/sh /.mtgpu-job"  # PID 1 of its own PID namespace
    assert lines.count("cat") == lines.count("dog") == 2  # the datasets, at both paths
    made = w.home / "from-job.txt"
    assert made.read_text() == "made-in-job\n" and made.stat().st_uid == w.uid
    assert v["container"] == "busybox" and len(v["image_id"]) == 64
    assert job_containers(w) == []


def test_cancel_and_an_array_leave_no_container(ws_host) -> None:
    w = ws_host
    jid = submit(w, "#!/bin/sh\n#MTGPU container=busybox\necho up; sleep 300\n")
    wait_container(w, jid)
    w.run(f"mt-job cancel {jid}")
    assert wait_job(w, jid, {"CANCELLED"})["state"] == "CANCELLED"
    arr = submit(
        w,
        "#!/bin/sh\n#MTGPU container=busybox array=0-2\n"
        "echo $MTGPU_ARRAY_TASK_ID $container $(tr '\\0' _ < /proc/1/cmdline) "
        "> $HOME/task-$MTGPU_ARRAY_TASK_ID.txt\n",
    )
    v = wait_job(w, arr, {"COMPLETED", "FAILED"})
    assert {t["state"] for t in v["tasks"]} == {"COMPLETED"}, v
    seen = [(w.home / f"task-{i}.txt").read_text().split() for i in range(3)]
    assert [s[0] for s in seen] == ["0", "1", "2"]
    # each task is PID 1 of a podman container of its own
    assert all(s[1:] == ["podman", "/bin/sh_/.mtgpu-job_"] for s in seen), seen
    assert job_containers(w) == []


def test_an_image_the_policy_refuses_or_that_is_missing_is_refused_at_submission(ws_host) -> None:
    w = ws_host
    rc, _, err = w.run(
        "mt-job submit -", ok=False, input=b"#!/bin/sh\n#MTGPU container=docker.io/library/alpine:3\ntrue\n"
    )
    assert rc != 0 and "container=docker.io/library/alpine:3" in err and "user-images" in err, err
    rc, _, err = w.run(
        "mt-job submit -", ok=False, input=b"#!/bin/sh\n#SBATCH --container-image=saved:nothing\ntrue\n"
    )
    assert rc != 0 and "you have no saved image 'nothing'" in err, err


def test_the_container_goes_when_its_job_ends_after_the_daemon_was_killed(ws_host) -> None:
    w = ws_host
    jid = submit(w, "#!/bin/sh\n#MTGPU container=busybox\nsleep 4; echo survived\n")
    wait_container(w, jid)
    w.host.stop(sig=signal.SIGKILL)
    w.host.start()
    v = wait_job(w, jid, {"COMPLETED", "FAILED", "NODE_FAIL"})
    assert v["state"] == "COMPLETED", v
    assert open(v["stdout"]).read() == "survived\n"
    assert job_containers(w) == []

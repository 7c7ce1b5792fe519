"""Submission through a real daemon, with both mt-job clients: refusals that name the
directive, bad input refused at once, the default job name, and what the submitting
shell hands its job (environment, umask, resource limits), with hostile tenants."""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path

import pytest
from mtgpu_testing import MT_JOB_CLIENTS, wait_for

pytestmark = [pytest.mark.root, pytest.mark.mtjob_clients]

FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"}


@pytest.fixture(scope="module", params=MT_JOB_CLIENTS)
def sub_host(request):
    """One host per mt-job client, with a small JOB_SCRIPT_MAX."""
    from mtgpu_testing import Host

    h = Host({"SIMULATED_CPUS": 4, "JOB_SCRIPT_MAX": "64K", "NODE_FEATURES": ["fast", "nvme"]})
    h.mt_job_client = request.param
    h.start()
    keys = {u: h.add_user(u) for u in ("sue", "tom")}
    yield h, keys
    h.cleanup()


def sh(host, keys, user, command, input=None, timeout=60):
    return host.ssh(user, keys[user], command, input=input, timeout=timeout)


def submit(host, keys, user, script, prefix="", args=""):
    r = sh(host, keys, user, f"{prefix}mt-job submit --parsable {args} -", input=script.encode())
    assert r.returncode == 0, r.stderr
    return r.stdout.decode().strip()


def show(host, keys, user, jid):
    r = sh(host, keys, user, f"mt-job show {jid} --json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def finished(host, keys, user, jid, timeout=90):
    return wait_for(
        lambda: (j := show(host, keys, user, jid))["state"] in FINAL and j, timeout, f"job {jid} to end"
    )


def jobs_of(host, keys, user):
    r = sh(host, keys, user, "mt-job list --all --json")
    assert r.returncode == 0, r.stderr
    return [j["job_id"] for j in json.loads(r.stdout)]


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    ("script", "said"),
    [
        (
            "#!/bin/bash\n#SBATCH --gress=gpu:1\ntrue\n",
            "line 2: #SBATCH --gress=gpu:1: unknown option, did you mean --gres?",
        ),
        (
            "#!/bin/bash\n#MTGPU cpus=1\n#SBATCH -c 2\ntrue\n",
            "line 3: #SBATCH -c 2 conflicts with line 2: #MTGPU cpus=1; keep one of the two lines",
        ),
        (
            "#!/bin/bash\n#SBATCH --reservation=maint\ntrue\n",
            "--reservation is refused: MTGPU has no advance reservations",
        ),
        ("", "the job file is empty"),
        ("\n\n  \n", "the job file is empty"),
    ],
)
def test_a_refused_job_file_is_named_and_nothing_is_queued(sub_host, script, said):
    host, keys = sub_host
    before = jobs_of(host, keys, "sue")
    r = sh(host, keys, "sue", "mt-job submit -", input=script.encode())
    err = r.stderr.decode()
    assert r.returncode == 1 and r.stdout == b"", err
    assert err.startswith("mt-job: ") and said in err, err
    assert err.count("\n") == 1, err  # one line, no traceback
    assert jobs_of(host, keys, "sue") == before


def test_a_warning_names_the_option_and_the_job_runs(sub_host):
    host, keys = sub_host
    r = sh(host, keys, "sue", "mt-job submit --parsable -", input=b"#!/bin/bash\n#SBATCH -p gpu -c 1\ntrue\n")
    assert r.returncode == 0, r.stderr
    assert (
        "mt-job: warning: line 2: #SBATCH -p gpu: --partition is ignored: has no effect" in r.stderr.decode()
    )
    assert finished(host, keys, "sue", r.stdout.decode().strip())["state"] == "COMPLETED"


def test_bad_bytes_and_oversized_scripts_are_refused_at_once_naming_where(sub_host):
    host, keys = sub_host
    before = jobs_of(host, keys, "sue")
    r = sh(host, keys, "sue", "mt-job submit -", input=b"#!/bin/bash\necho caf\xe9\n")
    assert r.returncode == 1, r
    assert "byte 0xe9 at offset 20 (line 2)" in r.stderr.decode(), r.stderr
    big = b"#!/bin/bash\n" + b"# padding padding padding\n" * 4000  # 104K, over the 64K limit
    r = sh(host, keys, "sue", "mt-job submit -", input=big)
    err = r.stderr.decode()
    assert r.returncode == 1 and "JOB_SCRIPT_MAX is 65536" in err and f"is {len(big)} bytes" in err, err
    huge = b"#!/bin/bash\n" + b"x" * (5 << 20)  # past what one request line may carry
    r = sh(host, keys, "sue", "mt-job submit -", input=huge, timeout=120)
    err = r.stderr.decode()
    assert r.returncode == 1 and "JOB_SCRIPT_MAX" in err and "Broken pipe" not in err, err
    assert jobs_of(host, keys, "sue") == before


# ------------------------------------------------------------------ the default name


def test_the_default_name_is_the_job_files_and_sbatch_for_standard_input(sub_host):
    host, keys = sub_host
    r = sh(
        host,
        keys,
        "sue",
        "mkdir -p proj && cat > proj/train-2.sh",
        input=b"#!/bin/bash\necho $SLURM_JOB_NAME\n",
    )
    assert r.returncode == 0, r.stderr
    r = sh(host, keys, "sue", "cd proj && mt-job submit --parsable train-2.sh")
    assert r.returncode == 0, r.stderr
    j = finished(host, keys, "sue", r.stdout.decode().strip())
    assert j["name"] == "train-2.sh" and open(j["stdout"]).read() == "train-2.sh\n"
    jid = submit(host, keys, "sue", "#!/bin/bash\necho $SLURM_JOB_NAME\n")
    j = finished(host, keys, "sue", jid)
    assert j["name"] == "sbatch" and open(j["stdout"]).read() == "sbatch\n"
    # A directive still wins, and the command line wins over it.
    jid = submit(host, keys, "sue", "#!/bin/bash\n#SBATCH -J mine\ntrue\n", args="-J theirs")
    assert show(host, keys, "sue", jid)["name"] == "theirs"


# ------------------------------------------------------------------ the submitting shell

PROBE = (
    "#!/bin/bash\n{directives}"
    'echo "umask=$(umask) nofile=$(ulimit -Sn):$(ulimit -Hn) core=$(ulimit -Sc) '
    "epochs=${{EPOCHS-unset}} id=$MTGPU_JOB_ID home=$HOME path=$PATH preload=${{LD_PRELOAD-unset}} "
    'ppid=$PPID"\n'
    "{tail}"
)


def probe(host, keys, user, prefix, directives="", tail="", args=""):
    jid = submit(host, keys, user, PROBE.format(directives=directives, tail=tail), prefix=prefix, args=args)
    return jid


def fields_of(path: str) -> dict[str, str]:
    return dict(w.split("=", 1) for w in open(path).read().split())


def test_umask_limits_and_environment_of_the_submitting_shell_reach_the_job(sub_host):
    host, keys = sub_host
    jid = probe(
        host,
        keys,
        "sue",
        "umask 0027; ulimit -n 512; ulimit -S -c 0; export EPOCHS=7 MTGPU_JOB_ID=forged HOME=/tmp PATH=/opt/x:$PATH; ",
    )
    j = finished(host, keys, "sue", jid)
    assert j["state"] == "COMPLETED", j
    f = fields_of(j["stdout"])
    home = host.passwd("sue")[5]
    assert (f["umask"], f["nofile"], f["core"], f["epochs"]) == ("0027", "512:512", "0", "7"), f
    assert f["id"] == jid and f["home"] == home, f  # MTGPU's own variables are never taken
    assert f["path"].startswith("/opt/x:"), f
    # What the job writes is made with that umask.
    r = sh(host, keys, "sue", "umask 0077; mt-job submit --parsable -", input=b"#!/bin/bash\ntouch made\n")
    finished(host, keys, "sue", r.stdout.decode().strip())
    assert oct(os.stat(Path(home) / "made").st_mode & 0o777) == "0o600"


def test_export_none_and_a_list_keep_only_what_they_name(sub_host):
    host, keys = sub_host
    jid = probe(host, keys, "sue", "export EPOCHS=7; ", directives="#SBATCH --export=NONE\n")
    f = fields_of(finished(host, keys, "sue", jid)["stdout"])
    # The default PATH, after the daemon's own tools (srun, mt-job) that every job has.
    assert f["epochs"] == "unset" and f["path"].endswith(":/usr/local/bin:/usr/bin:/bin"), f
    jid = probe(host, keys, "sue", "export EPOCHS=7; ", args="--export=EPOCHS=9")
    f = fields_of(finished(host, keys, "sue", jid)["stdout"])
    assert f["epochs"] == "9", f


def test_an_admin_turns_limit_propagation_off(sub_host):
    host, keys = sub_host
    host.config_path.write_text(
        __import__("yaml").safe_dump({**host.config, "PROPAGATE_RESOURCE_LIMITS": "NONE"})
    )
    try:
        r = host.api("config.reload")
        assert r.get("ok"), r
        jid = probe(host, keys, "sue", "ulimit -n 256; ")
        f = fields_of(finished(host, keys, "sue", jid)["stdout"])
        assert f["nofile"] != "256:256", f
    finally:
        host.config_path.write_text(__import__("yaml").safe_dump(host.config))
        host.api("config.reload")


def test_hostile_limits_and_preload_go_no_further_than_the_tenants_own_job(sub_host):
    """Hostile: limits above the member's own hard limits, sent straight to the API,
    are held within them; LD_PRELOAD exported reaches the job only, never the root
    supervisor that starts it; a forged umask or limit name is refused."""
    from security_testing import api_socket, call

    host, keys = sub_host
    assert sh(host, keys, "tom", "true").returncode == 0  # the account is made at first login
    uid = int(host.passwd("tom")[2])
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    script = PROBE.format(directives="", tail="sleep 30\n")
    args = {
        "script": script,
        "workdir": host.passwd("tom")[5],
        "umask": 0o022,
        "rlimits": {"nofile": [-1, -1], "core": [-1, -1]},
        "env": {"LD_PRELOAD": "/nonexistent/evil.so", "EPOCHS": "3", "SLURM_JOB_ID": "1"},
    }
    with api_socket(host.run_dir, uid) as s:
        r = call(s, "job.submit", args)
        assert r["ok"], r
        jid = r["result"]["job_id"]
        for bad in (
            {"umask": 0o7777},
            {"rlimits": {"nofiles": [1, 1]}},
            {"rlimits": {"nofile": [1]}},
            {"env": []},
        ):
            r = call(s, "job.submit", {**args, **bad})
            assert not r["ok"] and r["code"] in ("rejected", "invalid"), (bad, r)
    j = wait_for(lambda: (j := show(host, keys, "tom", jid))["start_time"] and j, 60, "tom's job to start")
    out = Path(j["stdout"])
    wait_for(lambda: out.exists() and out.read_text().endswith("\n"), 30, "the probe's line")
    f = fields_of(str(out))
    try:
        soft, hard_seen = f["nofile"].split(":")
        assert int(hard_seen) <= hard and int(soft) <= hard, (f, hard)
        assert f["preload"] == "/nonexistent/evil.so" and f["epochs"] == "3", f
        supervisor = int(f["ppid"])
        environ = Path(f"/proc/{supervisor}/environ").read_bytes()
        assert Path(f"/proc/{supervisor}/status").read_text().split("Uid:")[1].split()[0] == "0"
        assert b"LD_PRELOAD" not in environ and b"evil" not in environ
    finally:
        sh(host, keys, "tom", f"mt-job cancel {jid}")


def test_an_exported_environment_is_bounded(sub_host):
    """Hostile: an environment larger than a job takes is refused by name, at once."""
    host, keys = sub_host
    before = jobs_of(host, keys, "tom")
    r = sh(
        host,
        keys,
        "tom",
        "for i in 1 2 3; do export BIG$i=$(head -c 100000 /dev/zero | tr '\\0' x); done; mt-job submit -",
        input=b"#!/bin/bash\ntrue\n",
    )
    err = r.stderr.decode()
    assert r.returncode == 1 and "the exported environment is" in err and "--export=NONE" in err, err
    assert jobs_of(host, keys, "tom") == before


# ------------------------------------------------------------------ gates: dependencies, holds


def test_dependencies_hold_and_release(sub_host):
    host, keys = sub_host
    sh(host, keys, "sue", "rm -f go")
    first = submit(host, keys, "sue", "#!/bin/bash\nwhile [ ! -e go ]; do sleep 0.2; done; exit 3\n")
    ok = submit(host, keys, "sue", "#!/bin/bash\necho ran\n", args=f"--dependency=afterok:{first}")
    notok = submit(host, keys, "sue", "#!/bin/bash\necho ran\n", args=f"-d afternotok:{first}")
    keep = submit(
        host,
        keys,
        "sue",
        "#!/bin/bash\ntrue\n",
        args=f"--dependency=afterok:{first} --kill-on-invalid-dep=no",
    )
    held = submit(host, keys, "sue", "#!/bin/bash\n#SBATCH --hold\necho ran\n")
    j = show(host, keys, "sue", ok)
    assert j["state"] == "PENDING" and j["reason"] == "Dependency", j
    assert sh(host, keys, "sue", "touch go").returncode == 0
    assert finished(host, keys, "sue", first)["state"] == "FAILED"
    j = finished(host, keys, "sue", ok)
    assert j["state"] == "CANCELLED" and j["reason"].startswith("DependencyNeverSatisfied: job "), j
    assert j["start_time"] is None
    assert finished(host, keys, "sue", notok)["state"] == "COMPLETED"
    wait_for(lambda: show(host, keys, "sue", keep)["reason"] == "DependencyNeverSatisfied", 30, "the reason")
    assert show(host, keys, "sue", keep)["state"] == "PENDING"
    assert show(host, keys, "sue", held)["reason"] == "JobHeldUser"
    r = sh(host, keys, "sue", f"mt-job release {held}")
    assert r.returncode == 0 and r.stdout.decode() == f"Released job {held}\n", r
    assert finished(host, keys, "sue", held)["state"] == "COMPLETED"
    sh(host, keys, "sue", f"mt-job cancel {keep}")


def test_a_dependency_on_another_tenants_job_is_refused_as_unknown(sub_host):
    """Hostile: naming another tenant's job in a dependency (to learn how it ended, or
    to hold one's jobs on it) is refused as a job that does not exist; releasing or
    holding another tenant's job finds none."""
    host, keys = sub_host
    theirs = submit(host, keys, "sue", "#!/bin/bash\n#SBATCH --hold\ntrue\n")
    r = sh(host, keys, "tom", f"mt-job submit --dependency=afterok:{theirs} -", input=b"#!/bin/bash\ntrue\n")
    err = r.stderr.decode()
    assert r.returncode == 1 and f"no job {theirs} of yours" in err, err
    missing = sh(
        host, keys, "tom", "mt-job submit --dependency=afterok:999999 -", input=b"#!/bin/bash\ntrue\n"
    )
    assert err.replace(theirs, "X") == missing.stderr.decode().replace(
        "999999", "X"
    )  # nothing tells them apart
    for verb in ("release", "hold"):
        r = sh(host, keys, "tom", f"mt-job {verb} {theirs}")
        assert r.returncode == 1 and f"no job {theirs} of yours" in r.stderr.decode(), r
    assert show(host, keys, "sue", theirs)["reason"] == "JobHeldUser"
    sh(host, keys, "sue", f"mt-job cancel {theirs}")


def test_test_only_answers_and_submits_nothing_and_wait_returns_the_exit_status(sub_host):
    host, keys = sub_host
    before = jobs_of(host, keys, "sue")
    r = sh(host, keys, "sue", "mt-job submit -", input=b"#!/bin/bash\n#SBATCH --test-only -c 1\ntrue\n")
    assert r.returncode == 0 and r.stdout == b"", r
    assert r.stderr.decode().startswith("mt-job: the job would start now on "), r.stderr
    r = sh(host, keys, "sue", "mt-job submit --test-only --begin=now+1hour -", input=b"#!/bin/bash\ntrue\n")
    assert r.returncode == 0 and "would wait (BeginTime" in r.stderr.decode(), r.stderr
    assert jobs_of(host, keys, "sue") == before
    r = sh(
        host,
        keys,
        "sue",
        "mt-job submit --parsable -",
        input=b"#!/bin/bash\n#SBATCH --wait\nsleep 1; exit 4\n",
    )
    assert r.returncode == 4, r
    jid = r.stdout.decode().split()[0]
    assert show(host, keys, "sue", jid)["state"] == "FAILED"
    later = submit(host, keys, "sue", "#!/bin/bash\ntrue\n", args="--begin=now+1hour")
    assert show(host, keys, "sue", later)["reason"] == "BeginTime"
    sh(host, keys, "sue", f"mt-job cancel {later}")


def test_constraint_and_exclude_choose_members(sub_host):
    host, keys = sub_host
    jid = submit(host, keys, "sue", "#!/bin/bash\n#SBATCH --constraint='fast&nvme' -c 1\ntrue\n")
    assert finished(host, keys, "sue", jid)["state"] == "COMPLETED"
    r = sh(host, keys, "sue", "mt-job submit -C gpu80g -", input=b"#!/bin/bash\ntrue\n")
    assert (
        r.returncode == 1
        and "--constraint=gpu80g: only 0 member(s) of this cluster qualify" in r.stderr.decode()
    ), r
    r = sh(host, keys, "sue", "mt-job nodes --json")
    (name,) = [n["name"] for n in json.loads(r.stdout)]
    r = sh(host, keys, "sue", f"mt-job submit --exclude={name} -", input=b"#!/bin/bash\ntrue\n")
    assert r.returncode == 1 and "--exclude: only 0 member(s)" in r.stderr.decode(), r

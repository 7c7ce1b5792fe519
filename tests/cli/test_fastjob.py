"""The C fast path of `mt-job submit`, against a real daemon, as a tenant."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from mtgpu_testing import fast_mtjob, wait_for

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def fast_binary():
    return fast_mtjob()


def test_fast_submit_and_hand_off(make_host, fast_binary):
    host = make_host({"SIMULATED_CPUS": 8})
    key = host.add_user("fay")
    job = b'#!/bin/bash\n#MTGPU cpus=1 ram=10M name=fast\n#SBATCH --mail-type=ALL\necho "hi \\"quoted\\" \\\\ tab\t"\n'
    r = host.ssh("fay", key, f"{fast_binary} submit --parsable -", input=job)
    assert r.returncode == 0, r.stderr
    jid = r.stdout.decode().strip()
    assert jid.isdigit()
    assert b"warning" in r.stderr  # the #SBATCH option without effect, as the Python client says
    r = host.ssh("fay", key, f"{fast_binary} submit -", input=job)
    assert r.stdout.decode().startswith("Submitted job ")
    # Everything else goes to the Python mt-job, unchanged.
    r = host.ssh("fay", key, f"{fast_binary} show {jid} --json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["name"] == "fast"
    # A refusal reads like the Python client's, with exit status 1.
    r = host.ssh("fay", key, f"{fast_binary} submit -", input=b"#!/bin/bash\n#MTGPU gpus=rtx4090:9\ntrue\n")
    assert r.returncode == 1 and b"mt-job: rejected" in r.stderr


def test_fast_list_json_prints_what_the_python_client_prints(make_host, fast_binary):
    host = make_host({"SIMULATED_CPUS": 2})
    key = host.add_user("gus")
    py = Path(sys.executable).parent / "mt-job"
    # A running job holds both CPUs, so the rest wait with their reasons and positions;
    # names with quotes, backslashes and non-ASCII text go through the escapes.
    jobs = [
        b"#!/bin/bash\n#MTGPU cpus=2 ram=10M name=holder\nsleep 60\n",
        "#!/bin/bash\n#MTGPU cpus=1 name='café-\"q\"-\\-✓'\ntrue\n".encode(),
        b"#!/bin/bash\n#MTGPU cpus=1 array=0-3%2 name=arr\ntrue\n",
        b"#!/bin/bash\n#MTGPU cpus=1 time=30 name=short\ntrue\n",
    ]
    ids = []
    for job in jobs:
        r = host.ssh("gus", key, f"{fast_binary} submit --parsable -", input=job)
        assert r.returncode == 0, r.stderr
        ids.append(r.stdout.decode().strip())
    r = host.ssh("gus", key, f"{fast_binary} cancel {ids[-1]}")
    assert r.returncode == 0, r.stderr
    # Both lists must see the same queue: the holder's start is recorded a moment after
    # it is placed (its first start on a fresh host builds the start helper).
    wait_for(
        lambda: json.loads(host.ssh("gus", key, f"{py} show {ids[0]} --json").stdout)["start_time"],
        what="the holder's start",
    )
    for flags in ("--json", "--json --all", "-a --json"):
        both = host.ssh("gus", key, f"{fast_binary} list {flags}; echo ===; {py} list {flags}")
        assert both.returncode == 0, both.stderr
        fast, slow = both.stdout.decode().split("===\n")
        assert fast == slow
        listed = json.loads(fast)
        assert len(listed) == (7 if "-a" in flags or "--all" in flags else 6)
        assert any(j["name"] == 'café-"q"-\\-✓' for j in listed)
    # Without a daemon to answer, the Python client explains (the fast one hands over).
    r = host.ssh("gus", key, f"MTGPU_API_SOCKET=/nonexistent {fast_binary} list --json")
    assert r.returncode != 0 and b"MTGPU" in r.stderr
    # The table is the Python client's.
    r = host.ssh("gus", key, f"{fast_binary} list")
    assert r.returncode == 0 and b"JOBID" in r.stdout


def test_fast_submit_refuses_non_utf8_naming_offset_and_line(make_host, fast_binary):
    """The C client names the first byte that is not UTF-8, as the Python one does,
    from standard input and from a file; nothing reaches the daemon."""
    host = make_host({"SIMULATED_CPUS": 2})
    key = host.add_user("fyn")
    r = host.ssh("fyn", key, f"{fast_binary} submit -", input=b"#!/bin/sh\n#MTGPU cpus=1\necho \xfa\n")
    assert r.returncode == 1, r
    assert b"not UTF-8 text: byte 0xfa at offset 29 (line 3)" in r.stderr, r.stderr
    r = host.ssh("fyn", key, f"printf '#!/bin/sh\\necho \\372\\n' > bad.sh && {fast_binary} submit bad.sh")
    assert r.returncode == 1 and b"bad.sh is not UTF-8 text: byte 0xfa at offset 15 (line 2)" in r.stderr, (
        r.stderr
    )
    assert json.loads(host.ssh("fyn", key, "mt-job list --json").stdout) == []


def test_alloc_through_the_fast_client_is_the_python_one(make_host, fast_binary):
    """`mt-job alloc` is not a fast path: the C client hands it to the Python one, so
    both queue the allocation, run the command in it and end it the same way."""
    host = make_host({"SIMULATED_CPUS": 2})
    key = host.add_user("hal")
    py = Path(sys.executable).parent / "mt-job"
    for client in (fast_binary, py):
        r = host.ssh(
            "hal",
            key,
            f"{client} alloc -c 1 -t 5m -- sh -c 'echo JOB=$MTGPU_JOB_ID; "
            "grep -c mtgpu_job_ /proc/self/cgroup'",
            timeout=180,
        )
        assert r.returncode == 0, r.stderr
        out = r.stdout.decode().split()
        jid = out[0].split("=")[1]
        assert int(out[1]) >= 1  # in the allocation's cgroups
        assert b"granted job allocation " + jid.encode() in r.stderr
        shown = json.loads(host.ssh("hal", key, f"{py} show {jid} --json").stdout)
        assert shown["name"] == "interactive"


def test_a_script_with_arguments_is_handed_to_the_python_client(make_host, fast_binary):
    """Words after the job file are the script's ($1...), even one that looks like the
    fast path's own --parsable: the C client hands them to the Python mt-job."""
    host = make_host({"SIMULATED_CPUS": 2})
    key = host.add_user("ada")
    script = b'#!/bin/bash\n#MTGPU ram=10M\nprintf "[%s]" "$@"; echo\n'
    assert host.ssh("ada", key, "cat > args.sh", input=script).returncode == 0
    r = host.ssh("ada", key, f"{fast_binary} submit args.sh --parsable")
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().startswith("Submitted job ")
    jid = r.stdout.decode().split()[2]
    py = Path(sys.executable).parent / "mt-job"

    def ended():
        j = json.loads(host.ssh("ada", key, f"{py} show {jid} --json").stdout)
        return j["state"] in ("COMPLETED", "FAILED") and j

    assert wait_for(ended, 60, "the job to end")["state"] == "COMPLETED"
    assert host.ssh("ada", key, f"{py} logs {jid}").stdout == b"[--parsable]\n"


def test_cancel_says_what_it_ended_in_both_clients(make_host, fast_binary):
    """The same cancel through the fast client (which hands it to the Python mt-job)
    and the Python one: a running job's cancel ends it and says so, exit 0; a second
    cancel says it had already ended, exit 1."""
    host = make_host({"SIMULATED_CPUS": 4})
    key = host.add_user("hal")
    py = Path(sys.executable).parent / "mt-job"
    for client in (fast_binary, py):
        r = host.ssh(
            "hal",
            key,
            f"{fast_binary} submit --parsable -",
            input=b"#!/bin/bash\n#MTGPU cpus=1 ram=10M\nexec sleep 300\n",
        )
        jid = r.stdout.decode().strip()
        wait_for(
            lambda jid=jid: json.loads(host.ssh("hal", key, f"{py} show {jid} --json").stdout)["start_time"],
            what="the job's start",
        )
        r = host.ssh("hal", key, f"{client} cancel {jid}")
        assert (r.returncode, r.stdout.decode()) == (0, f"Cancelled job {jid}\n"), (client, r)
        assert json.loads(host.ssh("hal", key, f"{py} show {jid} --json").stdout)["state"] == "CANCELLED"
        r = host.ssh("hal", key, f"{client} cancel {jid}")
        assert r.returncode == 1 and r.stdout == b"", (client, r)
        assert r.stderr.decode() == f"mt-job: job {jid} had already ended (CANCELLED); nothing to cancel\n"


@pytest.mark.mtjob_clients
def test_the_tenants_mt_job_is_the_selected_client_and_stays_so_across_a_restart(make_host, mtjob_client):
    """The ``mtjob_client`` fixture: a tenant's ``mt-job`` is the Python one or the C
    one, as mtgpu-setup chooses it; the tests marked ``mtjob_clients`` run with each."""
    host = make_host({"SIMULATED_CPUS": 2})
    key = host.add_user("sel")
    for _ in range(2):
        r = host.ssh("sel", key, 'readlink -f "$(command -v mt-job)"')
        assert r.returncode == 0, r.stderr
        assert r.stdout.decode().strip().endswith("/mt-job-fast") == (mtjob_client == "c"), r.stdout
        r = host.ssh("sel", key, "mt-job submit --parsable -", input=b"#!/bin/sh\n#MTGPU cpus=1\ntrue\n")
        assert r.returncode == 0 and r.stdout.strip().isdigit(), r.stderr
        host.stop()
        host.start()


def test_both_clients_refuse_a_script_over_the_largest_job_script_max_before_sending():
    import re

    from mtgpu.cli.job import MAX_JOB_SCRIPT
    from mtgpu.config.options import MAX_JOB_SCRIPT as LARGEST

    source = (Path(__file__).resolve().parents[2] / "mtgpu" / "cli" / "fastjob.c").read_text()
    m = re.search(r"#define MAX_JOB_SCRIPT \((\d+) << (\d+)\)", source)
    assert m and int(m.group(1)) << int(m.group(2)) == MAX_JOB_SCRIPT == LARGEST

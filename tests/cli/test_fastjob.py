"""The C fast path of `mt-job submit`, against a real daemon, as a tenant."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mtgpu_testing import REPO, wait_for

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def fast_binary(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "tests/run.sh machines have a C compiler"
    d = Path(tmp_path_factory.mktemp("fastjob"))
    for p in (d, *d.parents):
        if p == Path("/tmp"):
            break
        p.chmod(p.stat().st_mode | 0o005)
    py_mtjob = Path(sys.executable).parent / "mt-job"
    out = d / "mt-job-fast"
    subprocess.run([cc, "-O2", "-o", str(out), str(REPO / "mtgpu" / "cli" / "fastjob.c"),
                    f'-DMTGPU_PY_MTJOB="{py_mtjob}"'], check=True)
    return out


def test_fast_submit_and_hand_off(make_host, fast_binary):
    host = make_host({"SIMULATED_CPUS": 8})
    key = host.add_user("fay")
    job = b"#!/bin/bash\n#MTGPU cpus=1 ram=10M name=fast\n#SBATCH --weird-option=1\necho \"hi \\\"quoted\\\" \\\\ tab\t\"\n"
    r = host.ssh("fay", key, f"{fast_binary} submit --parsable -", input=job)
    assert r.returncode == 0, r.stderr
    jid = r.stdout.decode().strip()
    assert jid.isdigit()
    assert b"warning" in r.stderr  # the unknown #SBATCH option, as the Python client says
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
    jobs = [b"#!/bin/bash\n#MTGPU cpus=2 ram=10M name=holder\nsleep 60\n",
            "#!/bin/bash\n#MTGPU cpus=1 name='café-\"q\"-\\-✓'\ntrue\n".encode(),
            b"#!/bin/bash\n#MTGPU cpus=1 array=0-3%2 name=arr\ntrue\n",
            b"#!/bin/bash\n#MTGPU cpus=1 time=30 name=short\ntrue\n"]
    ids = []
    for job in jobs:
        r = host.ssh("gus", key, f"{fast_binary} submit --parsable -", input=job)
        assert r.returncode == 0, r.stderr
        ids.append(r.stdout.decode().strip())
    r = host.ssh("gus", key, f"{fast_binary} cancel {ids[-1]}")
    assert r.returncode == 0, r.stderr
    # Both lists must see the same queue: the holder's start is recorded a moment after
    # it is placed (its first start on a fresh host builds the start helper).
    wait_for(lambda: json.loads(host.ssh("gus", key, f"{py} show {ids[0]} --json").stdout)["start_time"],
             what="the holder's start")
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

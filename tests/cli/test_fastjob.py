"""The C fast path of `mt-job submit`, against a real daemon, as a tenant."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mtgpu_testing import REPO

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

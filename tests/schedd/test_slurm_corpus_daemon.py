"""Scripts of the public corpus (tests/data/slurm-corpus), submitted unchanged to a
real daemon with simulated GPUs, with ``sbatch`` and ``mt-job submit``: what each
probe printed (the GPUs, CPUs, memory limit and Slurm variables it received) is what
Slurm would give it, as expectations.yaml records."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
from mtgpu_testing import wait_for

from mtgpu.config.units import parse_size

pytestmark = pytest.mark.root

CORPUS = Path(__file__).resolve().parents[1] / "data" / "slurm-corpus"
EXPECTED = __import__("yaml").safe_load((CORPUS / "expectations.yaml").read_text())
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"}

#: The scripts submitted, and with what: small enough for the test host (one member,
#: two simulated GPUs, 16 CPUs), and between them --gres, --gpus-per-node, -G,
#: --ntasks-per-node, -c, --mem, --time in MM:SS and HH:MM:SS, -J, -o, #!/bin/sh.
SUBMITTED = {
    "princeton-single-gpu.slurm": "sbatch --parsable",
    "samples-task-threads.sh": "sbatch --parsable",
    "samples-finbert.sh": "sbatch --parsable",
    "samples-tf-mnist.sh": "mt-job submit --parsable",
}


@pytest.fixture(scope="module")
def host():
    from mtgpu_testing import Host

    h = Host({"SIMULATED_GPUS": [{"type": "a100", "count": 2, "vram": "40G"}], "SIMULATED_CPUS": 16})
    h.start()
    key = h.add_user("cora")
    yield h, key
    h.cleanup()


def sh(host, command: str, input: bytes | None = None):
    h, key = host
    r = h.ssh("cora", key, command, input=input, timeout=60)
    assert r.returncode == 0, (command, r.stderr)
    return r.stdout.decode()


def probe_output(path: str) -> dict[str, str]:
    """What the probe printed: ``env: NAME=VALUE`` lines as NAME, the rest by label."""
    out: dict[str, str] = {}
    for line in Path(path).read_text().splitlines():
        label, _, value = line.partition(": ")
        if label == "env":
            name, _, v = value.partition("=")
            out[name] = v
        else:
            out[label] = value
    return out


def test_corpus_scripts_submitted_unchanged_get_what_slurm_gives(host) -> None:
    h, _ = host
    sh(host, "mkdir -p corpus")  # the account is made at its first login
    home = h.passwd("cora")[5]
    jobs = {}
    for name, command in SUBMITTED.items():
        sh(host, f"cat > corpus/{name}", input=(CORPUS / name).read_bytes())
        jobs[name] = sh(host, f"cd corpus && {command} {shlex.quote(name)}").strip().split(";")[0]

    def show(jid: str) -> dict:
        return json.loads(sh(host, f"mt-job show {jid} --json"))

    for name, jid in jobs.items():
        exp = EXPECTED[name]
        j = wait_for(lambda jid=jid: (j := show(jid))["state"] in FINAL and j, 60, f"{name} ({jid}) to end")
        assert j["state"] == "COMPLETED", (name, j)
        assert j["name"] == exp["name"], name
        assert j["time_limit"] == exp.get("time"), (name, j["time_limit"])
        if "output" in exp:  # relative to the directory it was submitted from
            assert j["stdout"] == f"{home}/corpus/{exp['output']}", (name, j["stdout"])
        elif SUBMITTED[name].startswith("sbatch"):  # Slurm's default, where it was submitted
            assert j["stdout"] == f"{home}/corpus/slurm-{jid}.out", (name, j["stdout"])
        else:  # mt-job keeps its own
            assert "/.mtgpu/jobs/" in j["stdout"], (name, j["stdout"])
        p = probe_output(j["stdout"])
        assert p["probe"] == "end", (name, p)
        gpus, cpus = exp["gpus_per_node"], exp["cpus_per_node"]
        mem = parse_size(exp.get("mem_per_node") or "1G")  # MTGPU's default ram: 1G
        assert p["SLURM_JOB_NAME"] == exp["name"] and p["SLURM_JOB_ID"] == jid, (name, p)
        assert (p["SLURM_NNODES"], p["SLURM_JOB_NUM_NODES"]) == (str(exp["nodes"]),) * 2, (name, p)
        assert p["SLURM_GPUS_ON_NODE"] == str(gpus), (name, p)
        assert len([d for d in p["CUDA_VISIBLE_DEVICES"].split(",") if d]) == gpus, (name, p)
        assert len(p["SLURM_JOB_GPUS"].split(",")) == gpus, (name, p)
        # Reserved as asked; pinned to as many of this machine's real cores (two on CI,
        # while the host reports SIMULATED_CPUS), which the job is told it has.
        pinned = str(min(cpus, os.cpu_count() or 1))
        assert j["cpus"] == cpus, (name, j)
        assert p["SLURM_CPUS_ON_NODE"] == p["nproc"] == pinned, (name, p)
        if exp.get("ntasks"):
            assert p["SLURM_NTASKS"] == str(exp["ntasks"]), (name, p)
            assert p["SLURM_NTASKS_PER_NODE"] == str(exp["ntasks"] // exp["nodes"]), (name, p)
        assert p["SLURM_MEM_PER_NODE"] == str(mem >> 20), (name, p)
        assert p["memory"] == str(mem), (name, p)  # the cgroup's limit, in bytes
        # --time is a wall-clock limit: no CPU-time limit is set from it, as in Slurm.
        assert p["cputime"] == "unlimited", (name, p)
        assert p["pwd"] == f"{home}/corpus" == p["SLURM_SUBMIT_DIR"], (name, p)


def test_a_corpus_script_mtgpu_cannot_honour_is_refused_naming_the_directive(host) -> None:
    h, key = host
    name = "pytorch-mingpt.sh"
    sh(host, f"mkdir -p corpus && cat > corpus/{name}", input=(CORPUS / name).read_bytes())
    before = [j["job_id"] for j in json.loads(sh(host, "mt-job list --all --json"))]
    r = h.ssh("cora", key, f"cd corpus && sbatch {name}", timeout=60)
    err = r.stderr.decode()
    assert r.returncode != 0 and r.stdout == b"", (r, err)
    assert "line 6: #SBATCH --gpus-per-task=1: --gpus-per-task is refused: " in err, err
    after = [j["job_id"] for j in json.loads(sh(host, "mt-job list --all --json"))]
    assert after == before  # nothing was queued

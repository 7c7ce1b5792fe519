"""The job's environment, output paths and argv: pure functions, tested with tables."""

from __future__ import annotations

import json
import re
import socket
from dataclasses import replace

import pytest

from mtgpu.errors import JobError
from mtgpu.schedd.jobenv import (
    JobLaunch,
    JobUser,
    build_env,
    container_command,
    container_env,
    job_argv,
    master_port,
    output_paths,
    pick_rendezvous_port,
    port_free,
    substitute,
)

ANN = JobUser("ann", 2001, 2001, "/home/ann", "/bin/zsh", (2001, 27))


def L(**kw: object) -> JobLaunch:
    kw.setdefault("job_id", "42")
    return JobLaunch(
        user=ANN, script=str(kw.pop("script", "true")), workdir=str(kw.pop("workdir", "/work")), **kw
    )  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("pattern", "launch", "expected"),
    [
        ("%j.out", L(), "42.out"),
        ("%x-%u.log", L(name="train"), "train-ann.log"),
        ("%A_%a", L(job_id="42_3", array_job_id="42", array_task_id=3), "42_3"),
        # An array task's %j is its own numeric id, as Slurm's.
        ("%j", L(job_id="42_3", array_job_id="42", array_task_id=3, numeric_id="45"), "45"),
        ("%A_%a", L(), "42_4294967294"),  # outside an array, as Slurm writes it
        ("100%%-%j", L(), "100%-42"),
        ("%N-%n", L(node_name="gpu02", nnodes=2, node_rank=1), "gpu02-1"),
        ("%Q%j", L(), "%Q42"),  # unknown letters are kept
        ("~/o/%j", L(), "/home/ann/o/42"),
        ("~", L(), "/home/ann"),
        ("a~/%j", L(), "a~/42"),  # only a leading ~/ is the home
        # As Slurm fills them for a batch script: %J has no step, %t is the task (the
        # member's one), %s the batch step; a width zero-pads a number, at most 10.
        ("%x_%J_%t.log", L(name="llmc", node_rank=1, nnodes=2), "llmc_42_1.log"),
        ("%s-%5j", L(), "batch-00042"),
        ("%3a-%2x-%12j", L(name="t", array_task_id=7), "007-t-0000000042"),
        ("%b", L(job_id="42_17", array_job_id="42", array_task_id=17), "7"),  # modulo 10
        ("%4j", L(job_id="42_3"), "42_3"),  # not a number: as it is
    ],
)
def test_substitute(pattern: str, launch: JobLaunch, expected: str) -> None:
    assert substitute(pattern, launch) == expected


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({}, ("/home/ann/.mtgpu/jobs/42/stdout.log", "/home/ann/.mtgpu/jobs/42/stderr.log", True)),
        ({"stdout": "o-%j"}, ("/work/o-42", "/work/o-42", False)),  # both streams, one file
        ({"stdout": "/abs/o", "stderr": "e"}, ("/abs/o", "/work/e", False)),
        ({"stderr": "~/e-%j"}, ("/home/ann/.mtgpu/jobs/42/stdout.log", "/home/ann/e-42", True)),
        ({"stdout": "o", "workdir": "/w/"}, ("/w/o", "/w/o", False)),
    ],
)
def test_output_paths(kw: dict, expected: tuple) -> None:
    assert output_paths(L(**kw)) == expected


def test_env_is_clean_and_complete() -> None:
    env = build_env(
        L(
            name="train",
            cpus=(2, 3),
            ram=3 << 30,
            gpu_indices=(1,),
            gpu_env={"CUDA_VISIBLE_DEVICES": "GPU-a"},
            submit_dir="/sub",
            env={"FOO": "1", "MTGPU_JOB_ID": "spoof", "SLURM_NNODES": "9", "HOME": "/x"},
            time_limit=90.5,
            master_port=31234,
        )
    )
    assert env == {
        "HOME": "/x",
        "USER": "ann",
        "LOGNAME": "ann",
        "SHELL": "/bin/zsh",
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "FOO": "1",
        "MTGPU_JOB_ID": "42",
        "MTGPU_JOB_NAME": "train",
        "MTGPU_NODE_RANK": "0",
        "MTGPU_NNODES": "1",
        "MTGPU_NODELIST": "localhost",
        "MTGPU_GPUS": "1",
        "MTGPU_RESTART_COUNT": "0",
        "MTGPU_TIME_LIMIT": "90",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "31234",
        "MTGPU_RDZV_ENDPOINT": "127.0.0.1:31234",
        "PET_NNODES": "1",
        "PET_NODE_RANK": "0",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": "31234",
        "SLURM_JOB_ID": "42",
        "SLURM_RESTART_COUNT": "0",
        "SLURM_JOBID": "42",
        "SLURM_JOB_NAME": "train",
        "SLURM_JOB_USER": "ann",
        "SLURM_JOB_UID": "2001",
        "SLURM_JOB_GID": "2001",
        "SLURM_NODEID": "0",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NNODES": "1",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NTASKS": "1",
        "SLURM_NPROCS": "1",
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_NODELIST": "localhost",
        "SLURM_SUBMIT_DIR": "/sub",
        "SLURM_GPUS_ON_NODE": "1",
        "SLURM_JOB_GPUS": "1",
        "SLURM_CPUS_PER_TASK": "2",
        "SLURM_CPUS_ON_NODE": "2",
        "SLURM_MEM_PER_NODE": "3072",
        "CUDA_VISIBLE_DEVICES": "GPU-a",
    }


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        # no GPU reserved: CUDA is told so (the devices cgroup is the wall behind it)
        ({}, {"CUDA_VISIBLE_DEVICES": "", "SLURM_GPUS_ON_NODE": "0"}),
        (
            {
                "gpu_indices": (0, 2),
                "gpu_env": {"ROCR_VISIBLE_DEVICES": "GPU-x,GPU-y", "HIP_VISIBLE_DEVICES": "0,1"},
            },
            {"ROCR_VISIBLE_DEVICES": "GPU-x,GPU-y", "HIP_VISIBLE_DEVICES": "0,1", "SLURM_JOB_GPUS": "0,2"},
        ),
        (
            {"job_id": "7_3", "array_job_id": "7", "array_task_id": 3},
            {
                "MTGPU_ARRAY_TASK_ID": "3",
                "SLURM_ARRAY_TASK_ID": "3",
                "SLURM_ARRAY_JOB_ID": "7",
                "MTGPU_ARRAY_JOB_ID": "7",
                "SLURM_JOB_ID": "7_3",
            },
        ),
        (
            {"nnodes": 3, "node_rank": 2, "nodelist": ("a", "b", "c"), "node_name": "c", "master_port": 1234},
            {
                "MASTER_ADDR": "a",
                "MASTER_PORT": "1234",
                "MTGPU_RDZV_ENDPOINT": "a:1234",
                "SLURM_NODEID": "2",
                "PET_MASTER_ADDR": "a",
                "PET_MASTER_PORT": "1234",
                "PET_NODE_RANK": "2",
                "SLURM_JOB_NODELIST": "a,b,c",
                "SLURMD_NODENAME": "c",
                "SLURM_NTASKS": "3",
            },
        ),
        ({"nnodes": 2, "nodelist": ("a", "b"), "master_addr": "10.0.0.5"}, {"MASTER_ADDR": "10.0.0.5"}),
        ({"ram": 1000}, {"SLURM_MEM_PER_NODE": "1"}),  # never 0 MB
    ],
)
def test_env_cases(kw: dict, expected: dict) -> None:
    env = build_env(L(**kw))
    assert {k: env.get(k) for k in expected} == expected


def test_no_array_variables_outside_arrays() -> None:
    env = build_env(L())
    assert not {"SLURM_ARRAY_TASK_ID", "MTGPU_ARRAY_TASK_ID", "SLURM_ARRAY_JOB_ID"} & set(env)


def test_master_port_is_the_daemons_choice_else_drawn_at_random() -> None:
    assert master_port(L(master_port=4000)) == 4000
    drawn = {master_port(L(job_id="9")) for _ in range(20)}
    assert len(drawn) > 1 and all(29500 <= p <= 39499 for p in drawn)  # not a function of the id


def test_a_rendezvous_port_in_use_is_never_picked() -> None:
    """Another tenant binds every port of the range but one (IPv4 loopback, IPv4 any,
    IPv6): only the free one is picked; with none free, a clear refusal."""
    socks, ports = [], []
    try:
        while len(ports) < 6:  # six neighbouring ports that are free now
            s0 = socket.socket()
            s0.bind(("127.0.0.1", 0))
            base = s0.getsockname()[1]
            s0.close()
            ports = [p for p in range(base, base + 6) if port_free(p)]
            if len(ports) < 6 or ports[-1] - ports[0] != 5:
                ports = []
        for p, (fam, addr) in zip(
            ports[:5],
            [
                (socket.AF_INET, "127.0.0.1"),
                (socket.AF_INET, "0.0.0.0"),
                (socket.AF_INET6, "::1"),
                (socket.AF_INET, "127.0.0.2"),
                (socket.AF_INET6, "::"),
            ],
            strict=True,
        ):
            s = socket.socket(fam)
            s.bind((addr, p))
            socks.append(s)
        assert {pick_rendezvous_port((ports[0], ports[5])) for _ in range(30)} == {ports[5]}
        with pytest.raises(JobError, match="no free rendezvous port in RENDEZVOUS_PORTS"):
            pick_rendezvous_port((ports[0], ports[4]))
    finally:
        for s in socks:
            s.close()


@pytest.mark.parametrize(
    ("script", "argv"),
    [
        ("echo hi", ["/bin/bash", "S"]),
        ("#!/bin/sh\necho", ["/bin/sh", "S"]),
        ("#!/usr/bin/env python3\n", ["/usr/bin/env", "python3", "S"]),
        ("#! /bin/bash -l -x\n", ["/bin/bash", "-l -x", "S"]),  # one argument, as the kernel reads it
        ("#!\necho", ["/bin/bash", "S"]),
        ("", ["/bin/bash", "S"]),
    ],
)
def test_job_argv(script: str, argv: list[str]) -> None:
    assert job_argv(L(script=script), "S") == argv


def test_launch_round_trips_through_json() -> None:
    la = L(
        cpus=(1, 2),
        nodelist=("a",),
        device_nodes=("/dev/nvidia0",),
        env={"A": "b"},
        array_task_id=0,
        ram=5,
        time_limit=3.5,
        container=None,
        term=7,
    )
    again = JobLaunch.from_dict(json.loads(json.dumps({**la.to_dict(), "future_field": 1})))
    assert again == la


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"job_id": "../etc"}, "letters, digits"),
        ({"job_id": ""}, "letters, digits"),
        ({"node_rank": 2, "nnodes": 2}, "outside 0..1"),
        ({"ram": 0}, "positive"),
    ],
)
def test_launch_validation(kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        L(**kw)


def test_frameworks_are_told_a_shared_jobs_share() -> None:
    share = {"gpu_indices": (0,), "gpu_mode": "shared", "vram": 20 << 30, "gpu_vram_total": 80 << 30}
    env = build_env(L(**share))
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.25"
    assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert env["MTGPU_GPU_MEMORY"] == str(20 << 30)
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in env
    # The card's size unknown: no preallocation instead of a fraction.
    env = build_env(L(**{**share, "gpu_vram_total": 0}, gpu_env={}))
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false" and "XLA_PYTHON_CLIENT_MEM_FRACTION" not in env
    # The job's own settings win; its MTGPU_GPU_MEMORY cannot claim more.
    env = build_env(
        L(
            **share,
            env={
                "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9",
                "TF_FORCE_GPU_ALLOW_GROWTH": "false",
                "MTGPU_GPU_MEMORY": "1",
            },
        )
    )
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.9" and env["TF_FORCE_GPU_ALLOW_GROWTH"] == "false"
    assert env["MTGPU_GPU_MEMORY"] == str(20 << 30)
    # Exclusive jobs and jobs without GPUs are told nothing.
    for kw in ({**share, "gpu_mode": "exclusive"}, {"gpu_mode": "shared", "vram": 1 << 30}):
        env = build_env(L(**kw))
        assert not {"TF_FORCE_GPU_ALLOW_GROWTH", "MTGPU_GPU_MEMORY"} & set(env)


def test_a_cluster_id_unfit_for_a_directory_name_gets_a_stable_hashed_one() -> None:
    from mtgpu.schedd.jobenv import default_output_dir

    got = default_output_dir("lab one/../x")
    assert got == default_output_dir("lab one/../x")
    assert re.fullmatch(r"~/\.mtgpu/jobs/cluster-[0-9a-f]{8}/%j", got), got


def test_slurm_task_array_and_umask_variables_from_the_submission() -> None:
    from mtgpu.jobspec import spec_to_dict
    from mtgpu.schedd.agent import launch_for
    from mtgpu.schedd.jobfile import parse_job_file
    from mtgpu.state.codec import decode_job

    user = JobUser("ann", 2000, 2000, "/home/ann")
    spec = parse_job_file("#SBATCH -n 4 -c 2 --array=0-20:5%2\ntrue\n", default_workdir="/w")
    raw = {
        "job_id": "7_10",
        "array_id": "7",
        "array_task": 10,
        "name": "t",
        "user": "ann",
        "uid": 2000,
        "state": "RUNNING",
        "submit_time": 1.0,
        "workdir": "/w",
        "spec": spec_to_dict(spec),
        "placement": None,
        "submit": {
            "umask": 0o027,
            "env": {"EPOCHS": "3", "MTGPU_JOB_ID": "forged"},
            "rlimits": {"nofile": [64, 64]},
        },
    }
    la = launch_for(decode_job(raw), user, node="gpu01", cpus=(0, 1, 2, 3, 4, 5, 6, 7))
    env = build_env(la)
    assert la.umask == 0o027 and dict(la.rlimits) == {"nofile": [64, 64]}
    assert {
        k: env[k]
        for k in env
        if k.startswith(("SLURM_ARRAY", "SLURM_NTASKS", "SLURM_CPUS_PER", "SLURM_UMASK"))
    } == {
        "SLURM_ARRAY_JOB_ID": "7",
        "SLURM_ARRAY_TASK_ID": "10",
        "SLURM_ARRAY_TASK_COUNT": "5",
        "SLURM_ARRAY_TASK_MIN": "0",
        "SLURM_ARRAY_TASK_MAX": "20",
        "SLURM_ARRAY_TASK_STEP": "5",
        "SLURM_NTASKS": "4",
        "SLURM_NTASKS_PER_NODE": "4",
        "SLURM_CPUS_PER_TASK": "2",
        "SLURM_UMASK": "0027",
    }
    assert env["EPOCHS"] == "3" and env["MTGPU_JOB_ID"] == "7_10"
    # A task without a numeric id of its own (submitted before tasks were numbered)
    # keeps its shown id.
    assert env["SLURM_JOB_ID"] == "7_10"
    assert JobLaunch.from_dict(json.loads(json.dumps(la.to_dict()))) == la
    numbered_launch = launch_for(decode_job({**raw, "numeric_id": "9"}), user, node="gpu01")
    numbered = build_env(numbered_launch)
    # The default output directory keeps the id as shown; %j in output= is the number.
    assert output_paths(numbered_launch)[0].endswith("/7_10/stdout.log")
    assert output_paths(replace(numbered_launch, stdout="o-%j-%A_%a"))[0] == "/w/o-9-7_10"
    assert (numbered["SLURM_JOB_ID"], numbered["SLURM_JOBID"]) == ("9", "9")
    assert (numbered["SLURM_ARRAY_JOB_ID"], numbered["MTGPU_JOB_ID"]) == ("7", "7_10")


def test_a_containerized_jobs_podman_ignores_podman_settings_exported_by_the_tenant() -> None:
    """A tenant exports podman's own settings into a containerized job (another
    member's container store, a containers.conf without the policy hook, a remote
    podman): the job's podman gets this member's settings, and none of them is
    passed into the container either."""
    steer = {
        "CONTAINERS_STORAGE_CONF": "/elsewhere/ca/2001/storage.conf",
        "CONTAINERS_CONF": "/home/ann/no-hooks.conf",
        "CONTAINERS_CONF_OVERRIDE": "/home/ann/no-hooks.conf",
        "CONTAINER_HOST": "unix:///home/ann/other.sock",
        "XDG_DATA_HOME": "/home/ann/elsewhere",
    }
    la = L(
        env={"EPOCHS": "3", **steer},
        container_argv=("/usr/bin/podman", "run", "img"),
        container_script="/run/user/2001/j42",
        container_env={"XDG_RUNTIME_DIR": "/run/user/2001", "PATH": "/usr/bin:/bin"},
    )
    env = build_env(la)
    assert env["CONTAINERS_STORAGE_CONF"] == steer["CONTAINERS_STORAGE_CONF"]  # the job's as sent
    argv = container_command(la, env)
    podman_env = container_env(la, env)
    assert not set(steer) & set(podman_env), podman_env
    assert podman_env["EPOCHS"] == "3" and podman_env["XDG_RUNTIME_DIR"] == "/run/user/2001"
    assert "--env=EPOCHS" in argv
    assert not [a for a in argv if a.split("=", 1)[-1] in steer], argv
    # This member's own store, when it has one, is the one podman uses.
    mine = L(env=steer, container_env={"CONTAINERS_STORAGE_CONF": "/var/lib/stores/2001/storage.conf"})
    assert (
        container_env(mine, build_env(mine))["CONTAINERS_STORAGE_CONF"] == "/var/lib/stores/2001/storage.conf"
    )

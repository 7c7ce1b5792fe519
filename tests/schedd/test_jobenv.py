"""The job's environment, output paths and argv: pure functions, tested with tables."""

from __future__ import annotations

import json

import pytest

from mtgpu.schedd.jobenv import JobLaunch, JobUser, build_env, job_argv, master_port, output_paths, substitute

ANN = JobUser("ann", 2001, 2001, "/home/ann", "/bin/zsh", (2001, 27))


def L(**kw: object) -> JobLaunch:
    kw.setdefault("job_id", "42")
    return JobLaunch(user=ANN, script=str(kw.pop("script", "true")),
                     workdir=str(kw.pop("workdir", "/work")), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("pattern", "launch", "expected"), [
    ("%j.out", L(), "42.out"),
    ("%x-%u.log", L(name="train"), "train-ann.log"),
    ("%A_%a", L(job_id="42_3", array_job_id="42", array_task_id=3), "42_3"),
    ("%A_%a", L(), "42_4294967294"),            # outside an array, as Slurm writes it
    ("100%%-%j", L(), "100%-42"),
    ("%N-%n", L(node_name="gpu02", nnodes=2, node_rank=1), "gpu02-1"),
    ("%Q%j", L(), "%Q42"),                      # unknown letters are kept
    ("~/o/%j", L(), "/home/ann/o/42"),
    ("~", L(), "/home/ann"),
    ("a~/%j", L(), "a~/42"),                    # only a leading ~/ is the home
])
def test_substitute(pattern: str, launch: JobLaunch, expected: str) -> None:
    assert substitute(pattern, launch) == expected


@pytest.mark.parametrize(("kw", "expected"), [
    ({}, ("/home/ann/.mtgpu/jobs/42/stdout.log", "/home/ann/.mtgpu/jobs/42/stderr.log", True)),
    ({"stdout": "o-%j"}, ("/work/o-42", "/work/o-42", False)),          # both streams, one file
    ({"stdout": "/abs/o", "stderr": "e"}, ("/abs/o", "/work/e", False)),
    ({"stderr": "~/e-%j"}, ("/home/ann/.mtgpu/jobs/42/stdout.log", "/home/ann/e-42", True)),
    ({"stdout": "o", "workdir": "/w/"}, ("/w/o", "/w/o", False)),
])
def test_output_paths(kw: dict, expected: tuple) -> None:
    assert output_paths(L(**kw)) == expected


def test_env_is_clean_and_complete() -> None:
    env = build_env(L(name="train", cpus=(2, 3), ram=3 << 30, gpu_indices=(1,),
                      gpu_env={"CUDA_VISIBLE_DEVICES": "GPU-a"}, submit_dir="/sub",
                      env={"FOO": "1", "MTGPU_JOB_ID": "spoof", "SLURM_NNODES": "9", "HOME": "/x"},
                      time_limit=90.5))
    assert env == {
        "HOME": "/x", "USER": "ann", "LOGNAME": "ann", "SHELL": "/bin/zsh",
        "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "FOO": "1",
        "MTGPU_JOB_ID": "42", "MTGPU_JOB_NAME": "train", "MTGPU_NODE_RANK": "0", "MTGPU_NNODES": "1",
        "MTGPU_NODELIST": "localhost", "MTGPU_GPUS": "1", "MTGPU_TIME_LIMIT": "90",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port(L())),
        "MTGPU_RDZV_ENDPOINT": f"127.0.0.1:{master_port(L())}",
        "PET_NNODES": "1", "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(master_port(L())),
        "SLURM_JOB_ID": "42", "SLURM_JOBID": "42", "SLURM_JOB_NAME": "train", "SLURM_JOB_USER": "ann",
        "SLURM_JOB_UID": "2001", "SLURM_JOB_GID": "2001", "SLURM_NODEID": "0", "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0", "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1", "SLURM_NTASKS": "1",
        "SLURM_NPROCS": "1", "SLURM_JOB_NODELIST": "localhost", "SLURM_NODELIST": "localhost",
        "SLURM_SUBMIT_DIR": "/sub", "SLURM_GPUS_ON_NODE": "1", "SLURM_JOB_GPUS": "1",
        "SLURM_CPUS_PER_TASK": "2", "SLURM_CPUS_ON_NODE": "2", "SLURM_MEM_PER_NODE": "3072",
        "CUDA_VISIBLE_DEVICES": "GPU-a",
    }


@pytest.mark.parametrize(("kw", "expected"), [
    # no GPU reserved: CUDA is told so (the devices cgroup is the wall behind it)
    ({}, {"CUDA_VISIBLE_DEVICES": "", "SLURM_GPUS_ON_NODE": "0"}),
    ({"gpu_indices": (0, 2),
      "gpu_env": {"ROCR_VISIBLE_DEVICES": "GPU-x,GPU-y", "HIP_VISIBLE_DEVICES": "0,1"}},
     {"ROCR_VISIBLE_DEVICES": "GPU-x,GPU-y", "HIP_VISIBLE_DEVICES": "0,1", "SLURM_JOB_GPUS": "0,2"}),
    ({"job_id": "7_3", "array_job_id": "7", "array_task_id": 3},
     {"MTGPU_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_JOB_ID": "7",
      "MTGPU_ARRAY_JOB_ID": "7", "SLURM_JOB_ID": "7_3"}),
    ({"nnodes": 3, "node_rank": 2, "nodelist": ("a", "b", "c"), "node_name": "c", "master_port": 1234},
     {"MASTER_ADDR": "a", "MASTER_PORT": "1234", "MTGPU_RDZV_ENDPOINT": "a:1234", "SLURM_NODEID": "2",
      "PET_MASTER_ADDR": "a", "PET_MASTER_PORT": "1234", "PET_NODE_RANK": "2",
      "SLURM_JOB_NODELIST": "a,b,c", "SLURMD_NODENAME": "c", "SLURM_NTASKS": "3"}),
    ({"nnodes": 2, "nodelist": ("a", "b"), "master_addr": "10.0.0.5"}, {"MASTER_ADDR": "10.0.0.5"}),
    ({"ram": 1000}, {"SLURM_MEM_PER_NODE": "1"}),   # never 0 MB
])
def test_env_cases(kw: dict, expected: dict) -> None:
    env = build_env(L(**kw))
    assert {k: env.get(k) for k in expected} == expected


def test_no_array_variables_outside_arrays() -> None:
    env = build_env(L())
    assert not {"SLURM_ARRAY_TASK_ID", "MTGPU_ARRAY_TASK_ID", "SLURM_ARRAY_JOB_ID"} & set(env)


def test_master_port_is_stable_and_shared_by_an_array() -> None:
    a = master_port(L(job_id="9_1", array_job_id="9", array_task_id=1))
    assert a == master_port(L(job_id="9_2", array_job_id="9", array_task_id=2))
    assert 29500 <= a < 39500 and master_port(L()) == master_port(L())


@pytest.mark.parametrize(("script", "argv"), [
    ("echo hi", ["/bin/bash", "S"]),
    ("#!/bin/sh\necho", ["/bin/sh", "S"]),
    ("#!/usr/bin/env python3\n", ["/usr/bin/env", "python3", "S"]),
    ("#! /bin/bash -l -x\n", ["/bin/bash", "-l -x", "S"]),   # one argument, as the kernel reads it
    ("#!\necho", ["/bin/bash", "S"]),
    ("", ["/bin/bash", "S"]),
])
def test_job_argv(script: str, argv: list[str]) -> None:
    assert job_argv(L(script=script), "S") == argv


def test_launch_round_trips_through_json() -> None:
    la = L(cpus=(1, 2), nodelist=("a",), device_nodes=("/dev/nvidia0",), env={"A": "b"},
           array_task_id=0, ram=5, time_limit=3.5, container=None, term=7)
    again = JobLaunch.from_dict(json.loads(json.dumps({**la.to_dict(), "future_field": 1})))
    assert again == la


@pytest.mark.parametrize(("kw", "message"), [
    ({"job_id": "../etc"}, "letters, digits"),
    ({"job_id": ""}, "letters, digits"),
    ({"node_rank": 2, "nnodes": 2}, "outside 0..1"),
    ({"ram": 0}, "positive"),
])
def test_launch_validation(kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        L(**kw)

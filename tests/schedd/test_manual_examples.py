"""The manual's "Job files" section: its examples parse, and its quoted messages are real."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mtgpu.errors import JobError
from mtgpu.schedd.jobfile import parse_job_file
from mtgpu.schedd.placement import feasible_ever
from mtgpu.schedd.types import ClusterSnapshot, GpuMode, GpuSnapshot, NodeSnapshot, ResourceRequest

G = 1 << 30
MANUAL = Path(__file__).resolve().parents[2] / "docs" / "manual.md"


def section() -> str:
    text = MANUAL.read_text()
    start = text.index("\n## Job files\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def job_files() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", section(), flags=re.DOTALL)


def test_there_are_examples() -> None:
    assert len(job_files()) >= 5


@pytest.mark.parametrize("text", job_files())
def test_every_example_parses(text: str) -> None:
    spec = parse_job_file(text, default_workdir="/home/ann")
    assert spec.script == text
    if "#SBATCH" not in text:
        assert spec.warnings == ()


def test_the_sbatch_example_means_what_the_manual_says() -> None:
    (text,) = [t for t in job_files() if "--partition=gpu" in t]
    spec = parse_job_file(text, default_workdir="/home/ann")
    r = spec.request
    assert (r.gpus, r.gpu_type, r.cpus, r.ram, spec.time_limit, spec.name) == (
        2,
        "a100-80gb",
        16,
        64 * G,
        12 * 3600,
        "resnet",
    )
    assert len(spec.warnings) == 1 and "--partition=gpu" in spec.warnings[0]


def test_the_shared_example_shares_a_card() -> None:
    (text,) = [t for t in job_files() if "finetune" in t]
    r = parse_job_file(text, default_workdir="/h").request
    assert (r.gpu_type, r.gpu_mode, r.vram) == ("l40s", GpuMode.SHARED, 20 * G)


def _error(text: str, overrides: dict[str, str] | None = None) -> str:
    with pytest.raises(JobError) as info:
        parse_job_file(text, overrides, default_workdir="/h")
    return str(info.value)


def test_quoted_messages_are_the_real_ones() -> None:
    manual = section()
    messages = [
        _error("#!/bin/sh\n#MTGPU gpus=1\n#MTGPU vram=20\n"),
        _error("#!/bin/sh\n#MTGPU gpus=1 gpu_mode=shared\n"),
        _error("#!/bin/sh\n#MTGPU cpus=2\n\n#MTGPU gpuz=2\n"),
        _error("#!/bin/sh\n", {"time": "soon"}),
    ]
    snapshot = ClusterSnapshot(
        nodes=(
            NodeSnapshot(
                "a", 8, 64 * G, gpus=tuple(GpuSnapshot(i, "nvidia", "rtx4090", 24 * G) for i in range(2))
            ),
            NodeSnapshot(
                "b", 8, 64 * G, gpus=tuple(GpuSnapshot(i, "nvidia", "a100-40gb", 40 * G) for i in range(4))
            ),
        )
    )
    for req in (
        ResourceRequest(gpus=3, gpu_type="rtx4090"),
        ResourceRequest(gpus=1, gpu_type="a100-40gb", gpu_mode=GpuMode.SHARED, vram=64 * G),
    ):
        reason = feasible_ever(snapshot, req)
        assert reason is not None
        messages.append(reason.message)
    for message in messages:
        assert message in manual, message

"""Container escapes a tenant may try, refused at both layers: the podman command line
(``mt-podman``, the workspace service) and the OCI configuration podman is about to
run (the ``mtgpu-podman-hook`` precreate hook, which also covers plain ``podman``).

Rootless podman runs as the tenant, so the kernel bounds what a container can do
anyway; these checks keep it from even asking for the host's devices, namespaces or
files. The podman-backed end-to-end checks live in tests/workspaces
(test_workspaces_podman.py, test_container_jobs.py).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
from figures import tally

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "workspaces"))

from test_policy import IMG, POL, oci  # noqa: E402

from mtgpu.workspaces.policy import check_oci_config, check_podman  # noqa: E402
from mtgpu.workspaces.types import JOB_LABEL, PolicyRefusal  # noqa: E402

COMMAND_LINES = [
    (["run", "--privileged", IMG], "no-privileged"),
    (["run", "--privileged=true", "--rm", IMG, "sh"], "no-privileged"),
    (["run", "--device", "/dev/sda", IMG], "no-host-devices"),
    (["run", "--device=/dev/mem:/dev/mem", IMG], "no-host-devices"),
    (["run", "--device-cgroup-rule", "a *:* rwm", IMG], "no-host-devices"),
    (["run", "--gpus", "all", IMG], "no-host-devices"),
    (["run", "--pid=host", IMG], "no-host-namespaces"),
    (["run", "--network=host", IMG], "no-host-namespaces"),
    (["run", "--net", "host", IMG], "no-host-namespaces"),
    (["run", "--ipc=host", IMG], "no-host-namespaces"),
    (["run", "--uts=host", IMG], "no-host-namespaces"),
    (["run", "--cgroupns=host", IMG], "no-host-namespaces"),
    # A tenant's own job label does not buy the host network on the command line.
    (["run", f"--annotation={JOB_LABEL}=1", "--network", "host", IMG], "no-host-namespaces"),
    (["run", "-v", "/:/host", IMG], "host-paths"),
    (["run", "--volume=/etc:/x", IMG], "host-paths"),
    (["run", "--mount", "type=bind,src=/,dst=/host", IMG], "host-paths"),
    (["run", "--mount", "type=bind,source=/home/other,target=/x", IMG], "host-paths"),
    (["run", "-v", "/home/ann/../other:/x", IMG], "host-paths"),
    (["run", "-v", "/run/mtgpu/api.sock:/s", IMG], "host-paths"),
    (["run", "-v", "/var/run/docker.sock:/s", IMG], "host-paths"),
]


@pytest.mark.parametrize("argv,rule", COMMAND_LINES)
def test_container_command_lines_that_reach_for_the_host_are_refused(argv, rule):
    with pytest.raises(PolicyRefusal) as info:
        check_podman(argv, POL, cwd="/home/ann")
    assert info.value.rule == rule
    tally("attacks_refused")


def _job(config: dict) -> dict:
    return {**config, "annotations": {JOB_LABEL: "42"}}


OCI_CONFIGS = [
    (oci(annotations={"io.podman.annotations.privileged": "TRUE"}), "no-privileged"),
    (
        oci(
            process={"capabilities": {"bounding": ["CAP_SYS_ADMIN", "CAP_SYS_MODULE"]}},
            linux={"namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")]},
        ),
        "no-privileged",
    ),
    (oci(namespaces=[{"type": t} for t in ("network", "ipc", "uts", "mount")]), "no-host-namespaces"),
    (oci(namespaces=[{"type": t} for t in ("pid", "ipc", "uts", "mount")]), "no-host-namespaces"),
    (oci(namespaces=[{"type": t} for t in ("pid", "network", "uts", "mount")]), "no-host-namespaces"),
    (oci(namespaces=[{"type": t} for t in ("pid", "network", "ipc", "uts")]), "no-host-namespaces"),
    (oci(devices=[{"path": "/dev/sda", "type": "b"}]), "no-host-devices"),
    (oci(devices=[{"path": "/dev/nvidia1", "type": "c"}]), "no-host-devices"),
    (
        oci(mounts=[{"destination": "/host", "type": "bind", "options": ["rbind"], "source": "/"}]),
        "host-paths",
    ),
    (
        oci(mounts=[{"destination": "/x", "type": "bind", "options": ["rbind"], "source": "/etc"}]),
        "host-paths",
    ),
    (
        oci(
            mounts=[{"destination": "/x", "type": "none", "options": ["bind"], "source": "/home/ann/../bob"}]
        ),
        "host-paths",
    ),
    (
        oci(mounts=[{"destination": "/dev/kvm", "type": "bind", "options": ["bind"], "source": "/dev/kvm"}]),
        "no-host-devices",
    ),
    # A job container may share the member's network only where CONTAINERS.job_network
    # is host; its PID namespace, never.
    (_job(oci(namespaces=[{"type": t} for t in ("pid", "ipc", "uts", "mount")])), "no-host-namespaces"),
    (_job(oci(namespaces=[{"type": t} for t in ("network", "ipc", "uts", "mount")])), "no-host-namespaces"),
]


@pytest.mark.parametrize("config,rule", OCI_CONFIGS)
def test_oci_configurations_that_reach_for_the_host_are_refused(config, rule):
    policy = dataclasses.replace(POL, job_network_host=False)
    with pytest.raises(PolicyRefusal) as info:
        check_oci_config(config, policy)
    assert info.value.rule == rule
    tally("attacks_refused")


def test_only_job_containers_get_the_host_network_and_only_when_configured():
    host_net = [{"type": t} for t in ("pid", "ipc", "uts", "mount")]
    allowed = dataclasses.replace(POL, job_network_host=True)
    check_oci_config(_job(oci(namespaces=host_net)), allowed)  # intended: nodes=N jobs
    for config, policy in (
        (oci(namespaces=host_net), allowed),
        (_job(oci(namespaces=host_net)), dataclasses.replace(POL, job_network_host=False)),
    ):
        with pytest.raises(PolicyRefusal):
            check_oci_config(config, policy)
        tally("attacks_refused")

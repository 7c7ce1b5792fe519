"""The container policy as tables: podman command lines, OCI configurations, builders."""

from __future__ import annotations

import doctest
import importlib

import pytest

from mtgpu.workspaces.policy import (
    RULES,
    canonical_image,
    check_oci_config,
    check_podman,
    create_argv,
    image_allowed,
    parse_publish,
    publish_args,
)
from mtgpu.workspaces.types import Mount, Policy, PolicyRefusal, Tenant, WorkspaceSpec

POL = Policy(
    home="/home/ann",
    datasets=("/data",),
    port_publishing="loopback",
    images=(canonical_image("reg:5000/team/img:1"), canonical_image("ubuntu:22.04")),
    registry="reg:5000",
    devices=("/dev/nvidia0", "/dev/nvidiactl"),
    cdi_devices=("nvidia.com/gpu=0",),
    runtime_dir="/run/user/2000",
)
IMG = "reg:5000/team/img:1"

REFUSED = [
    # (command line, rule)
    (["run", "--privileged", IMG], "no-privileged"),
    (["run", "--privileged=true", IMG], "no-privileged"),
    (["container", "run", "-it", "--privileged", IMG, "sh"], "no-privileged"),
    (["create", "--privileged", IMG], "no-privileged"),
    (["exec", "-it", "--privileged", "box", "sh"], "no-privileged"),
    (["run", "--device", "/dev/nvidia1", IMG], "no-host-devices"),
    (["run", "--device=/dev/sda", IMG], "no-host-devices"),
    (["run", "--device", "nvidia.com/gpu=1", IMG], "no-host-devices"),
    (["run", "--gpus", "all", IMG], "no-host-devices"),
    (["run", "--device-cgroup-rule", "c 195:* rwm", IMG], "no-host-devices"),
    (["run", "--pid", "host", IMG], "no-host-namespaces"),
    (["run", "--pid=host", IMG], "no-host-namespaces"),
    (["run", "--network", "host", IMG], "no-host-namespaces"),
    (["run", "--net=host", IMG], "no-host-namespaces"),
    (["run", "--ipc", "host", IMG], "no-host-namespaces"),
    (["run", "--uts=host", IMG], "no-host-namespaces"),
    (["run", "--cgroupns", "host", IMG], "no-host-namespaces"),
    (["run", "--network", "ns:/proc/1/ns/net", IMG], "no-host-namespaces"),
    (["pod", "create", "--network", "host"], "no-host-namespaces"),
    (["run", "-v", "/etc:/x", IMG], "host-paths"),
    (["run", "-v", "/home/bob:/x", IMG], "host-paths"),
    (["run", "-v", "/home/ann/../bob:/x", IMG], "host-paths"),
    (["run", "--volume=/:/host:ro", IMG], "host-paths"),
    (["run", "--mount", "type=bind,source=/var/lib,target=/x", IMG], "host-paths"),
    (["run", "--rootfs", "/srv/rootfs", "sh"], "host-paths"),
    (["volume", "create", "-o", "type=none", "-o", "device=/etc", "-o", "o=bind", "v"], "host-paths"),
    (["run", "-v", "/data/set:/d", IMG], "datasets-read-only"),
    (["run", "-v", "/datasets/data/set:/d", IMG], "datasets-read-only"),
    (["run", "--mount", "type=bind,src=/data,dst=/d", IMG], "datasets-read-only"),
    # podman reads --mount as CSV, a later key winning, the type in any case
    (["run", "--mount", "type=bind,source=/home/ann,src=/,target=/x", IMG], "host-paths"),
    (["run", "--mount", "type=bind,src=/home/ann,source=/etc,target=/x", IMG], "host-paths"),
    (["run", "--mount", "type=BIND,source=/etc,target=/x", IMG], "host-paths"),
    (["run", "--mount", "type=Glob,src=/etc/*,target=/x", IMG], "host-paths"),
    (["run", "--mount", 'type=bind,"source=/etc",target=/x', IMG], "host-paths"),
    (["run", "--mount", "type=bind,source=/data,target=/d,readonly,rw", IMG], "datasets-read-only"),
    (["run", "--mount", "type=bind,source=/data,target=/d,ro=true,ro=false", IMG], "datasets-read-only"),
    (["run", "--mount", "type=weird,source=/etc,target=/x", IMG], "host-paths"),
    (["run", "-p", "8080:80", IMG], "ports"),
    (["run", "-p", "0.0.0.0:8080:80", IMG], "ports"),
    (["run", "-P", IMG], "ports"),
    (["pod", "create", "-p", "80"], "ports"),
    (["run", "ubuntu", "sh"], "user-images"),
    (["pull", "quay.io/x/y"], "user-images"),
    (["build", "-t", "x", "."], "user-images"),
    (["--hooks-dir", "/tmp/none", "run", IMG], "podman-config"),
    (["--hooks-dir=/tmp/none", "ps"], "podman-config"),
    (["system", "service", "--time", "0"], "no-api-service"),
    (["kube", "play", "pod.yaml"], "no-api-service"),
    (["play", "kube", "pod.yaml"], "no-api-service"),
]

ALLOWED = [
    ["run", "--rm", "-it", IMG, "sh", "-c", "echo --privileged"],  # the container's own args
    ["run", "-v", "/home/ann/work:/work", IMG],
    ["run", "-v", "~/work:/work:rw", IMG],
    ["run", "-v", "/data/set:/d:ro", IMG],
    ["run", "-v", "/datasets/data:/d:ro", IMG],
    ["run", "--mount", "type=bind,source=/data,target=/d,readonly", IMG],
    ["run", "-v", "cachevol:/cache", IMG],
    ["run", "-v", "/anon", IMG],
    ["run", "--device", "/dev/nvidia0", IMG],
    ["run", "--device", "nvidia.com/gpu=0", IMG],
    ["run", "-p", "127.0.0.1::8888", IMG],
    ["run", "--publish=[::1]:9000:9000", IMG],
    ["run", "--network", "none", IMG],
    ["run", "--pid", "container:other", IMG],
    ["run", "--privileged=false", IMG],
    ["run", "--cap-add", "SYS_PTRACE", IMG],
    ["run", "ubuntu:22.04"],  # pre-pulled (Docker Hub short name)
    ["run", "team/img:1"],  # short name on the configured registry
    ["run", "localhost/mtgpu-saved/mine"],  # a saved workspace
    ["exec", "-it", "box", "sh"],
    ["ps", "-a"],
    ["images"],
    ["logs", "box"],
    ["--log-level", "debug", "ps"],
    ["inspect", "--type", "container", "box"],
    ["version"],
]


@pytest.mark.parametrize("argv,rule", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_refusals_name_their_rule(argv: list[str], rule: str) -> None:
    with pytest.raises(PolicyRefusal) as info:
        check_podman(argv, POL, cwd="/home/ann")
    assert info.value.rule == rule
    assert rule in str(info.value) and rule in RULES


@pytest.mark.parametrize("argv", ALLOWED, ids=[" ".join(a) for a in ALLOWED])
def test_allowed_command_lines_pass_unchanged(argv: list[str]) -> None:
    assert check_podman(argv, POL, cwd="/home/ann") == argv


def test_relative_paths_resolve_against_the_working_directory() -> None:
    check_podman(["run", "-v", "./src:/src", IMG], POL, cwd="/home/ann/proj")
    with pytest.raises(PolicyRefusal):
        check_podman(["run", "-v", "./src:/src", IMG], POL, cwd="/tmp")


def test_a_symlink_out_of_the_home_is_refused_when_resolved() -> None:
    def realpath(p: str) -> str:
        return "/etc" if p == "/home/ann/etc-link" else p

    with pytest.raises(PolicyRefusal, match="host-paths"):
        check_podman(["run", "-v", "/home/ann/etc-link:/x", IMG], POL, realpath=realpath)


def test_no_network_policy_adds_network_none_and_refuses_other_networks() -> None:
    pol = Policy(home="/h", network=False, allow_user_images=True)
    assert check_podman(["run", "img"], pol) == ["run", "--network=none", "img"]
    assert check_podman(["container", "create", "img"], pol) == [
        "container",
        "create",
        "--network=none",
        "img",
    ]
    assert check_podman(["run", "--network=none", "img"], pol) == ["run", "--network=none", "img"]
    for argv in (["run", "--network", "slirp4netns", "img"], ["run", "-p", "127.0.0.1::80", "img"]):
        with pytest.raises(PolicyRefusal, match="'network'"):
            check_podman(argv, pol)


@pytest.mark.parametrize(
    "policy,spec,ok",
    [
        ("none", "127.0.0.1::80", False),
        ("loopback", "127.0.0.1::80", True),
        ("loopback", "localhost:8080:80", True),
        ("loopback", "80", False),
        ("any", "80", True),
        ("any", "0.0.0.0:1:2", True),
    ],
)
def test_port_policy_table(policy: str, spec: str, ok: bool) -> None:
    pol = Policy(home="/h", port_publishing=policy, allow_user_images=True)
    if ok:
        check_podman(["run", "-p", spec, "img"], pol)
    else:
        with pytest.raises(PolicyRefusal, match="'ports'"):
            check_podman(["run", "-p", spec, "img"], pol)


def test_parse_publish_forms() -> None:
    assert parse_publish("8080") == ("", "", "8080")
    assert parse_publish("1:2") == ("", "1", "2")
    assert parse_publish("127.0.0.1:1:2/udp") == ("127.0.0.1", "1", "2")
    assert parse_publish("[::1]::2") == ("::1", "", "2")


@pytest.mark.parametrize(
    "ref,registry,want",
    [
        ("ubuntu", "", "docker.io/library/ubuntu:latest"),
        ("ubuntu:22.04", "", "docker.io/library/ubuntu:22.04"),
        ("team/img", "r:5000", "r:5000/team/img:latest"),
        ("docker://quay.io/a/b:1", "", "quay.io/a/b:1"),
        ("localhost/x:2", "r:5000", "localhost/x:2"),
        ("r:5000/a@sha256:ab", "", "r:5000/a@sha256:ab"),
    ],
)
def test_canonical_image(ref: str, registry: str, want: str) -> None:
    assert canonical_image(ref, registry) == want


def test_image_allowed() -> None:
    assert image_allowed("team/img:1", POL) and image_allowed("reg:5000/team/img:1", POL)
    assert not image_allowed("team/img:2", POL)
    assert image_allowed("anything", Policy(home="/h", allow_user_images=True))


# ----------------------------------------------------------- OCI configurations


def oci(**over: object) -> dict:
    base = {
        "annotations": {"io.podman.annotations.privileged": "FALSE"},
        "process": {"capabilities": {"bounding": ["CAP_CHOWN", "CAP_KILL"]}},
        "linux": {
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
            "maskedPaths": ["/proc/kcore"],
            "devices": [],
        },
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {
                "destination": "/etc/hosts",
                "type": "bind",
                "options": ["bind"],
                "source": "/run/user/2000/containers/x/userdata/hosts",
            },
            {"destination": "/home/ann", "type": "bind", "options": ["rbind"], "source": "/home/ann"},
            {"destination": "/data", "type": "bind", "options": ["rbind", "ro"], "source": "/data"},
            {"destination": "/dev/null", "type": "bind", "options": ["bind"], "source": "/dev/null"},
        ],
    }
    for k, v in over.items():
        if k == "mounts":
            base["mounts"] = base["mounts"] + v  # type: ignore[operator]
        elif k == "namespaces":
            base["linux"]["namespaces"] = v  # type: ignore[index]
        elif k == "devices":
            base["linux"]["devices"] = v  # type: ignore[index]
        else:
            base[k] = v
    return base


OCI_REFUSED = [
    (oci(annotations={"io.podman.annotations.privileged": "TRUE"}), "no-privileged"),
    (oci(namespaces=[{"type": t} for t in ("network", "ipc", "uts", "mount")]), "no-host-namespaces"),
    (oci(namespaces=[{"type": t} for t in ("pid", "ipc", "uts", "mount")]), "no-host-namespaces"),
    (oci(devices=[{"path": "/dev/sda", "type": "b"}]), "no-host-devices"),
    (
        oci(mounts=[{"destination": "/dev/kvm", "type": "bind", "options": ["bind"], "source": "/dev/kvm"}]),
        "no-host-devices",
    ),
    (
        oci(mounts=[{"destination": "/x", "type": "bind", "options": ["rbind"], "source": "/etc"}]),
        "host-paths",
    ),
    (
        oci(mounts=[{"destination": "/x", "type": "bind", "options": ["rbind"], "source": "/data"}]),
        "datasets-read-only",
    ),
]


@pytest.mark.parametrize("config,rule", OCI_REFUSED)
def test_oci_config_refusals(config: dict, rule: str) -> None:
    with pytest.raises(PolicyRefusal) as info:
        check_oci_config(config, POL)
    assert info.value.rule == rule


def test_oci_config_of_an_ordinary_container_passes() -> None:
    check_oci_config(
        oci(
            devices=[{"path": "/dev/nvidia0"}],
            mounts=[
                {
                    "destination": "/dev/nvidia0",
                    "type": "bind",
                    "options": ["bind"],
                    "source": "/dev/nvidia0",
                },
                {
                    "destination": "/usr/lib/libcuda.so",
                    "type": "bind",
                    "options": ["bind"],
                    "source": "/usr/lib/libcuda.so",
                },
            ],
        ),
        Policy(**{**POL.to_dict(), "system_sources": ("/usr/lib/libcuda.so",)}),
    )  # type: ignore[arg-type]


# ------------------------------------------------------------------ builders

TENANT = Tenant("ann", 2000, 2000, "/home/ann")


def test_create_argv_mounts_home_cache_datasets_and_publishes_on_loopback() -> None:
    spec = WorkspaceSpec(
        name="nb",
        image=IMG,
        ports=(8888,),
        env={"A": "1"},
        mounts=(Mount("~/proj", "/proj"), Mount("/data/x", "/x")),
    )
    argv = create_argv(
        spec,
        TENANT,
        POL,
        image=IMG,
        reservation="7",
        cache_volumes=("/root/.cache",),
        devices=["nvidia.com/gpu=0"],
    )
    assert argv[:2] == ["create", "--name=nb"] and "--userns=keep-id" in argv
    assert "--volume=/home/ann:/home/ann" in argv and "--env=HOME=/home/ann" in argv
    assert "--volume=/home/ann/.mtgpu/cache/root-.cache:/root/.cache" in argv
    assert "--volume=/data:/data:ro" in argv and "--volume=/data/x:/x:ro" in argv
    assert "--volume=/data:/datasets/data:ro" in argv  # where every tenant finds it
    assert "--volume=/home/ann/proj:/proj" in argv
    assert "--publish=127.0.0.1::8888" in argv and "--device=nvidia.com/gpu=0" in argv
    assert "--label=mtgpu.reservation=7" in argv and "--env=A=1" in argv
    assert argv[-4:] == [IMG, "-c", argv[-2], argv[-1]] or argv[-3] == IMG
    # The builder's own output passes the same policy a tenant's command line meets.
    check_podman(argv, Policy(**{**POL.to_dict(), "allow_user_images": True}))  # type: ignore[arg-type]


def test_builders_refuse_what_the_policy_refuses() -> None:
    with pytest.raises(PolicyRefusal, match="'ports'"):
        publish_args([80], Policy(home="/h", port_publishing="none"))
    with pytest.raises(PolicyRefusal, match="host-paths"):
        create_argv(
            WorkspaceSpec(name="x", image="i", mounts=(Mount("/etc", "/e"),)),
            TENANT,
            POL,
            image="i",
            reservation="1",
        )
    with pytest.raises(PolicyRefusal, match="no-privileged"):
        create_argv(
            WorkspaceSpec(name="x", image="i", run_args=("--privileged",)),
            TENANT,
            POL,
            image="i",
            reservation="1",
        )


def test_spec_round_trips_through_plain_dicts() -> None:
    from mtgpu.workspaces.types import BuildSpec

    spec = WorkspaceSpec(
        name="a",
        image="i",
        ports=(1, 2),
        mounts=(Mount("s", "/t", True),),
        post_create=(("sh", "-c", "x"),),
        build=BuildSpec("D", "C", {"k": "v"}),
    )
    assert WorkspaceSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize(
    "name",
    [
        "mtgpu.workspaces.policy",
        "mtgpu.workspaces.devcontainer",
        "mtgpu.workspaces.images",
        "mtgpu.workspaces.cdi",
        "mtgpu.workspaces.hook",
        "mtgpu.workspaces.shim",
        "mtgpu.workspaces.tenant_podman",
        "mtgpu.cli.container",
    ],
)
def test_doctests(name: str) -> None:
    failed, _ = doctest.testmod(importlib.import_module(name))
    assert failed == 0

"""What rootless podman needs: facts in, findings out (no host touched)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from mtgpu.accounts.provision import subid_range
from mtgpu.config.options import Options, load_text
from mtgpu.workspaces.hostcheck import HostFacts, assess, dropin_text, hook_json

OPTS = load_text("CONTAINERS: {enabled: true, prepull: [x]}\nRUN_DIR: /run/mtgpu\n")
HOOK = "/opt/mtgpu/venv/bin/mtgpu-podman-hook"
LO, HI = subid_range(20000)
GOOD = HostFacts(
    podman="/usr/bin/podman",
    podman_version="4.3.1",
    newuidmap_setuid=True,
    network_helper="/usr/bin/slirp4netns",
    skopeo=True,
    runc=True,
    crun=False,
    cgroup_unified=False,
    systemd=False,
    tun_mode=0o666,
    run_user=True,
    subuid={20000: [(LO, HI - LO + 1)]},
    subgid={20000: [(LO, HI - LO + 1)]},
    tenants={"ann": 20000},
)
GOOD = dataclasses.replace(
    GOOD, dropin=dropin_text(GOOD), hook=hook_json(HOOK, OPTS.api_socket, OPTS.tenant_uid_range)
)


def by_name(facts: HostFacts, options: Options = OPTS) -> dict[str, object]:
    return {f.name: f for f in assess(facts, options, HOOK)}


def test_a_ready_host_is_all_ok() -> None:
    assert all(f.ok for f in assess(GOOD, OPTS, HOOK))


@pytest.mark.parametrize(
    "change,name,fix,words",
    [
        ({"tun_mode": 0o600}, "/dev/net/tun", "tun", "0666"),
        ({"tun_mode": None}, "/dev/net/tun", "", "modprobe tun"),
        ({"run_user": False}, "/run/user", "run_user", "missing"),
        ({"subuid": {}}, "subuid/subgid", "subids", "ann"),
        ({"dropin": ""}, "containers.conf", "dropin", 'cgroup_manager = "cgroupfs"'),
        ({"hook": ""}, "policy hook", "hook", "mtgpu-podman-hook"),
        ({"runc": False}, "runtime", "", "apt-get install runc"),
        ({"podman": None}, "podman", "", "apt-get install podman"),
        ({"newuidmap_setuid": False}, "newuidmap", "", "uidmap"),
        ({"network_helper": None}, "network helper", "", "slirp4netns"),
        ({"skopeo": False}, "skopeo", "", "skopeo"),
        ({"nvidia": True, "nvidia_ctk": True}, "NVIDIA CDI", "cdi", "nvidia-ctk cdi generate"),
        ({"nvidia": True}, "NVIDIA CDI", "", "nvidia-ctk cdi generate"),
    ],
)
def test_each_missing_need_is_named(change: dict, name: str, fix: str, words: str) -> None:
    f = by_name(dataclasses.replace(GOOD, **change))[name]
    assert not f.ok and f.fix == fix and words in f.detail  # type: ignore[attr-defined]
    assert ("fixable" if fix else "MISSING") in f.line()  # type: ignore[attr-defined]


def test_dropin_follows_the_host() -> None:
    hybrid = dropin_text(GOOD)
    assert 'runtime = "runc"' in hybrid and 'cgroup_manager = "cgroupfs"' in hybrid
    modern = dropin_text(dataclasses.replace(GOOD, cgroup_unified=True, systemd=True))
    assert "runtime" not in modern and "cgroup_manager" not in modern
    assert "hooks_dir" in modern


def test_hook_runs_before_every_container() -> None:
    h = json.loads(hook_json(HOOK, "/run/mtgpu/api.sock", (20000, 29999)))
    assert h["stages"] == ["precreate"] and h["when"] == {"always": True}
    assert h["hook"]["path"] == HOOK and "/run/mtgpu/api.sock" in h["hook"]["args"]

"""The workspace service's logic with a real job table and scheduler, and a recording
container runtime: reservations, queueing, release, moving GPUs, failures, restarts."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest

from mtgpu.config.options import load_text
from mtgpu.gpuinfo.types import GpuInfo, HostUsage, NodeInventory
from mtgpu.jobspec import JobSpec, ResourceRequest, spec_to_dict
from mtgpu.jobstate import CANCELLED, RUNNING
from mtgpu.schedd.jobtable import JobTable
from mtgpu.schedd.scheduler import Scheduler
from mtgpu.state.codec import JobRecord
from mtgpu.workspaces.podman import ContainerRuntime
from mtgpu.workspaces.service import Workspaces
from mtgpu.workspaces.types import PodmanError, Tenant, WorkspaceError

NODE = "n1"


class Recorder(ContainerRuntime):
    """Containers in a dict; every call recorded."""

    def __init__(self) -> None:
        self.containers_: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, ...]] = []
        self.fail_create = ""

    def containers(self, tenant: Tenant) -> list[dict[str, Any]]:
        return [
            {"name": n, "state": c["state"], "ports": [], "image": c["image"], "labels": {}}
            for n, c in self.containers_.items()
        ]

    def image_exists(self, tenant: Tenant, image: str) -> bool:
        return True

    def create(self, tenant: Tenant, argv: Any) -> None:
        self.calls.append(("create", *argv))
        if self.fail_create:
            raise PodmanError(["podman", "create"], f"Error: {self.fail_create}")
        name = argv[1].split("=", 1)[1]
        image = next(a for a in argv if a.startswith("localhost/") or a == "img:1")
        self.containers_[name] = {
            "state": "created",
            "image": image,
            "env": [a for a in argv if a.startswith("--env=MTGPU_GPUS")],
        }

    def start(self, tenant: Tenant, name: str, within: Any = ()) -> None:
        self.calls.append(("start", name))
        self.containers_[name]["state"] = "running"

    def stop(self, tenant: Tenant, name: str) -> None:
        self.calls.append(("stop", name))
        if name in self.containers_:
            self.containers_[name]["state"] = "exited"

    def remove(self, tenant: Tenant, name: str) -> None:
        self.calls.append(("rm", name))
        self.containers_.pop(name, None)

    def commit(self, tenant: Tenant, name: str, image: str) -> str:
        self.calls.append(("commit", name, image))
        return "sha256:x"

    def exec(
        self, tenant: Tenant, name: str, argv: Any, user: str = "", timeout: float = 600, within: Any = ()
    ) -> Any:
        self.calls.append(("exec", name, *argv))
        return type("P", (), {"returncode": 0, "stdout": "", "stderr": ""})()


class FakeSampler:
    def device_nodes(self, indices: list[int]) -> list[str]:
        return []

    def visibility_env(self, indices: list[int]) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, indices))}


class FakeHost:
    def __init__(self, tmp: Path, gpus: int = 2) -> None:
        self.options = load_text(f"""
SERVER_NAME: {NODE}
STATE_DIR: {tmp}/state
RUN_DIR: {tmp}/run
CONTAINERS:
  enabled: true
  allow_user_images: true
  templates: {{box: {{image: "img:1"}}}}
""")
        self.jobs = JobTable()
        self.sampler = FakeSampler()
        self.tools_dir = str(tmp / "bin")
        self.scheduler = Scheduler(self.jobs, self.replicate, self.dispatch, term=lambda: 1)
        gpus_ = tuple(
            GpuInfo(i, "nvidia", "rtx4090", "RTX 4090", f"GPU-{i}", 24 << 30, 0, 0) for i in range(gpus)
        )
        self.scheduler.report(NodeInventory(NODE, gpus_, HostUsage(16, 0.0, 64 << 30, 0, 1, 1)))

    async def replicate(self, method: Any, *args: Any) -> Any:
        return method(*args, _doApply=True)

    async def dispatch(self, job: JobRecord, term: int) -> None:
        self.jobs.started(job.job_id, NODE, time.time(), _doApply=True)

    async def agent_tick(self) -> None:
        """What the agent does with a cancelled holder: it ends."""
        for j in list(self.jobs.active()):
            if j["state"] == RUNNING and j.get("cancel_requested"):
                self.jobs.finish(j["job_id"], CANCELLED, None, j["reason"], time.time(), _doApply=True)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    host = FakeHost(tmp_path)
    rt = Recorder()
    ws = Workspaces(host, rt)  # type: ignore[arg-type]
    t = Tenant("ann", 20001, 20001, str(tmp_path / "home"))
    monkeypatch.setattr(Workspaces, "tenant", lambda self, name, uid: t)
    return host, rt, ws


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def settle(host: FakeHost, ws: Workspaces) -> None:
    await host.scheduler.run_pass()
    await host.agent_tick()
    await ws.reconcile()


def test_create_reserves_places_and_starts(env) -> None:
    host, rt, ws = env

    async def go() -> None:
        v = await ws.create("ann", 20001, {"name": "a", "template": "box", "gpus": 1, "wait": 0})
        assert v["state"] == "PENDING"  # the scheduler has not run yet
        await settle(host, ws)
        v = await ws.show("ann", 20001, "a")
        assert v["state"] == "RUNNING" and len(v["gpus"]) == 1
        job = host.jobs.get(v["reservation"])
        assert job["workspace"] == {"name": "a", "node": NODE} and job["name"] == "workspace-a"
        assert list(job["spec"]["request"]["servers"]) == [NODE] and job["spec"]["output"] == "/dev/null"
        assert rt.containers_["a"]["env"] == [f"--env=MTGPU_GPUS={v['gpus'][0]}"]

    run(go())


def test_release_and_start_again_on_other_gpus_moves_the_container(env) -> None:
    host, rt, ws = env

    async def go() -> None:
        await ws.create("ann", 20001, {"name": "a", "template": "box", "gpus": 1, "wait": 0})
        await settle(host, ws)
        g = (await ws.show("ann", 20001, "a"))["gpus"][0]
        v = await ws.stop_ws("ann", 20001, "a", release=True)
        await settle(host, ws)
        assert (await ws.show("ann", 20001, "a"))["state"] == "RELEASED"
        for n in ("c", "d"):
            await ws.create("ann", 20001, {"name": n, "template": "box", "gpus": 1, "wait": 0})
            await settle(host, ws)
        v = await ws.start_ws("ann", 20001, "a", wait=0)
        await settle(host, ws)
        assert (await ws.show("ann", 20001, "a"))["state"] == "PENDING"  # the host is full
        holders = {n: (await ws.show("ann", 20001, n))["gpus"] for n in ("c", "d")}
        other = next(n for n, gs in holders.items() if gs != [g])
        await ws.rm("ann", 20001, other)
        await settle(host, ws)
        await settle(host, ws)
        v = await ws.show("ann", 20001, "a")
        assert v["state"] == "RUNNING" and v["gpus"] == [1 - g]
        # the writable layer was committed and the container re-created on the new GPU
        assert ("commit", "a", "localhost/mtgpu-carry/a:latest") in rt.calls
        assert rt.containers_["a"]["image"] == "localhost/mtgpu-carry/a:latest"

    run(go())


def test_stop_keeps_the_reservation_and_a_cancelled_one_stops_the_container(env) -> None:
    host, rt, ws = env

    async def go() -> None:
        v = await ws.create("ann", 20001, {"name": "a", "template": "box", "wait": 0})
        await settle(host, ws)
        v = await ws.stop_ws("ann", 20001, "a")
        assert v["state"] == "STOPPED" and host.jobs.get(v["reservation"])["state"] == RUNNING
        await settle(host, ws)
        assert rt.containers_["a"]["state"] == "exited"  # not restarted behind the tenant's back
        v = await ws.start_ws("ann", 20001, "a", wait=0)
        assert v["state"] == "RUNNING"
        # `mt-job cancel` on the reservation: the workspace stops, its container is kept
        host.jobs.cancel([v["reservation"]], "ann", time.time(), _doApply=True)
        await settle(host, ws)
        v = await ws.show("ann", 20001, "a")
        assert v["state"] == "RELEASED" and rt.containers_["a"]["state"] == "exited"

    run(go())


def test_no_queue_refuses_a_full_host_and_leaves_nothing_behind(env) -> None:
    host, _rt, ws = env

    async def go() -> None:
        await ws.create("ann", 20001, {"name": "a", "template": "box", "gpus": 2, "wait": 0})
        await settle(host, ws)
        with pytest.raises(WorkspaceError, match="cannot hold the workspace now"):
            await ws.create(
                "ann", 20001, {"name": "b", "template": "box", "gpus": 1, "wait": 0.5, "queue": False}
            )
        assert ("ann", "b") not in [(r.user, r.name) for r in ws.records.values()]
        assert [j["state"] for j in host.jobs.all() if j["name"] == "workspace-b"] == [CANCELLED]
        with pytest.raises(WorkspaceError, match="can never be placed"):
            await ws.create("ann", 20001, {"name": "c", "template": "box", "gpus": 3, "wait": 0})

    run(go())


def test_a_container_that_cannot_be_made_frees_its_reservation(env) -> None:
    host, rt, ws = env
    rt.fail_create = "no such image"

    async def go() -> None:
        await ws.create("ann", 20001, {"name": "a", "template": "box", "gpus": 1, "wait": 0})
        await settle(host, ws)
        await host.agent_tick()
        v = await ws.show("ann", 20001, "a")
        assert v["state"] == "FAILED" and "no such image" in v["error"]
        assert host.jobs.get(v["reservation"])["state"] == CANCELLED

    run(go())


def test_records_survive_a_daemon_restart(env, tmp_path: Path) -> None:
    host, rt, ws = env

    async def go() -> None:
        await ws.create("ann", 20001, {"name": "a", "template": "box", "wait": 0})
        await settle(host, ws)
        again = Workspaces(host, rt)  # type: ignore[arg-type]
        again._load()
        n = len(rt.calls)
        await again.reconcile()
        assert len(rt.calls) == n  # nothing re-created or restarted
        assert (await again.show("ann", 20001, "a"))["state"] == "RUNNING"

        def plain(r: Any) -> str:
            return json.dumps(dataclasses.asdict(r), sort_keys=True)

        assert plain(again.records[(20001, "a")]) == plain(ws.records[(20001, "a")])

    run(go())


def test_names_and_sources_are_checked(env) -> None:
    _host, _rt, ws = env

    async def go() -> None:
        for args, words in (
            ({"name": "Bad Name", "template": "box"}, "not a workspace name"),
            ({"name": "x"}, "exactly one of"),
            ({"name": "x", "template": "box", "image": "i"}, "exactly one of"),
            ({"name": "x", "template": "nope"}, "no template 'nope'"),
        ):
            with pytest.raises(WorkspaceError, match=words):
                await ws.create("ann", 20001, {**args, "wait": 0})
        await ws.create("ann", 20001, {"name": "x", "template": "box", "wait": 0})
        with pytest.raises(WorkspaceError, match="already have a workspace 'x'"):
            await ws.create("ann", 20001, {"name": "x", "template": "box", "wait": 0})
        with pytest.raises(WorkspaceError, match="no workspace 'y'"):
            await ws.stop_ws("ann", 20001, "y")

    run(go())


def test_stopping_a_queued_workspace_leaves_the_queue(env) -> None:
    host, _rt, ws = env

    async def go() -> None:
        await ws.create("ann", 20001, {"name": "a", "template": "box", "gpus": 2, "wait": 0})
        await settle(host, ws)
        v = await ws.create("ann", 20001, {"name": "b", "template": "box", "gpus": 1, "wait": 0})
        await settle(host, ws)
        assert (await ws.show("ann", 20001, "b"))["state"] == "PENDING"
        v = await ws.stop_ws("ann", 20001, "b")
        assert v["state"] == "ENDED" and host.jobs.get(v["reservation"])["state"] == CANCELLED
        assert (await ws.start_ws("ann", 20001, "b", wait=0))["state"] == "PENDING"
        await ws.rm("ann", 20001, "a")
        await settle(host, ws)
        await settle(host, ws)
        assert (await ws.show("ann", 20001, "b"))["state"] == "RUNNING"

    run(go())


def test_gpu_devices_cdi_for_nvidia_nodes_for_the_rest(env, monkeypatch: pytest.MonkeyPatch) -> None:
    from mtgpu.workspaces import cdi

    host, _rt, ws = env
    amd = GpuInfo(2, "amd", "mi300x", "MI300X", "amd-2", 192 << 30, 0, 0)
    inv = host.scheduler.nodes[NODE]
    host.scheduler.report(dataclasses.replace(inv, gpus=(*inv.gpus, amd)))
    monkeypatch.setattr(
        cdi,
        "load_specs",
        lambda *a: [
            {
                "kind": "nvidia.com/gpu",
                "devices": [{"name": "0"}, {"name": "GPU-1"}],
                "containerEdits": {"mounts": [{"hostPath": "/usr/lib/libcuda.so.1"}]},
            }
        ],
    )
    monkeypatch.setattr(
        host.sampler, "device_nodes", lambda idx: ["/dev/kfd", "/dev/dri/renderD130"] if idx == [2] else []
    )
    cdis, nodes, env_ = ws.gpu_devices([1, 2])
    assert cdis == ["nvidia.com/gpu=GPU-1"] and nodes == ["/dev/kfd", "/dev/dri/renderD130"]
    assert env_ == {"MTGPU_GPUS": "1,2"}
    # what the tenant holds is what mt-podman and the hook let through, and no more
    host.jobs.submit(
        {
            "user": "ann",
            "uid": 20001,
            "name": "j",
            "spec": spec_to_dict(JobSpec(ResourceRequest(), "")),
            "workdir": "/",
        },
        None,
        time.time(),
        _doApply=True,
    )
    jid = max(host.jobs.jobs, key=int)
    host.jobs.jobs[jid] = {
        **host.jobs.jobs[jid],
        "state": RUNNING,
        "placement": {
            "job_id": jid,
            "gpu_mode": "exclusive",
            "members": [{"node": NODE, "rank": 0, "gpu_indices": [1, 2], "cpus": 1, "ram": 0}],
        },
    }
    pol = ws.policy(ws.tenant("ann", 20001))
    assert pol.cdi_devices == ("nvidia.com/gpu=GPU-1",)
    assert pol.devices == ("/dev/kfd", "/dev/dri/renderD130")
    assert pol.system_sources == ("/usr/lib/libcuda.so.1",)


def test_a_release_waiting_for_the_lock_does_not_bring_back_a_removed_workspace(env) -> None:
    """`rm` holds the workspace's lock while the reconcile loop, which saw the reservation
    end, waits for it: when the loop gets the lock the record is gone and stays gone."""
    host, rt, ws = env

    async def go() -> None:
        v = await ws.create("ann", 20001, {"name": "a", "template": "box", "wait": 0})
        await settle(host, ws)
        key = (20001, "a")
        async with ws._lock(key):
            host.jobs.cancel([v["reservation"]], "ann", time.time(), _doApply=True)
            await host.agent_tick()  # the reservation ended ...
            loop = asyncio.create_task(ws.reconcile())
            await asyncio.sleep(0.01)  # ... and the loop waits for the lock
            rt.remove(ws.tenant("ann", 20001), "a")
            ws._drop(ws.records[key])
        await loop
        assert key not in ws.records
        assert not (ws.state_dir / "20001" / "a.json").exists()
        assert all(x["name"] != "a" for x in await ws.list("ann", 20001))

    run(go())


def test_a_released_workspace_is_on_record_until_its_tenant_is_removed(env) -> None:
    host, _, ws = env

    async def go() -> None:
        await ws.create("ann", 20001, {"name": "a", "template": "box", "gpus": 1, "wait": 0})
        await settle(host, ws)
        await ws.stop_ws("ann", 20001, "a", release=True)
        await settle(host, ws)
        # Retention asks for it: a released workspace keeps its tenant.
        assert ws.names_of(20001) == ["a"] and ws.names_of(20002) == []
        state = ws.state_dir / "20001" / "a.json"
        assert state.exists()
        # Removing the tenant takes its state files with it.
        assert ws.forget(20001) == ["a"]
        assert not state.exists() and not state.parent.exists() and ws.names_of(20001) == []

    run(go())

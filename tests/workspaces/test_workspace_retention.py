"""TENANT_RETENTION_DAYS and workspaces: a stopped or released workspace keeps its
tenant from the lock (a real daemon, rootless podman, the policy clock moved through
MTGPU_CLOCK_OFFSET_FILE)."""

from __future__ import annotations

import json

import pytest
from mtgpu_testing import wait_job
from workspace_testing import IMAGE, podman_ready, start_workspace_host, stop_workspace_host

pytestmark = [pytest.mark.root, pytest.mark.podman]

DAY = 86400


def test_a_released_workspace_keeps_its_tenant_from_the_lock() -> None:
    why = podman_ready()
    if why:
        pytest.skip(why)
    wh = start_workspace_host(
        {
            "TENANT_RETENTION_DAYS": 30,
            "TENANT_RETENTION_GRACE": "7d",
            "CONTAINERS": {
                "enabled": True,
                "templates": {"busybox": {"image": IMAGE, "cpus": 1, "ram": "256M"}},
            },
        },
        user="resting",
    )
    h = wh.host
    try:
        offset = h.dir / "clock-offset"
        offset.write_text("0")
        h.env["MTGPU_CLOCK_OFFSET_FILE"] = str(offset)
        h.restart()
        created = wh.mc("create", "keep", "--template", "busybox")
        assert created["state"] == "RUNNING"
        assert wh.mc("stop", "keep", "--release")["state"] == "RELEASED"
        # The release answers before the workspace's job has ended (as scancel does);
        # until it has, the plan would say "blocked: running job" for another reason.
        wait_job(
            h,
            wh.user,
            wh.key,
            str(created["reservation"]),
            lambda j: j["state"] not in ("PENDING", "RUNNING"),
            "the released workspace's job to end",
        )
        offset.write_text(str(31 * DAY))
        dry = {s["user"]: s for s in json.loads(h.admin("retention", "--dry-run", "--json").stdout)["steps"]}
        assert "workspace(s) keep on" in dry["resting"].get("done", ""), dry["resting"]
        done = {s["user"]: s for s in json.loads(h.admin("retention", "--json").stdout)["steps"]}
        assert done["resting"]["done"].startswith("blocked: "), done["resting"]
        assert "workspace(s) keep on" in done["resting"]["done"]
        assert wh.ssh("true").returncode == 0  # not locked
    finally:
        offset.write_text("0")
        wh.rm("keep")
        stop_workspace_host(h)

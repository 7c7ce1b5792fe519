"""A hostile tenant attaches to the podman the daemon runs for its workspaces.

Podman runs with the tenant's UID, so the tenant may ``ptrace`` it (no Yama on
default Debian): whatever podman is, the tenant can become. While it waits on a
registry the tenant holds stuck, every process of the tenant's UID must be inside the
tenant's session cgroup and see the tenant's private /tmp, as its sessions do.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
from mtgpu_testing import free_port, wait_for
from security_testing import STUCK_LISTENER, procs_of
from workspace_testing import podman_ready, start_workspace_host, stop_workspace_host

pytestmark = [pytest.mark.root, pytest.mark.podman]


def _tmp_source(pid: int) -> str:
    """The source of the mount a process sees on /tmp (the last one there)."""
    source = ""
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/tmp" and " - " in line:
            source = line.split(" - ", 1)[1].split()[1]
    return source


@pytest.fixture(scope="module")
def ws_host():
    """Workspaces on, and any image allowed: a tenant names the registry."""
    why = podman_ready()
    if why:
        pytest.skip(why)
    wh = start_workspace_host({"CONTAINERS": {"enabled": True, "allow_user_images": True}})
    yield wh
    stop_workspace_host(wh.host)


def test_a_podman_pull_for_a_workspace_runs_inside_the_tenants_fence(ws_host) -> None:
    uid = ws_host.uid
    port = free_port()
    host, user, key = ws_host.host, ws_host.user, ws_host.key
    listener = subprocess.Popen(
        host.ssh_argv(user, key, f"exec python3 -c {shlex.quote(STUCK_LISTENER)} {port} 60"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "stuck"
        creating = subprocess.Popen(
            host.ssh_argv(
                user, key, f"mt-container create stuckpull --image 127.0.0.1:{port}/hostile/image:1"
            ),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:

            def pulling() -> int | None:
                if creating.poll() is not None:
                    raise AssertionError(f"mt-container create ended: {creating.communicate()[0]}")
                return next((p for p, cmd in procs_of(uid).items() if " pull " in cmd), None)

            pull = wait_for(pulling, 60, "podman pull to wait on the stuck registry")
            checked = 0
            for pid in [pull, *procs_of(uid)]:
                try:
                    cgroup = Path(f"/proc/{pid}/cgroup").read_text()
                    tmp = _tmp_source(pid)
                except OSError:
                    continue  # ended meanwhile
                cmd = procs_of(uid).get(pid)
                assert f"tenant-{uid}" in cgroup, (pid, cmd, cgroup)
                # Rootless podman enters a mount namespace of its own, made from the one
                # it was started in: the tenant's, whose /tmp is the tenant's tmpfs.
                assert tmp.startswith(f"mtgpu-tmp-{uid}-"), (pid, cmd, tmp)
                checked += 1
            assert checked >= 2
        finally:
            creating.kill()
            creating.wait()
    finally:
        listener.kill()
        listener.wait()
        ws_host.ssh("mt-container", "rm", "stuckpull")


def test_a_workspace_runs_in_its_reservations_cgroups_not_the_sessions(ws_host) -> None:
    """``podman start`` joins the cgroups of the job that holds the workspace's
    reservation: the container's processes are bound by its GPUs and memory, never
    left in the session cgroup (which denies every GPU) or the daemon's."""
    v = ws_host.mc("create", "boxed", "--image", "localhost/mtgpu-test:1")
    try:
        v = ws_host.wait_state("boxed", {"RUNNING"}, timeout=90)
        job = v["reservation"]
        assert job, v
        _, out, _ = ws_host.run("podman inspect boxed --format '{{.State.Pid}}'")
        pid = int(out.strip())
        cgroup = Path(f"/proc/{pid}/cgroup").read_text()
        assert f"mtgpu_job_{job}_" in cgroup, cgroup
        assert f"tenant-{ws_host.uid}" not in cgroup, cgroup
        # What `mt-container shell` runs inside (from the session, whose cgroup denies
        # every GPU) is in the reservation's cgroups too: the shell joins them first.
        shell = subprocess.Popen(
            ws_host.host.ssh_argv(ws_host.user, ws_host.key, "mt-container shell boxed -- sleep 60"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            inside = wait_for(
                lambda: next(
                    (p for p, cmd in procs_of(ws_host.uid).items() if cmd.strip() == "sleep 60"), None
                ),
                60,
                "the shell's command to run in the workspace",
            )
            cgroup = Path(f"/proc/{inside}/cgroup").read_text()
            lines = {ln.split(":")[1]: ln.split(":", 2)[2] for ln in cgroup.splitlines()}
            # The walls (devices, memory, pids; v2's one hierarchy) are the reservation's.
            walls = [c for c in ("devices", "memory", "pids") if c in lines] or [""]
            assert all(f"mtgpu_job_{job}_" in lines[c] for c in walls), cgroup
        finally:
            shell.kill()
            shell.wait()
    finally:
        ws_host.ssh("mt-container", "rm", "boxed")

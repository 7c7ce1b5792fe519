"""Helpers for the workspace tests: a real host with container workspaces on, rootless
podman as the tenant, a test image built from a busybox-static rootfs and imported by
the tenant, and podman-check --fix run inside the host's mount namespace (its /etc)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from mtgpu_testing import shared_uid_range

from mtgpu.accounts.provision import subid_range

IMAGE = "localhost/mtgpu-test:1"
# A UID range of their own: /run/user/UID is shared with the machine, and other
# tests' tenants (from 20000) must never meet these.
UID_RANGE = shared_uid_range(32100)
BUSYBOX = "/bin/busybox"


def podman_ready() -> str | None:
    """Why the podman tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("podman", "runc", "newuidmap", "slirp4netns"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            return f"needs {tool} (tests/run.sh installs it)"
    if not os.path.exists(BUSYBOX):
        return "needs busybox-static"
    return None


def make_rootfs(d: Path) -> Path:
    """A tiny image root: busybox-static and its applets, /tmp, /etc/passwd."""
    root = d / "rootfs"
    (root / "bin").mkdir(parents=True)
    shutil.copy(BUSYBOX, root / "bin" / "busybox")
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True).stdout.split()
    for a in applets:
        if a != "busybox":
            (root / "bin" / a).symlink_to("busybox")
    (root / "tmp").mkdir(mode=0o1777)
    os.chmod(root / "tmp", 0o1777)
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
    return root


class WorkspaceHost:
    """A started host, one tenant, and helpers that drive it over real ssh."""

    def __init__(self, host: Any, user: str, key: Path) -> None:
        self.host, self.user, self.key = host, user, key

    @property
    def home(self) -> Path:
        return self.host.homes / self.user

    @property
    def uid(self) -> int:
        return int(self.host.passwd(self.user)[2])

    def ssh(
        self, *cmd: str, input: bytes | None = None, timeout: float = 120, opts: list[str] | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        return self.host.ssh(self.user, self.key, *cmd, input=input, timeout=timeout, opts=opts)

    def run(self, cmd: str, *, ok: bool = True, input: bytes | None = None) -> tuple[int, str, str]:
        r = self.ssh(cmd, input=input)
        out, err = r.stdout.decode(), r.stderr.decode()
        if ok:
            assert r.returncode == 0, f"{cmd}: rc {r.returncode}\n{out}\n{err}\n{self.host.log()[-2000:]}"
        return r.returncode, out, err

    def mc(self, *args: str) -> Any:
        """``mt-container ARGS --json``, parsed."""
        import shlex

        _, out, _ = self.run(shlex.join(["mt-container", *args, "--json"]))
        return json.loads(out)

    def wait_state(self, name: str, states: set[str], timeout: float = 30) -> dict[str, Any]:
        deadline = time.time() + timeout
        while True:
            v = self.mc("show", name)
            if v["state"] in states:
                return v
            if time.time() > deadline:
                raise AssertionError(f"{name} stayed {v['state']}: {v}")
            time.sleep(0.3)

    def rm(self, *names: str) -> None:
        self.ssh("mt-container", "rm", *names)


def reap_tenant(uid: int) -> None:
    """Every process of the tenant and of its subordinate IDs (container users)."""
    lo, hi = subid_range(uid)
    ps = subprocess.run(["ps", "-eo", "pid=,uid="], capture_output=True, text=True, check=False).stdout
    for line in ps.splitlines():
        pid, puid = (int(x) for x in line.split())
        if puid == uid or lo <= puid <= hi:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
    shutil.rmtree(f"/run/user/{uid}", ignore_errors=True)


def start_workspace_host(
    config: dict[str, Any] | None = None, user: str = "wendy", network: Any = None
) -> WorkspaceHost:
    """A host for workspace tests; in ``network`` (a ``Network``) if given."""
    from mtgpu_testing import Host

    base = {
        "TENANT_UID_RANGE": UID_RANGE,
        "SIMULATED_GPUS": [{"type": "rtx4090", "count": 1, "vram": "24G"}],
        "SIMULATED_CPUS": 32,
    }
    h = Host({**base, **(config or {})})
    if network is not None:
        network.add(h)
    try:
        h.start()
        r = h.in_ns(
            [
                str(Path(os.sys.executable).parent / "mtgpu-setup"),
                "podman-check",
                "--fix",
                "--config",
                str(h.config_path),
            ]
        )
        assert r.returncode == 0, f"podman-check --fix:\n{r.stdout}\n{r.stderr}"
        key = h.add_user(user)
        wh = WorkspaceHost(h, user, key)
        rootfs = make_rootfs(h.dir)
        tar = subprocess.run(["tar", "-C", str(rootfs), "-c", "."], capture_output=True, check=True).stdout
        wh.run(f"podman import - {IMAGE}", input=tar)
        wh.podman_check = r.stdout  # type: ignore[attr-defined]
        return wh
    except BaseException:
        stop_workspace_host(h)
        raise


def stop_workspace_host(h: Any) -> None:
    uids = h.tenant_uids()
    h.stop()
    for uid in uids:
        reap_tenant(uid)
    h.cleanup()


def get_through_ssh_L(wh: WorkspaceHost, host_port: int, timeout: float = 20) -> bytes:
    """``GET /`` of ``127.0.0.1:host_port`` on the host, through the tenant's own
    ``ssh -L`` from the test's side (as a laptop reaches a workspace's port)."""
    import urllib.request

    from mtgpu_testing import free_port

    local = free_port()
    ssh = subprocess.Popen(
        wh.host.ssh_argv(wh.user, wh.key, opts=["-N", "-L", f"{local}:127.0.0.1:{host_port}"]),
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + timeout
        while True:
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{local}/", timeout=2).read()
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        ssh.kill()
        ssh.wait()

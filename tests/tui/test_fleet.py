"""The view-model and actions of remotegpu-cli, in process, against a real mtgpu-server
over real SSH (asyncssh reading the laptop's ~/.ssh/config, key and known_hosts)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import subprocess
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from mtgpu_testing import wait_for

from mtgpu.errors import ApiError, MtgpuError
from mtgpu.tui.fleet import Fleet, ServerState
from mtgpu.tui.sources import load_server_list

pytestmark = [pytest.mark.root, pytest.mark.podman]


def make_fleet() -> Fleet:
    return Fleet(load_server_list(), timeout=1.0, interval=0.3)


async def until(check: Callable[[], Any], timeout: float = 60, what: str = "") -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        v = check()
        if v:
            return v
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        await asyncio.sleep(0.1)


async def started() -> tuple[Fleet, ServerState]:
    f = make_fleet()
    f.start()
    st = await until(lambda: f.states["gpu"] if f.states["gpu"].status == "up" else None, what="gpu up")
    return f, st


def job_state(f: Fleet, jid: str) -> str | None:
    return next((j["state"] for _, j in f.jobs() if j["job_id"] == jid), None)


def test_one_pass_finds_the_server_its_gpus_and_the_dead_one(at_home) -> None:
    f = make_fleet()
    states = asyncio.run(f.once())
    by = {s.name: s for s in states}
    # The Host pattern is no server; `elsewhere` never answered as MTGPU, so it is hidden.
    assert set(by) == {"dead", "gpu"}
    assert f.states["elsewhere"].hidden
    gpu = by["gpu"]
    assert (gpu.status, gpu.user, gpu.server, gpu.target.source) == ("up", "lena", "testhost", "ssh_config")
    node = gpu.node()
    assert [(g["index"], g["type"], g["vram_total"]) for g in node["gpus"]] == [
        (0, "rtx4090", 24 << 30),
        (1, "rtx4090", 24 << 30),
    ]
    assert node["cpus"] > 0 and node["ram_total"] > 0
    # A standalone server is the only member of its "cluster", reached where we are.
    assert gpu.members == [{"name": "testhost", "address": f"127.0.0.1:{at_home.host.host.port}"}]
    assert gpu.workspaces == []
    assert by["dead"].status == "unreachable"
    assert by["dead"].reason == "no answer within 1 s"
    assert by["dead"].to_dict()["source"] == "list"


def test_submit_follow_the_log_and_cancel(at_home, tmp_path) -> None:
    job = tmp_path / "hello.sh"
    job.write_text(
        "#!/bin/sh\n#MTGPU gpus=nvidia:1 vram=2G name=hello\necho hello-from-$MTGPU_JOB_ID\nsleep 60\n"
    )

    async def go() -> None:
        f, st = await started()
        try:
            with pytest.raises(MtgpuError, match="cannot read the job file"):
                await f.submit_job(st, tmp_path / "missing.sh")
            bad = tmp_path / "big.sh"
            bad.write_text("#MTGPU gpus=nvidia:9\ntrue\n")
            with pytest.raises(ApiError) as exc:
                await f.submit_job(st, bad)
            assert exc.value.code == "rejected"
            jid = (await f.submit_job(st, job))["job_id"]
            await until(lambda: job_state(f, jid) == "RUNNING", what="RUNNING")
            [(_, view)] = [x for x in f.jobs() if x[1]["job_id"] == jid]
            assert view["name"] == "hello" and view["nodes"] == ["testhost"]
            gpu_jobs = [g["jobs"] for g in st.node()["gpus"]]
            await until(
                lambda: any(jid in g["jobs"] for g in st.node()["gpus"]), what=f"job on a GPU: {gpu_jobs}"
            )
            out = ""
            async with contextlib.aclosing(f.follow_log(st, jid)) as chunks:
                async for chunk in chunks:
                    out += chunk
                    if f"hello-from-{jid}" in out:
                        break
            r = await f.cancel_job(st, jid)
            assert jid in r["cancelled"] + r["stopping"]
            await until(lambda: job_state(f, jid) == "CANCELLED", what="CANCELLED")
        finally:
            await f.stop()

    asyncio.run(go())


def test_workspace_create_forward_stop_start_remove(at_home) -> None:
    w = at_home.host
    w.run("mkdir -p www && echo served-through-remotegpu > www/index.html")

    def ws(f: Fleet, name: str) -> dict[str, Any] | None:
        return next((x for _, x in f.workspaces() if x["name"] == name), None)

    async def go() -> None:
        f, st = await started()
        try:
            r = await f.create_workspace(st, "web", "busybox", [8080])
            assert r["state"] == "RUNNING", r
            await until(lambda: (ws(f, "web") or {}).get("state") == "RUNNING", what="listed")
            assert [p["container_port"] for p in ws(f, "web")["ports"]] == [8080]
            await asyncio.to_thread(
                w.run,
                shlex.join(
                    ["mt-container", "shell", "web", "--", "httpd", "-p", "8080", "-h", str(w.home / "www")]
                ),
            )
            [(cport, local)] = await f.forward_ports(st, "web")
            assert cport == 8080

            def fetch() -> bytes:
                return urllib.request.urlopen(f"http://127.0.0.1:{local}/", timeout=5).read()

            assert await asyncio.to_thread(fetch) == b"served-through-remotegpu\n"
            await f.workspace_action(st, "stop", "web")
            await until(lambda: (ws(f, "web") or {}).get("state") == "STOPPED", what="STOPPED")
            await f.workspace_action(st, "start", "web")
            await until(lambda: (ws(f, "web") or {}).get("state") == "RUNNING", what="again")
            await f.workspace_action(st, "rm", "web")
            await until(lambda: ws(f, "web") is None, what="removed")
        finally:
            await f.stop()
            w.rm("web")

    asyncio.run(go())


def test_servers_added_from_the_ui_are_kept_in_servers_yaml(at_home) -> None:
    from mtgpu.tui.sources import parse_destination, servers_file

    before = servers_file().read_text()

    async def go() -> None:
        f = make_fleet()
        st = f.add_server(parse_destination(f"lena@127.0.0.1:{at_home.host.host.port}", name="direct"))
        assert "name: direct" in servers_file().read_text()
        # Reached without ~/.ssh/config's help: the key comes from the agent or the
        # defaults, and there is neither here, so the reason says what to do.
        await until(lambda: st.status == "unreachable", what="refused")
        assert "key not accepted" in st.reason or "host key" in st.reason, st.reason
        await f.remove_server(st)
        assert "direct" not in f.states
        await f.stop()

    try:
        asyncio.run(go())
        assert load_server_list().targets[-1].name == "dead"
    finally:
        servers_file().write_text(before)


def test_quitting_waits_for_no_server(at_home) -> None:
    """Quitting drops every connection and ends every refresh at once, even while a
    server is still being connected to (600 s allowed) and when a refresh was asked for
    at that moment: such a wake-up used to swallow the cancel (asyncio.wait_for before
    3.12) and hold quitting up for the retry back-off."""

    async def once(turns: int) -> None:
        f = Fleet(load_server_list(), timeout=600.0, interval=600.0)
        f.start()
        await until(lambda: f.states["gpu"].status == "up", what="gpu up")
        assert f.states["dead"].status == "connecting"
        tasks = [t for t in f._tasks.values() if not t.done()]
        f.refresh_now()
        for _ in range(turns):
            await asyncio.sleep(0)
        f.abort()
        assert not any(link.up for link in f.links.values())
        for _ in range(50):  # loop turns, not time: nothing may wait on a timer or a server
            if all(t.done() for t in tasks):
                break
            await asyncio.sleep(0)
        assert all(t.done() for t in tasks), [t for t in tasks if not t.done()]
        await f.stop()

    for turns in range(5):
        asyncio.run(once(turns))


def test_a_host_whose_key_is_unknown_is_listed_with_how_to_trust_it(
    laptop, tmp_path, monkeypatch, capsys
) -> None:
    """A ~/.ssh/config host whose key is not in known_hosts yet is shown (not hidden as
    "not MTGPU") with the ssh command that trusts it; `servers` exits 1 while no server
    answers, and 0 once the key is trusted the way the message says."""
    from mtgpu.tui.main import main

    home = tmp_path / "home"
    ssh = home / ".ssh"
    ssh.mkdir(parents=True, mode=0o700)
    cfg = ssh / "config"
    other = ssh / "known_hosts_other"
    other.write_text(
        "example.invalid ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHbIn0Y+kBHo0MjI9SgFxHsGkP8i5Km1/Eh2nDm9Uu1K\n"
    )
    # `fresh`: its known_hosts file does not exist yet; `stale`: it does, without this host.
    cfg.write_text(
        "".join(
            f"Host {name}\n  HostName 127.0.0.1\n  Port {laptop.host.host.port}\n  User lena\n"
            f"  IdentityFile {laptop.host.key}\n  IdentitiesOnly yes\n  UserKnownHostsFile {kh}\n"
            for name, kh in (("fresh", ssh / "known_hosts"), ("stale", other))
        )
    )
    for k in list(os.environ):
        if k.startswith(("XDG_", "REMOTEGPU")) or k == "SSH_AUTH_SOCK":
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(home))

    states = asyncio.run(Fleet(load_server_list(), timeout=5.0).once())
    assert [s.name for s in states] == ["fresh", "stale"]
    for st in states:
        assert (st.status, st.hidden) == ("unreachable", False)
        assert st.reason.startswith("host key unknown") and f"`ssh {st.name}`" in st.reason, st.reason
    capsys.readouterr()
    assert main(["--timeout", "5", "servers"]) == 1
    out, err = capsys.readouterr()
    assert re.search(r"fresh\s+unreachable\s+host key unknown", out), out
    assert re.search(r"stale\s+unreachable\s+host key unknown", out), out
    assert "no server answered" in err

    # What `ssh fresh` does once the user answers yes (-F: ssh reads the account's own
    # home, not $HOME, for its config).
    r = subprocess.run(
        [
            "ssh",
            "-F",
            str(cfg),
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=accept-new",
            "fresh",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert main(["--timeout", "5", "servers"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"fresh\s+up\s", out) and re.search(r"stale\s+unreachable\s+host key unknown", out), out


def test_the_jobs_table_shows_elapsed_and_time_left(at_home, capsys) -> None:
    from mtgpu.tui.main import main

    _, out, _ = at_home.host.run(
        "mt-job submit -", input=b"#!/bin/sh\n#MTGPU name=timed time=45\nsleep 300\n"
    )
    jid = re.search(r"(\d+)", out)[1]

    def row() -> re.Match[str] | None:
        capsys.readouterr()
        main(["--timeout", "2", "jobs"])
        return re.search(
            rf"^{jid}\s+timed\s+RUNNING\s+gpu\s+testhost\s+(\S+)\s+(\S+)", capsys.readouterr().out, re.M
        )

    try:
        m = wait_for(row, what=f"job {jid} running in `remotegpu-cli jobs`")
        assert re.fullmatch(r"\d+s|\d+m\d\ds", m[1]), m[0]
        assert re.fullmatch(r"4[45]m\d\ds", m[2]), m[0]  # of the 45 minutes it may run
        main(["--timeout", "2", "jobs"])
        head = capsys.readouterr().out.splitlines()[0]
        assert head.split() == ["JOBID", "NAME", "STATE", "SERVER", "NODES", "ELAPSED", "LEFT", "REASON"]
    finally:
        at_home.host.run(f"mt-job cancel {jid}", ok=False)

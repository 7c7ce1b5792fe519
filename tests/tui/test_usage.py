"""remotegpu-cli shows each tenant their own usage this month, read with the call
``mt-job usage`` makes (``job.usage``), against the real server of the remotegpu-cli
tests: a tenant who ran a GPU job sees it, a second tenant sees only their own CPU job,
and neither can ask the server for the other's through that call. A server older than
usage reporting shows why there is none, and everything else still works."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from mtgpu_testing import wait_for

from mtgpu.errors import ApiError
from mtgpu.tui.fleet import UP, Fleet, ServerState
from mtgpu.tui.main import main
from mtgpu.tui.sources import ServerList, Target
from mtgpu.tui.view import FINAL, month_usage

pytestmark = [pytest.mark.root, pytest.mark.podman]


def run_job(run, script: str) -> dict:
    """Submit ``script`` with ``run`` (a tenant's shell over ssh) and wait for its end."""
    _, out, _ = run("mt-job submit --parsable -", input=script.encode())
    jid = out.strip()
    return wait_for(
        lambda: (j := json.loads(run(f"mt-job show {jid} --json")[1]))["state"] in FINAL and j,
        timeout=120,
        what=f"job {jid} to end",
    )


def read(target: Target) -> tuple[ServerState, dict]:
    """One pass of remotegpu-cli's Fleet over ``target``, and the raw ``job.usage``
    answer by user, asked by the same tenant on the same connection."""

    async def go() -> tuple[ServerState, dict]:
        f = Fleet(ServerList(targets=(target,), ssh_config=False), timeout=30.0)
        st = f.states[target.name]
        try:
            await f._connect(st)
            await f._refresh(st)
            await f.read_usage(st)
            by_user = await f.links[st.name].call("job.usage", by=["user"])
        finally:
            await f.stop()
        return st, by_user

    return asyncio.run(go())


def test_a_tenant_sees_their_own_usage_and_a_second_tenant_only_theirs(at_home, capsys) -> None:
    wh = at_home.host
    lena_job = run_job(wh.run, "#!/bin/sh\n#MTGPU gpus=1 cpus=1 name=usage-gpu\nsleep 1\n")
    assert lena_job["state"] == "COMPLETED", lena_job
    uma_key = wh.host.add_user("uma")

    def uma_run(cmd: str, input: bytes | None = None) -> tuple[int, str, str]:
        r = wh.host.ssh("uma", uma_key, cmd, input=input, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.returncode, r.stdout.decode(), r.stderr.decode()

    uma_job = run_job(uma_run, "#!/bin/sh\n#MTGPU cpus=1 name=usage-cpu\nsleep 1\n")
    assert uma_job["state"] == "COMPLETED", uma_job
    lena_t = Target("gpu", "gpu")  # the laptop's ~/.ssh/config Host
    uma_t = Target("uma", "127.0.0.1", wh.host.port, "uma", str(uma_key))

    def printed() -> dict:
        return month_usage(json.loads(wh.run("mt-job usage --by gpu_type --json")[1]))

    # What `mt-job usage` prints there, from the same call: the same numbers (read
    # before and after, as a job of an earlier test may end meanwhile).
    before = printed()
    lena, lena_by_user = read(lena_t)
    assert lena.status == UP and lena.usage_error is None, lena.usage_error
    assert lena.usage in (before, printed())
    assert lena.usage is not None and lena.usage["jobs"] >= 1
    assert lena.usage["gpu_hours"].get("rtx4090", 0) > 0, lena.usage
    assert [r["user"] for r in lena_by_user["rows"]] == ["lena"]

    uma, uma_by_user = read(uma_t)
    assert uma.status == UP and uma.usage is not None, uma.usage_error
    # Her one CPU job: none of lena's jobs or GPU-hours.
    assert (uma.usage["jobs"], uma.usage["gpu_hours"]) == (1, {}), uma.usage
    assert uma.usage["cpu_hours"] > 0
    assert [r["user"] for r in uma_by_user["rows"]] == ["uma"]
    assert uma_by_user["total"]["jobs"] == 1

    # `remotegpu-cli servers` prints each server's line of it (lena's laptop).
    capsys.readouterr()
    assert main(["--timeout", "10", "servers"]) == 0
    printed = capsys.readouterr().out
    assert re.search(
        r"^gpu: usage \d{4}-\d\d: \d+ jobs?  GPU-hours rtx4090 [\d.<]+  CPU-hours ", printed, re.M
    )
    assert "dead: usage" not in printed


def test_a_tenant_cannot_ask_for_another_tenants_usage_through_that_call(at_home) -> None:
    """On remotegpu-cli's own connection, as uma: another tenant by name, everyone, and
    the cluster's sums by member are refused, and the refusals name no one else."""
    wh = at_home.host
    uma_key = wh.host.add_user("umb")
    target = Target("umb", "127.0.0.1", wh.host.port, "umb", str(uma_key))

    async def go() -> list[ApiError]:
        f = Fleet(ServerList(targets=(target,), ssh_config=False), timeout=30.0)
        st = f.states["umb"]
        refusals = []
        try:
            await f._connect(st)
            link = f.links["umb"]
            for args in (
                {"by": ["gpu_type"], "user": "lena"},
                {"by": ["gpu_type"], "all": True},
                {"by": ["user"], "user": "lena", "all": True},
                {"by": ["member"]},
            ):
                with pytest.raises(ApiError) as exc:
                    await link.call("job.usage", **args)
                refusals.append(exc.value)
            own = await link.call("job.usage", by=["user", "gpu_type", "day"])
            assert all(r["user"] == "umb" for r in own["rows"]) and own["total"]["jobs"] == 0, own
        finally:
            await f.stop()
        return refusals

    refusals = asyncio.run(go())
    assert [e.code for e in refusals] == ["forbidden", "forbidden", "forbidden", "bad_request"]
    assert all("only your own usage" in str(e) for e in refusals[:3])
    assert "usage by member is the whole cluster's" in str(refusals[3])
    assert not [e for e in refusals if "lena" in str(e)]


def test_a_server_older_than_usage_reporting_says_why_and_works_otherwise(at_home, older, capsys) -> None:
    wh = at_home.host
    target = Target("old", "127.0.0.1", older.port, wh.user, str(wh.key))

    async def go() -> list[ServerState]:
        return await Fleet(ServerList(targets=(target,), ssh_config=False), timeout=30.0).once()

    (st,) = asyncio.run(go())
    assert (st.status, st.server, st.usage) == (UP, "oldhost", None), st.reason
    assert st.usage_error == "this server runs an MTGPU older than usage reporting"
    assert st.to_dict()["usage_error"] == st.usage_error and st.nodes[0]["name"] == "oldhost"

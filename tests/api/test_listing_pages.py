"""``job.list`` in pages: ``limit`` (LIST_LIMIT unless given, LIST_LIMIT_MAX at most)
and ``cursor``; the answer names ``next_cursor`` while more remain, and every client
(`mt-job list`, its C fast path, squeue, the remotegpu link) follows it, so a tenant
with 2,500 jobs still sees each of them once. Against a real daemon."""

from __future__ import annotations

import asyncio
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from mtgpu_testing import REPO, Host
from security_testing import Tenant, api_socket, call

from mtgpu.api.jobs import LIST_LIMIT, LIST_LIMIT_MAX
from mtgpu.tui.link import PageItems, ServerLink

pytestmark = pytest.mark.root

TASKS = 2500


@pytest.fixture(scope="module")
def listed():
    h = Host({"SIMULATED_CPUS": 1, "USER_SUBMIT_BURST": 60})
    h.start()
    try:
        people = {}
        for name in ("paula", "quinn"):
            key = h.add_user(name)
            assert h.ssh(name, key, "true").returncode == 0
            pw = h.passwd(name)
            people[name] = Tenant(name, int(pw[2]), key, pw[5])
        script = f"#!/bin/sh\n#SBATCH --array=0-{TASKS - 1}\n#SBATCH --hold\ntrue\n"
        with api_socket(h.run_dir, people["paula"].uid) as s:
            r = call(s, "job.submit", {"script": script})
        assert r["ok"] and r["result"]["tasks"] == TASKS, r
        with api_socket(h.run_dir, people["quinn"].uid) as s:  # not paula's: never listed to her
            other = call(s, "job.submit", {"script": "#!/bin/sh\n#SBATCH --hold\ntrue\n"})
        assert other["ok"], other
        yield {"host": h, "array": str(r["result"]["job_id"]), **people}
    finally:
        h.cleanup()


def _pages(h: Host, tenant: Tenant, **args: object) -> list[dict]:
    answers = []
    with api_socket(h.run_dir, tenant.uid) as s:
        cursor = None
        while True:
            a = call(s, "job.list", {**args, **({"cursor": cursor} if cursor else {})})
            assert a["ok"], a
            answers.append(a)
            cursor = a.get("next_cursor")
            if not cursor:
                return answers


def test_pages_of_1000_give_every_job_exactly_once(listed):
    h, paula = listed["host"], listed["paula"]
    t = time.monotonic()
    answers = _pages(h, paula, limit=1000)
    took = time.monotonic() - t
    print(f"{TASKS} jobs in {len(answers)} pages of 1000: {took:.2f} s")
    assert [len(a["result"]) for a in answers] == [1000, 1000, 500]
    assert all(isinstance(a["next_cursor"], str) for a in answers[:-1]) and "next_cursor" not in answers[-1]
    ids = [j["job_id"] for a in answers for j in a["result"]]
    assert len(ids) == len(set(ids)) == TASKS
    assert set(ids) == {f"{listed['array']}_{i}" for i in range(TASKS)}  # quinn's is not hers
    assert ids == [f"{listed['array']}_{i}" for i in range(TASKS)]  # in the listing's order


def test_without_limit_a_page_is_the_default_and_limits_are_checked(listed):
    h, paula = listed["host"], listed["paula"]
    with api_socket(h.run_dir, paula.uid) as s:
        plain = call(s, "job.list", {})
        biggest = call(s, "job.list", {"limit": LIST_LIMIT_MAX})
        over = call(s, "job.list", {"limit": LIST_LIMIT_MAX + 1})
        zero = call(s, "job.list", {"limit": 0})
        forged = call(s, "job.list", {"cursor": "x" * 100_000})
        bad_time = call(s, "job.list", {"cursor": "nan/1"})
    # An older client (no limit) reads the first page as it read the whole list.
    assert isinstance(plain["result"], list) and len(plain["result"]) == LIST_LIMIT, len(plain["result"])
    assert plain["next_cursor"]
    assert len(biggest["result"]) == TASKS and "next_cursor" not in biggest
    for a in (over, zero):
        assert a["code"] == "bad_request" and str(LIST_LIMIT_MAX) in a["error"], a
    for a in (forged, bad_time):
        assert a["code"] == "bad_request" and "next_cursor" in a["error"], a
        assert len(a["error"]) < 200 and "xxxx" not in a["error"]


def _tool(h: Host, tenant: Tenant, entry: str, *argv: str) -> subprocess.CompletedProcess[bytes]:
    """``entry`` (``module:function``) of this checkout run as ``tenant`` in their SSH
    session: the tools as this tree has them, whichever copy the virtualenv holds."""
    module, _, fn = entry.partition(":")
    code = f"import sys; from {module} import {fn} as m; sys.argv[1:] = {list(argv)!r}; sys.exit(m())"
    command = f"cd {REPO} && exec {sys.executable} -c {shlex.quote(code)}"  # the login shell reads it
    return h.ssh(tenant.name, tenant.key, command, timeout=120)


def test_mt_job_list_and_squeue_still_show_every_job(listed):
    h, paula = listed["host"], listed["paula"]
    want = {f"{listed['array']}_{i}" for i in range(TASKS)}
    r = _tool(h, paula, "mtgpu.cli.job:main", "list", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    got = [j["job_id"] for j in json.loads(r.stdout)]
    assert len(got) == TASKS and set(got) == want
    r = _tool(h, paula, "mtgpu.cli.slurm.commands:squeue_main", "-h", "-o", "%i")
    assert r.returncode == 0, r.stderr[-2000:]
    # squeue folds a pending array into one line: all of its tasks, not the first page's.
    assert r.stdout.decode().split() == [f"{listed['array']}_[0-{TASKS - 1}]"], r.stdout[:200]


def test_the_c_fast_path_hands_a_listing_of_several_pages_to_python(listed, tmp_path_factory):
    """`mt-job list --json` in C prints a one-page listing itself and hands one of
    several pages to the Python mt-job (which follows the cursor)."""
    h, paula, quinn = listed["host"], listed["paula"], listed["quinn"]
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc
    d = Path(tempfile.mkdtemp(prefix="mtgpu-test-pages-", dir="/var/lib"))
    try:
        d.chmod(0o755)
        python = d / "python-mt-job"
        python.write_text('#!/bin/sh\necho handed to python: "$*"\n')
        python.chmod(0o755)
        exe = d / "mt-job-fast"
        src = REPO / "mtgpu" / "cli" / "fastjob.c"
        subprocess.run([cc, "-O2", "-o", str(exe), str(src), f'-DMTGPU_PY_MTJOB="{python}"'], check=True)
        many = h.ssh(paula.name, paula.key, str(exe), "list", "--json", timeout=60)
        one = h.ssh(quinn.name, quinn.key, str(exe), "list", "--json", timeout=60)
    finally:
        shutil.rmtree(d)
    assert many.returncode == 0 and many.stdout.strip() == b"handed to python: list --json", many
    assert one.returncode == 0 and len(json.loads(one.stdout)) == 1, one


def test_the_remotegpu_link_follows_the_cursor():
    """remotegpu's link (the mtgpu-api channel) reads every page; a plain call gives
    the first page with its cursor."""
    from mtgpu.tui.link import ApiChannel

    jobs = [{"job_id": str(i)} for i in range(2500)]
    sent: list[dict] = []

    async def go() -> tuple[list, object]:
        reader = asyncio.StreamReader()

        class Writer:
            def write(self, data: bytes) -> None:
                req = json.loads(data)
                sent.append(req["args"])
                start = int(req["args"].get("cursor") or 0)
                answer = {"id": req["id"], "ok": True, "result": jobs[start : start + 1000]}
                if start + 1000 < len(jobs):
                    answer["next_cursor"] = str(start + 1000)
                reader.feed_data(json.dumps(answer).encode() + b"\n")

            def close(self) -> None:
                reader.feed_eof()

        link = ServerLink.__new__(ServerLink)
        link.api, link.timeout = ApiChannel(Writer(), reader), 10.0  # type: ignore[arg-type]
        try:
            first = await link.call("job.list", all=True)
            return await link.call_all("job.list", all=True), first
        finally:
            link.api.close()

    got, first = asyncio.run(go())
    assert isinstance(first, PageItems) and len(first) == 1000 and first.next_cursor == "1000"
    assert got == jobs
    assert sent[1:] == [{"all": True}, {"all": True, "cursor": "1000"}, {"all": True, "cursor": "2000"}]

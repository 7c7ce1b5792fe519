"""The API's job views are made from the typed records (mtgpu.state.codec.JobRecord)
and say what they said when they were made from the dicts: ``views.json`` beside the
format-1 state is what the API of the release before gave for each of its jobs."""

from __future__ import annotations

import json
import shutil

import pytest
from state_testing import FIXTURE, load_jobs

from mtgpu.api.jobs import JobViews
from mtgpu.schedd.jobenv import JobUser
from mtgpu.schedd.jobtable import JobTable

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> JobTable:
    d = tmp_path_factory.mktemp("state") / "snapshot"
    shutil.copytree(FIXTURE / "snapshot", d)
    return load_jobs(d)


def _user(j: dict) -> JobUser:
    return JobUser(j["user"], j["uid"], j["uid"], "/home/fixture")


def test_views_are_what_the_dict_views_were(table: JobTable) -> None:
    want = json.loads((FIXTURE / "views.json").read_text())
    views = JobViews(table)
    got = {jid: views.view(j, None, _user(j)) for jid, j in sorted(table.jobs.items())}
    assert json.loads(json.dumps(got)) == want
    assert all(type(v["state"]) is str for v in got.values())
    assert got["2"]["exit"] == "3:0" and got["3"]["gpus"][0]["uuid"] == "SIM-testhost-0"


def test_views_are_kept_per_instance_and_bounded(table: JobTable) -> None:
    a, b = JobViews(table, limit=3), JobViews(table, limit=100)
    jobs = sorted(table.jobs.items())
    for _, j in jobs:
        a.view(j, None, _user(j))
    assert len(a) == 3 and len(b) == 0
    # A view handed out is the caller's own: changing it changes no later one.
    jid, j = jobs[-1]
    first = a.view(j, None, _user(j))
    first["state"] = "changed"
    assert a.view(j, None, _user(j))["state"] == j["state"]
    # A changed record (replaced whole, as the table does) gets a new view.
    table._put({**j, "reason": "new reason"})
    assert a.view(table.jobs[jid], None, _user(j))["reason"] == "new reason"
    table._put(j)

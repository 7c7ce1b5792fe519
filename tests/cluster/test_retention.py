"""TENANT_RETENTION_DAYS across members: the lock and the removal reach every member."""

from __future__ import annotations

import json

import pytest
from cluster_harness import wait_for

pytestmark = pytest.mark.root

DAY = 86400
RETENTION = {"TENANT_RETENTION_DAYS": 30, "TENANT_RETENTION_GRACE": "7d"}


def shadow_expire(host, name):
    for line in (host.etc / "shadow").read_text().splitlines():
        f = line.split(":")
        if f[0] == name:
            return f[7]
    return None


def test_an_inactive_tenant_is_locked_then_removed_on_every_member(cluster, tmp_path):
    offset = tmp_path / "clock-offset"
    offset.write_text("0")
    tmp_path.chmod(0o755)
    c = cluster([("m1", 0, RETENTION), ("m2", 0, RETENTION)], env={"MTGPU_CLOCK_OFFSET_FILE": str(offset)})
    m1, m2 = c.hosts
    key = m1.add_user("gone")
    for h in c.hosts:  # the first login on each member makes the account there
        wait_for(
            lambda h=h: h.ssh("gone", key, "echo hi > ~/notes").returncode == 0, what="login on every member"
        )

    offset.write_text(str(31 * DAY))
    r = json.loads(m2.admin("retention", "--json").stdout)  # relayed to the scheduler
    assert [(s["user"], s["done"]) for s in r["steps"]] == [("gone", "locked")]
    for h in c.hosts:
        assert shadow_expire(h, "gone") == "1"
        assert h.ssh("gone", key, "true").returncode != 0

    offset.write_text(str(39 * DAY))
    r = json.loads(m1.admin("retention", "--json").stdout)
    assert [(s["user"], s["done"]) for s in r["steps"]] == [("gone", "removed")]
    for h in c.hosts:
        wait_for(
            lambda h=h: (
                "gone" not in {u["name"] for u in json.loads(h.admin("user", "list", "--json").stdout)}
            ),
            what="the registry everywhere",
        )
        assert h.passwd("gone") is None and not (h.homes / "gone").exists()
        assert len(list((h.state_dir / "retired-homes").glob("gone-*.tar.gz"))) == 1
        log = (h.state_dir / "retention.log").read_text()
        assert '"action": "remove"' in log and f'"member": "{h.config["SERVER_NAME"]}"' in log

"""A member's API socket answers while the member forms the cluster (its peers need
it) but before its job operations are registered: those are answered "starting",
never "unknown_op", and the tools retry until the member serves them."""

from __future__ import annotations

import threading
import time

import pytest
from cluster_harness import _config
from mtgpu_testing import Host, Network

pytestmark = pytest.mark.root


def test_job_operations_answer_starting_until_registered_never_unknown():
    net = Network()
    hosts = [net.add(Host(_config(0), name=n)) for n in ("s1", "s2")]
    hosts[1].config["TENANT_UID_RANGE"] = hosts[0].config["TENANT_UID_RANGE"]
    for h in hosts:
        h.config["CLUSTER_PEERS"] = [f"{o.address}:{o.port}" for o in hosts if o is not h]
        h.write_config()
    codes: list[str] = []
    done = threading.Event()

    def poll(h: Host) -> None:
        # From the moment the socket answers until the member says it has started.
        while not done.is_set():
            if (h.run_dir / "api.sock").exists():
                try:
                    r = h.api("job.list", timeout=5)
                except (OSError, ValueError):
                    time.sleep(0.02)
                    continue
                codes.append("ok" if r["ok"] else r["code"])
                if r["ok"]:
                    return
            time.sleep(0.02)

    pollers = [threading.Thread(target=poll, args=(h,)) for h in hosts]
    try:
        for p in pollers:
            p.start()
        starts = [threading.Thread(target=h.start, kwargs={"timeout": 120}) for h in hosts]
        for t in starts:
            t.start()
        for t in starts:
            t.join()
        for p in pollers:
            p.join(60)
        assert "unknown_op" not in codes, codes
        assert codes.count("ok") == 2, codes
        # Each member's tools (which retry "starting") list jobs once it serves them.
        for h in hosts:
            r = h.admin("jobs", "--json")
            assert r.stdout.strip() == "[]"
    finally:
        done.set()
        for h in hosts:
            h.cleanup()
        net.close()

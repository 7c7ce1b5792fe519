"""Clusters of real members for the tests: each in a network namespace of its own."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from mtgpu_testing import Host, Network, wait_for

KEY = "s3cret-cluster-key-0123456789"
#: Where members' directories go: outside /tmp, which each member's tenants get a
#: private copy of, so that members share this machine's filesystem (other members'
#: homes, as storage every member mounts) as the tests model it.
MEMBERS_BASE = "/var/lib/mtgpu-test-members"


def _config(gpus: int, **extra):
    cfg = {
        "CLUSTER_MODE": "cluster",
        "CLUSTER_ID": "lab",
        "CLUSTER_KEY": KEY,
        "SIMULATED_CPUS": 8,
        "USAGE_SAMPLE_INTERVAL": 1,
    }
    if gpus:
        cfg["SIMULATED_GPUS"] = [{"type": "rtx4090", "count": gpus, "vram": "24G"}]
    cfg.update(extra)
    return cfg


def join(c: Cluster, name: str, gpus: int, env: dict[str, str] | None = None, **extra) -> Host:
    """Start one more member that finds the cluster through its first member (``env``
    added to its daemon's environment)."""
    new = c.net.add(Host(_config(gpus, **extra), name=name, base=MEMBERS_BASE))
    new.env.update(env or {})
    new.config["TENANT_UID_RANGE"] = c.hosts[0].config["TENANT_UID_RANGE"]
    new.config["CLUSTER_PEERS"] = [f"{c.hosts[0].address}:{c.hosts[0].port}"]
    new.write_config()
    c.hosts.append(new)  # cleaned up with the others
    new.start(timeout=120)
    return new


def status(host) -> dict:
    r = host.admin("cluster", "status", "--json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else {}


class Cluster:
    def __init__(self, net: Network, hosts: list[Host]) -> None:
        self.net, self.hosts = net, hosts

    def by_name(self, name: str) -> Host:
        return next(h for h in self.hosts if h.config["SERVER_NAME"] == name)

    def scheduler(self, among=None) -> str:
        def agreed():
            names = [status(h).get("scheduler") for h in (among or self.hosts)]
            return names[0] if names[0] and len(set(names)) == 1 else None

        return wait_for(agreed, what="an agreed scheduler")


@pytest.fixture
def cluster(mtjob_client: str) -> Iterator[Callable[..., Cluster]]:
    made: list[tuple[Network, list[Host]]] = []

    def make(
        specs,
        start_order=None,
        stagger=0.0,
        private_homes=False,
        private_dirs=None,
        env=None,
        settled=True,
        member_env=None,
        log_file=False,
    ):
        """Members from (name, GPUs, extra configuration) triples. With
        ``private_homes`` each member sees only its own home directory, as separate
        machines do (the members share this machine's filesystem otherwise);
        ``private_dirs`` maps a member's name to directories it has its own empty
        copy of (``/run/user``, say); ``env`` is added to the daemons' environment,
        and ``member_env`` (a member's name -> variables) to one member's; with
        ``log_file`` the daemons write and rotate their logs themselves (--log-file).
        With ``settled`` False it returns as soon as every daemon runs, before every
        member is in every member's view (the first seconds of a cluster)."""
        net = Network()
        hosts = [net.add(Host(_config(g, **extra), name=name, base=MEMBERS_BASE)) for name, g, extra in specs]
        for h in hosts:
            h.private_dirs = tuple((private_dirs or {}).get(h.config["SERVER_NAME"], ()))
            h.env.update(env or {})  # the daemons' environment, such as a policy clock
            h.env.update((member_env or {}).get(h.config["SERVER_NAME"], {}))
            h.log_file = log_file
        if private_homes:
            for h in hosts:
                h.hidden = tuple(str(o.homes) for o in hosts if o is not h)
        # One configuration for the whole cluster, as the manual says: the same UID range.
        for h in hosts[1:]:
            h.config["TENANT_UID_RANGE"] = hosts[0].config["TENANT_UID_RANGE"]
        for h in hosts:
            h.config["CLUSTER_PEERS"] = [f"{o.address}:{o.port}" for o in hosts if o is not h]
            h.write_config()
        made.append((net, hosts))
        order = start_order or range(len(hosts))
        threads = []
        for i in order:
            t = threading.Thread(target=hosts[i].start, kwargs={"timeout": 120})
            t.start()
            threads.append(t)
            time.sleep(stagger)
        for t in threads:
            t.join()
        c = Cluster(net, hosts)
        if not settled:
            return c
        wait_for(
            lambda: all(len(status(h).get("members", [])) == len(hosts) for h in hosts),
            what="every member in every view",
        )
        return c

    yield make
    keep = os.environ.get("MTGPU_KEEP_LOGS")  # a directory to copy each member's log to
    for net, hosts in made:
        for h in hosts:
            if keep:
                Path(keep).mkdir(parents=True, exist_ok=True)
                shutil.copy(h.log_path, Path(keep) / f"{h.config['SERVER_NAME']}.log")
            h.cleanup()
        net.close()

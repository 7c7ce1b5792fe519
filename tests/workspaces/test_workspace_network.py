"""A workspace's published port with private tenant networks (TENANT_NETWORK: private):
the daemon runs the tenant's podman inside the tenant's network namespace, so the port
is on the tenant's own loopback, reached by the tenant's sessions and ``ssh -L`` as
with shared networks, and by no other tenant."""

from __future__ import annotations

import shlex

import pytest

pytestmark = [pytest.mark.root, pytest.mark.podman]


@pytest.fixture(scope="module")
def private_ws():
    from mtgpu_testing import Network
    from workspace_testing import podman_ready, start_workspace_host, stop_workspace_host

    why = podman_ready()
    if why:
        pytest.skip(why)
    net = Network()
    try:
        wh = start_workspace_host(
            {
                "TENANT_NETWORK": "private",
                "CONTAINERS": {
                    "enabled": True,
                    "port_publishing": "loopback",
                    "templates": {"busybox": {"image": "localhost/mtgpu-test:1", "cpus": 1, "ram": "256M"}},
                },
            },
            network=net,
        )
        try:
            yield wh
        finally:
            stop_workspace_host(wh.host)
    finally:
        net.close()


def test_a_published_port_is_on_the_tenants_own_loopback(private_ws) -> None:
    from workspace_testing import get_through_ssh_L

    w = private_ws
    w.run("mkdir -p www && echo served-from-workspace > www/index.html")
    w.mc("create", "web", "--template", "busybox", "--port", "8080")
    try:
        w.run(
            shlex.join(
                ["mt-container", "shell", "web", "--", "httpd", "-p", "8080", "-h", str(w.home / "www")]
            )
        )
        [p] = w.mc("ports", "web")["ports"]
        url = f"http://127.0.0.1:{p['host_port']}/"
        fetch = (
            'python3 -c "import sys, urllib.request\ntry:\n print(urllib.request.urlopen('
            "sys.argv[1], timeout=10).read().decode())\nexcept Exception as e:\n print('FAILED', e)\" "
        )
        _, out, _ = w.run(fetch + url)
        assert "served-from-workspace" in out, out
        other = w.host.add_user("olga")
        r = w.host.ssh("olga", other, fetch + url)
        assert "served-from-workspace" not in r.stdout.decode() and b"refused" in r.stdout, r
        assert get_through_ssh_L(w, p["host_port"]) == b"served-from-workspace\n"
    finally:
        w.rm("web")

"""Multi-member jobs with private tenant networks (TENANT_NETWORK: private): the ranks
run in their tenant's namespace on every member and meet on the job's own network (a
VXLAN link between the job's members, netns.JobNet); torchrun all-reduces over gloo on
it; another tenant reaches no rank, and cannot send into the job's VXLAN; the link goes
when the job ends."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_harness import wait_for
from test_multinode import ALLREDUCE, login, submit, wait_state

from mtgpu.schedd.netns import JOB_NET_SUBNET, job_net

pytestmark = [pytest.mark.root, pytest.mark.slow]

PRIVATE = {"TENANT_NETWORK": "private"}

RANKS = r"""#!/bin/bash
#MTGPU nodes=2 cpus=1 ram=64M time=5m
if [ "$MTGPU_NODE_RANK" = 0 ]; then
python3 - <<'PY'
import os, socket
home = os.environ["HOME"]
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(os.environ["MASTER_PORT"])))
s.listen(8)
s.settimeout(0.5)
open(f"{home}/rdzv.txt", "w").write(os.environ["MASTER_ADDR"] + " " + os.environ["MASTER_PORT"])
got = []
while not os.path.exists(f"{home}/rdzv.stop"):
    try:
        c, _ = s.accept()
    except socket.timeout:
        continue
    got.append(c.recv(64).decode())
    c.close()
    open(f"{home}/rdzv.got", "w").write(",".join(got))
PY
else
python3 - <<'PY'
import os, socket, time
for _ in range(600):
    try:
        c = socket.create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])), 2)
        c.sendall(b"rank1")
        break
    except OSError:
        time.sleep(0.2)
# As `MASTER_ADDR=$(scontrol show hostnames | head -n 1)` does: rank 0's member's own address.
head = os.environ["HOME"] + "/head.addr"
while not os.path.exists(head):
    time.sleep(0.2)
for _ in range(100):
    try:
        c = socket.create_connection((open(head).read().strip(), int(os.environ["MASTER_PORT"])), 2)
        c.sendall(b"viahost")
        break
    except OSError:
        time.sleep(0.2)
while not os.path.exists(os.environ["HOME"] + "/rdzv.stop"):  # a rank runs as long as the job
    time.sleep(0.2)
PY
fi
"""

CONNECT = (
    'python3 -c "import socket, sys\ntry:\n socket.create_connection((sys.argv[1], '
    "int(sys.argv[2])), 5).sendall(b'intruder')\n print('CONNECTED')\nexcept OSError as e:\n"
    " print('REFUSED', e)\" "
)


def rules(host, table="filter") -> str:
    return subprocess.run(
        ["nsenter", f"--net=/run/netns/{host.netns}", "iptables", "-w", "-t", table, "-S"],
        check=False,
        capture_output=True,
        text=True,
    ).stdout


def tenant_links(host, key) -> str:
    """The links in tara's namespace on ``host`` (her job networks among them), from a
    session of hers."""
    return host.ssh(
        "tara", key, "python3 -c 'import socket; print(sorted(n for _, n in socket.if_nameindex()))'"
    ).stdout.decode()


def net_ns(pid) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return ""


def dropped_vxlan(host, uid: int) -> int:
    """Packets the rule that keeps ``uid`` out of every job network dropped on ``host``."""
    out = subprocess.run(
        ["nsenter", f"--net=/run/netns/{host.netns}", "iptables", "-w", "-L", "FORWARD", "-v", "-x", "-n"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return sum(
        int(line.split()[0])
        for line in out.splitlines()
        if f" {uid} " in line + " " and "udp dpt:4789" in line and "DROP" in line
    )


def test_ranks_run_in_the_tenants_namespace_on_a_job_network_others_cannot_reach(cluster):
    c = cluster([("m1", 0, PRIVATE), ("m2", 0, PRIVATE)])
    entry, key = login(c, "tara")
    _, bob = login(c, "bob")
    jid = submit(entry, key, "tara", RANKS)
    j = wait_state(entry, key, "tara", jid, {"RUNNING"})
    master = c.by_name(j["nodes"][0])
    other = c.by_name(j["nodes"][1])
    home = master.homes / "tara"
    addr, port = wait_for(
        lambda: (home / "rdzv.txt").exists() and (home / "rdzv.txt").read_text().split(),
        what="rank 0 to listen",
    )
    wait_for(
        lambda: (home / "rdzv.got").exists() and "rank1" in (home / "rdzv.got").read_text(),
        what="rank 1 to reach rank 0",
    )
    # A script that takes rank 0's member's own address meets it there too.
    for h in (master, other):
        (h.homes / "tara" / "head.addr").write_text(master.address)
    wait_for(
        lambda: "viahost" in (home / "rdzv.got").read_text(),
        what="rank 1 to reach rank 0 on its member's address",
    )
    # MASTER_ADDR is rank 0's address on the job's network, not a member's.
    assert ipaddress.ip_address(addr) in JOB_NET_SUBNET, addr
    plan = job_net(jid)
    assert addr == plan.address(0)
    tara = master.ssh("tara", key, "id -u").stdout.decode().strip()
    ranks = subprocess.run(["pgrep", "-u", tara, "-f", "^python3 -$"], capture_output=True, text=True)
    ranks_ns = {net_ns(p) for p in ranks.stdout.split()} - {""}
    for h in (master, other):
        links = tenant_links(h, key)
        assert plan.dev in links, (h.config["SERVER_NAME"], links, h.log()[-2000:])
        # The ranks are in tara's namespace on each member, the one her sessions are in.
        session_ns = h.ssh("tara", key, "readlink /proc/self/ns/net").stdout.decode().strip()
        assert session_ns in ranks_ns, (session_ns, ranks_ns)
    assert net_ns("self") not in ranks_ns and len(ranks_ns) == 2, ranks_ns
    # bob, from his sessions on both members, reaches no rank: not on the job's
    # address, not on the members' own.
    for h in (master, other):
        for target in (addr, master.address):
            out = h.ssh("bob", bob, CONNECT + f"{target} {port}").stdout.decode()
            assert "REFUSED" in out and "CONNECTED" not in out, (h.config["SERVER_NAME"], target, out)
    # ... nor sends into the job's VXLAN (which NAT would give a member's address).
    bob_uid = int(master.ssh("bob", bob, "id -u").stdout)
    before = dropped_vxlan(master, bob_uid)
    udp = (
        'python3 -c "import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); '
        "[s.sendto(b'x' * 60, (sys.argv[1], 4789)) for _ in range(5)]\" "
    )
    master.ssh("bob", bob, udp + other.address)
    master.ssh("bob", bob, udp + master.address)
    assert dropped_vxlan(master, bob_uid) >= before + 5, rules(master)
    assert "intruder" not in (home / "rdzv.got").read_text()
    for h in (master, other):
        (h.homes / "tara" / "rdzv.stop").touch()
    j = wait_state(entry, key, "tara", jid, {"COMPLETED", "FAILED", "NODE_FAIL"})
    assert j["state"] == "COMPLETED", j
    wait_for(
        lambda: plan.dev not in tenant_links(master, key) + tenant_links(other, key),
        what="the job's network to go",
    )

    torchrun = Path(sys.executable).parent / "torchrun"
    assert torchrun.exists(), "tests/run.sh installs the CPU build of PyTorch"
    jid = submit(
        entry,
        key,
        "tara",
        "#!/bin/bash\n#MTGPU nodes=2 cpus=2 ram=3G time=5m\n"
        f"cat > ~/allreduce.py <<'PY'\n{ALLREDUCE}PY\n"
        "echo ADDR=$MASTER_ADDR IF=$GLOO_SOCKET_IFNAME\n"
        f"{torchrun} --nnodes=2 --nproc-per-node=1 ~/allreduce.py\n",
    )
    j = wait_state(entry, key, "tara", jid, {"COMPLETED", "FAILED", "NODE_FAIL"}, timeout=240)
    outs = [
        (
            c.by_name(n).homes
            / "tara"
            / ".mtgpu"
            / "jobs"
            / c.by_name(n).config["CLUSTER_ID"]
            / jid
            / "stdout.log"
        ).read_text()
        for n in j["nodes"]
    ]
    assert j["state"] == "COMPLETED", (j, outs)
    assert "rank 0 of 2 sum 3" in outs[0] and "rank 1 of 2 sum 3" in outs[1], outs
    assert f"ADDR={job_net(jid).address(0)} IF={job_net(jid).dev}" in outs[1], outs


def test_a_part_whose_job_network_cannot_be_made_fails_the_job_and_never_runs_in_the_hosts(cluster):
    c = cluster([("m1", 0, PRIVATE), ("m2", 0, PRIVATE)])
    entry, key = login(c, "tara")
    # A VXLAN link of the host's (another tool's) already holds the VNI the next job
    # takes on both members: the kernel refuses a second one.
    nxt = "1"  # the cluster's first job
    for h in c.hosts:
        subprocess.run(
            [
                "ip",
                "-n",
                h.netns,
                "link",
                "add",
                "blockvx",
                "type",
                "vxlan",
                "id",
                str(job_net(nxt).vni),
                "dstport",
                "4789",
            ],
            check=True,
        )
    try:
        jid = submit(
            entry,
            key,
            "tara",
            "#!/bin/bash\n#MTGPU nodes=2 cpus=1 ram=64M time=1m\ntouch ~/ran.$MTGPU_NODE_RANK\n",
        )
        assert jid == nxt, (jid, nxt)
        j = wait_state(entry, key, "tara", jid, {"COMPLETED", "FAILED", "NODE_FAIL", "CANCELLED"})
        assert j["state"] == "FAILED", j
        assert "multi-member job network" in j.get("reason", ""), j
        for h in c.hosts:
            assert not list(h.homes.glob("tara/ran.*")), "a part ran without its job network"
    finally:
        for h in c.hosts:
            subprocess.run(["ip", "-n", h.netns, "link", "del", "blockvx"], check=False)

"""Multi-member jobs with private tenant networks (TENANT_NETWORK: private): the ranks
rendezvous on the rank-0 member's address as before, torchrun all-reduces over gloo,
and the rendezvous port refuses every other tenant's processes on the job's members
while the job runs; the rules go when it ends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cluster_harness import wait_for
from test_multinode import ALLREDUCE, login, submit, wait_state

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


def rules(host) -> str:
    return subprocess.run(
        ["nsenter", f"--net=/run/netns/{host.netns}", "iptables", "-S"],
        check=False,
        capture_output=True,
        text=True,
    ).stdout


def test_the_rendezvous_port_serves_the_jobs_ranks_only_and_torchrun_works(cluster):
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

    def said(h):
        return [ln for ln in h.log().splitlines() if "job 1" in ln or "rendezvous" in ln]

    assert "mtgpu-job" in rules(master), (said(master), said(other))
    assert "mtgpu-job" in rules(other), (said(master), said(other))
    # bob, from his sessions on both members of the job: refused.
    for h in (master, other):
        out = h.ssh("bob", bob, CONNECT + f"{addr} {port}").stdout.decode()
        assert "REFUSED" in out and "CONNECTED" not in out, (
            h.config["SERVER_NAME"],
            out,
            rules(h),
            h.ssh("bob", bob, "ip -o addr; readlink /proc/self/ns/net").stdout,
            h.log()[-3000:],
        )
    assert "intruder" not in (home / "rdzv.got").read_text()
    for h in (master, other):
        (h.homes / "tara" / "rdzv.stop").touch()
    j = wait_state(entry, key, "tara", jid, {"COMPLETED", "FAILED", "NODE_FAIL"})
    assert j["state"] == "COMPLETED", j
    wait_for(lambda: "mtgpu-job" not in rules(master) + rules(other), what="the job's rules to go")

    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        return  # the rendezvous above still showed the ranks reach each other
    jid = submit(
        entry,
        key,
        "tara",
        "#!/bin/bash\n#MTGPU nodes=2 cpus=2 ram=3G time=5m\n"
        f"cat > ~/allreduce.py <<'PY'\n{ALLREDUCE}PY\n"
        f"{torchrun} --nnodes=2 --nproc-per-node=1 ~/allreduce.py\n",
    )
    j = wait_state(entry, key, "tara", jid, {"COMPLETED", "FAILED", "NODE_FAIL"}, timeout=240)
    assert j["state"] == "COMPLETED", j
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
    assert "rank 0 of 2 sum 3" in outs[0] and "rank 1 of 2 sum 3" in outs[1], outs

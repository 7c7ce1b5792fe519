"""Jobs across members: nodes=N all or nothing, one part's failure stops the others,
arrays spread over members, and members that are lost and come back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster_harness import wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]

FAST_LOSS = {"CLUSTER_LOST_AFTER": 8, "CLUSTER_FENCE_GRACE": 1}


def show(host, key, user, jid) -> dict:
    r = host.ssh(user, key, f"mt-job show {jid} --json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def submit(host, key, user, script: str, *flags: str) -> str:
    r = host.ssh(user, key, "mt-job submit --parsable " + " ".join(flags) + " -", input=script.encode())
    assert r.returncode == 0, r.stderr
    return r.stdout.decode().strip()


def wait_state(host, key, user, jid, states, timeout=60) -> dict:
    return wait_for(
        lambda: (lambda j: j if j["state"] in states else None)(show(host, key, user, jid)),
        timeout=timeout,
        what=f"job {jid} in {states}",
    )


def login(c, user):
    entry = c.hosts[0]
    key = entry.add_user(user)
    for h in c.hosts:  # the account exists on every member once its user logged in there
        wait_for(
            lambda h=h: h.ssh(user, key, "true").returncode == 0, what=f"login on {h.config['SERVER_NAME']}"
        )
    return entry, key


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def read_pid(host, user, name) -> int:
    path = host.homes / user / name
    return int(wait_for(lambda: path.exists() and path.read_text().strip(), what=str(path)))


def test_nodes_2_job_runs_on_two_members_with_ranks_and_completes_when_both_do(cluster):
    c = cluster([("m1", 0, {}), ("m2", 0, {}), ("m3", 0, {})])
    entry, key = login(c, "nina")
    jid = submit(
        entry,
        key,
        "nina",
        "#!/bin/bash\n#MTGPU nodes=2 cpus=2 ram=20M\n"
        'echo "$MTGPU_NODE_RANK $MTGPU_NNODES $MTGPU_NODELIST $MASTER_ADDR $SLURM_NODEID" '
        "> ~/rank-$MTGPU_NODE_RANK.txt\n"
        # srun spreads its 3 tasks over both members in blocks: 0 and 1 on rank 0, 2 on rank 1.
        "srun -n 3 sh -c 'echo $SLURM_NODEID $SLURM_LOCALID > ~/task-$SLURM_PROCID.txt'\n"
        "sleep $((1 + 2 * MTGPU_NODE_RANK))\n",
    )
    j = wait_state(entry, key, "nina", jid, {"COMPLETED", "FAILED", "NODE_FAIL"})
    assert j["state"] == "COMPLETED", j
    assert len(set(j["nodes"])) == 2
    seen = {}
    for name in j["nodes"]:
        for f in (c.by_name(name).homes / "nina").glob("rank-*.txt"):
            rank, nn, nodelist, master, slurm_rank = f.read_text().split()
            seen[int(rank)] = name
            assert nn == "2" and nodelist == ",".join(j["nodes"]) and slurm_rank == rank
    assert sorted(seen) == [0, 1] and seen[0] == j["nodes"][0]
    tasks = {}
    for home in {c.by_name(name).homes / "nina" for name in j["nodes"]}:
        for f in home.glob("task-*.txt"):
            tasks[int(f.stem.split("-")[1])] = f.read_text().split()  # SLURM_NODEID, SLURM_LOCALID
    assert tasks == {0: ["0", "0"], 1: ["0", "1"], 2: ["1", "0"]}


ALLREDUCE = """\
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} sum {t.item():g}", flush=True)
dist.destroy_process_group()
"""


def test_unmodified_torchrun_job_all_reduces_over_gloo_across_two_members(cluster):
    c = cluster([("m1", 0, {}), ("m2", 0, {}), ("m3", 0, {})])
    entry, key = login(c, "tara")
    torchrun = Path(sys.executable).parent / "torchrun"
    assert torchrun.exists(), "tests/run.sh installs the CPU build of PyTorch"
    jid = submit(
        entry,
        key,
        "tara",
        "#!/bin/bash\n#MTGPU nodes=2 cpus=2 ram=3G time=5m\n"
        f"cat > ~/allreduce.py <<'PY'\n{ALLREDUCE}PY\n"
        f"{torchrun} --nnodes=2 --nproc-per-node=1 ~/allreduce.py\n",
    )
    j = wait_state(entry, key, "tara", jid, {"COMPLETED", "FAILED", "NODE_FAIL"}, timeout=240)
    outs = []
    for name in j["nodes"]:
        home = c.by_name(name).homes / "tara"
        outs.append(
            (home / ".mtgpu" / "jobs" / c.by_name(name).config["CLUSTER_ID"] / jid / "stdout.log").read_text()
        )
    assert j["state"] == "COMPLETED", (
        j,
        outs,
        [
            (
                c.by_name(n).homes
                / "tara"
                / ".mtgpu"
                / "jobs"
                / c.by_name(n).config["CLUSTER_ID"]
                / jid
                / "stderr.log"
            ).read_text()[-3000:]
            for n in j["nodes"]
        ],
    )
    assert "rank 0 of 2 sum 3" in outs[0] and "rank 1 of 2 sum 3" in outs[1]


def test_nodes_3_waits_whole_while_one_member_is_busy(cluster):
    c = cluster([("m1", 0, {}), ("m2", 0, {}), ("m3", 0, {})])
    entry, key = login(c, "otto")
    blocker = submit(entry, key, "otto", "#!/bin/bash\n#MTGPU cpus=8 ram=10M server=m2\nsleep 300\n")
    wait_state(entry, key, "otto", blocker, {"RUNNING"})
    gang = submit(
        entry,
        key,
        "otto",
        "#!/bin/bash\n#MTGPU nodes=3 cpus=8 ram=10M\necho started > ~/gang-$MTGPU_NODE_RANK.txt; sleep 2\n",
    )
    time.sleep(4)
    j = show(entry, key, "otto", gang)
    assert j["state"] == "PENDING" and j["nodes"] == []
    # Two members had room, yet no part started anywhere.
    assert not [p for h in c.hosts for p in (h.homes / "otto").glob("gang-*.txt")]
    r = entry.ssh("otto", key, f"mt-job cancel {blocker}")
    assert r.returncode == 0, r.stderr
    j = wait_state(entry, key, "otto", gang, {"COMPLETED", "FAILED"})
    assert j["state"] == "COMPLETED" and sorted(j["nodes"]) == ["m1", "m2", "m3"]


def test_killing_one_part_stops_the_others_and_names_the_member(cluster):
    c = cluster([("m1", 0, {}), ("m2", 0, {}), ("m3", 0, {})])
    entry, key = login(c, "pia")
    jid = submit(
        entry,
        key,
        "pia",
        "#!/bin/bash\n#MTGPU nodes=2 cpus=1 ram=20M\necho $$ > ~/part-$MTGPU_NODE_RANK.pid\nsleep 300\n",
    )
    j = wait_state(entry, key, "pia", jid, {"RUNNING"})
    rank0, rank1 = (c.by_name(n) for n in j["nodes"])
    victim, survivor = read_pid(rank1, "pia", "part-1.pid"), read_pid(rank0, "pia", "part-0.pid")
    os.kill(victim, signal.SIGKILL)
    j = wait_state(entry, key, "pia", jid, {"FAILED", "COMPLETED", "NODE_FAIL"})
    assert j["state"] == "FAILED"
    assert f"its part on {j['nodes'][1]} (rank 1) ended FAILED" in j["reason"], j["reason"]
    wait_for(lambda: not pid_alive(survivor), timeout=30, what="the other part to be stopped")


def test_array_spreads_over_members(cluster):
    c = cluster([("m1", 0, {}), ("m2", 0, {}), ("m3", 0, {})])
    entry, key = login(c, "quin")
    aid = submit(entry, key, "quin", "#!/bin/bash\n#MTGPU array=0-5 cpus=4 ram=10M\nsleep 8\n")
    tasks = wait_for(
        lambda: (lambda v: v["tasks"] if all(t["state"] == "RUNNING" for t in v["tasks"]) else None)(
            show(entry, key, "quin", aid)
        ),
        what="all six tasks running",
    )
    where = [t["nodes"][0] for t in tasks]
    assert len(tasks) == 6 and sorted(set(where)) == ["m1", "m2", "m3"]
    assert all(where.count(n) == 2 for n in ("m1", "m2", "m3"))  # 8 CPUs each: two tasks a member


def test_lost_member_fences_its_jobs_before_they_are_ended_or_requeued_elsewhere(cluster):
    c = cluster([("m1", 0, FAST_LOSS), ("m2", 0, FAST_LOSS), ("m3", 0, FAST_LOSS)])
    leader = c.scheduler()
    lost = next(h for h in c.hosts if h.config["SERVER_NAME"] != leader)
    name = lost.config["SERVER_NAME"]
    entry = next(h for h in c.hosts if h is not lost)
    key = entry.add_user("rita")
    for h in c.hosts:
        wait_for(lambda h=h: h.ssh("rita", key, "true").returncode == 0, what="login")
    plain = submit(
        entry,
        key,
        "rita",
        f"#!/bin/bash\n#MTGPU cpus=1 ram=10M server={name}\necho $$ > ~/plain.pid; sleep 300\n",
    )
    again = submit(
        entry,
        key,
        "rita",
        f"#!/bin/bash\n#MTGPU cpus=1 ram=10M server={name} requeue=yes\necho $$ >> ~/again.pids; sleep 300\n",
    )
    for jid in (plain, again):
        wait_state(entry, key, "rita", jid, {"RUNNING"})
    plain_pid = read_pid(lost, "rita", "plain.pid")
    first_again = read_pid(lost, "rita", "again.pids")
    # The member's daemon dies; its supervisors do not, and with no daemon to renew
    # the member's lease they fence their jobs before the scheduler declares it lost.
    lost.stop(signal.SIGKILL)
    j = wait_state(entry, key, "rita", plain, {"NODE_FAIL"}, timeout=60)
    assert name in j["reason"] and "lost" in j["reason"]
    assert not pid_alive(plain_pid) and not pid_alive(first_again)
    j = wait_state(entry, key, "rita", again, {"PENDING"}, timeout=60)
    assert "requeued" in j["reason"] or j["reason"] in ("Resources", "ReqNodeNotAvail", "None")
    # It comes back: the requeued job runs again there.
    lost.start(timeout=120)
    j = wait_state(entry, key, "rita", again, {"RUNNING"}, timeout=60)
    pids = wait_for(
        lambda: (lambda p: p if len(p) == 2 else None)(
            (lost.homes / "rita" / "again.pids").read_text().split()
        ),
        what="the requeued job's new run",
    )
    assert pid_alive(int(pids[1])) and j["nodes"] == [name]
    assert subprocess.run(["kill", pids[1]], check=False).returncode == 0

"""``srun``: run tasks as a step of the job it is in, or as a job of its own.

Inside a job (its script, or an allocation's shell: ``MTGPU_JOB_ID`` is set) it
starts this member's share of ``--ntasks`` tasks, each with ``SLURM_PROCID``,
``SLURM_LOCALID`` and ``SLURM_NODEID``, as one step that ``mt-job show`` lists, and
exits with the tasks' highest exit status, as Slurm's does, so a failing step fails
a script that ends with it or runs under ``set -e``. Every member of a ``nodes=N``
job runs the script, so each one's ``srun`` starts its own block of the tasks.

Outside a job, ``srun CMD`` is a job of one step: it is submitted, waited for, its
output streamed, and ``srun`` exits with its exit status. ``srun --pty CMD`` is an
interactive allocation (``mt-job alloc``) running CMD.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Any

from mtgpu.cmdline import with_examples
from mtgpu.jobstate import COMPLETED, FINAL_STATES, PENDING
from mtgpu.proc import spawn

EXAMPLES = """\
srun -n 4 python train.py         in a job script: 4 tasks, SLURM_PROCID 0-3
srun -l hostname                  each line labelled with its task's number
srun --gpus=1 nvidia-smi          outside a job: a job of one step, waited for
srun --gpus=1 --pty bash          an interactive shell with one GPU
"""


def build_parser() -> argparse.ArgumentParser:
    from mtgpu.cli.slurm.commands import SlurmParser
    from mtgpu.cli.slurm.formats import version_line

    p = SlurmParser(
        prog="srun",
        description="Run tasks inside a job, or as a job of one step.\n\n"
        "Inside a job, srun exits with the highest exit status of its tasks; `mt-job show ID`\n"
        "lists the job's steps.",
    )
    p.add_argument("--config", help="the MTGPU daemon's configuration (default $MTGPU_CONFIG)")
    p.add_argument(
        "-V", "--version", action="version", version=version_line(), help="the Slurm release followed"
    )
    p.add_argument(
        "-n", "--ntasks", type=int, metavar="N", help="how many tasks (default: the job's SLURM_NTASKS)"
    )
    p.add_argument(
        "-N", "--nodes", type=int, metavar="N", help="how many of the job's members to use (default: all)"
    )
    p.add_argument("--ntasks-per-node", type=int, metavar="N", help="tasks on each member")
    p.add_argument("-l", "--label", action="store_true", help="prefix each output line with its task number")
    p.add_argument(
        "-K",
        "--kill-on-bad-exit",
        type=int,
        nargs="?",
        const=1,
        default=0,
        metavar="0|1",
        help="end the other tasks when one fails (=0: do not)",
    )
    p.add_argument(
        "-o", "--output", help="in a job: the tasks' stdout to this file (%%t task, %%j job, %%s step)"
    )
    p.add_argument("-e", "--error", help="in a job: the tasks' stderr to this file (same patterns)")
    p.add_argument(
        "--export",
        help="in a job: the tasks' environment: ALL (default), NONE (the job's SLURM_*/MTGPU_* "
        "and PATH/HOME only), and VAR=VALUE or VAR items to add: ALL,FOO=1",
    )
    p.add_argument(
        "-m", "--distribution", help="in a job: block (default) or cyclic, for tasks over the members"
    )
    p.add_argument(
        "--gpus-per-task",
        type=int,
        metavar="N",
        help="in a job: each task sees N of the job's GPUs of its own (CUDA_VISIBLE_DEVICES)",
    )
    p.add_argument("--mpi", help="accepted; tasks start without a PMI server (see the manual)")
    p.add_argument("--cpu-bind", help="accepted; tasks run on the job's CPUs, not bound one by one")
    p.add_argument("-u", "--unbuffered", action="store_true", help="accepted; output is passed on as written")
    p.add_argument("--exclusive", action="store_true", help="accepted; steps share the job's resources")
    p.add_argument("--overlap", action="store_true", help="accepted; steps share the job's resources")
    p.add_argument("--pty", action="store_true", help="outside a job: an interactive allocation")
    p.add_argument("-G", "--gpus", help="GPUs, such as 1 or rtx4090:1 (in a job: the step's, of the job's)")
    p.add_argument("--gres", help="Slurm's form, such as gpu:1 (in a job: the step's)")
    p.add_argument("-c", "--cpus-per-task", dest="cpus", help="CPUs (in a job: per task, of the job's)")
    p.add_argument("--mem", help="memory, such as 8G; plain numbers are MB (in a job: at most the job's)")
    p.add_argument(
        "-O", "--overcommit", action="store_true", help="in a job: more tasks than the job has CPUs for"
    )
    p.add_argument("-t", "--time", help="outside a job: time limit (30m, 2h, HH:MM:SS)")
    p.add_argument("-J", "--job-name", dest="name", help="outside a job: the job's name")
    p.add_argument("-w", "--nodelist", dest="server", help="outside a job: the member to run on")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")
    return with_examples(p, {"": EXAMPLES})


def task_block(ntasks: int, nnodes: int, rank: int) -> tuple[int, int]:
    """The first task number and the task count of member ``rank`` when ``ntasks``
    are spread over ``nnodes`` members in blocks, as Slurm's default distribution.

    >>> [task_block(5, 2, r) for r in (0, 1)]
    [(0, 3), (3, 2)]
    >>> task_block(1, 2, 1)
    (1, 0)
    """
    per, extra = divmod(ntasks, nnodes)
    return rank * per + min(rank, extra), per + (1 if rank < extra else 0)


def task_ids(ntasks: int, nnodes: int, rank: int, distribution: str = "block") -> list[int]:
    """The task numbers member ``rank`` runs: a block of them (Slurm's default), or
    every ``nnodes``-th from ``rank`` with ``cyclic``.

    >>> task_ids(5, 2, 0), task_ids(5, 2, 1, "cyclic")
    ([0, 1, 2], [1, 3])
    """
    if distribution.split(":")[0] == "cyclic":
        return list(range(rank, ntasks, nnodes))
    first, count = task_block(ntasks, nnodes, rank)
    return list(range(first, first + count))


def step_gpus(args: argparse.Namespace) -> int:
    """The GPUs a step asks for with ``-G N``/``--gpus TYPE:N`` or ``--gres gpu[:TYPE]:N``
    (0: none asked; its tasks then see all of the job's, holding none).

    >>> step_gpus(build_parser().parse_args(["--gres=gpu:a100:2", "x"])), step_gpus(build_parser().parse_args(["x"]))
    (2, 0)
    """
    text = args.gpus
    if not text and args.gres:
        kind, _, rest = args.gres.partition(":")
        text = rest if kind == "gpu" else ""
    if not text:
        return 0
    last = text.rsplit(":", 1)[-1]
    return int(last) if last.isdigit() else 1


def step_limits(args: argparse.Namespace, env: dict[str, str], count: int) -> str:
    """Why a step does not fit the job on this member (empty: it does), as Slurm's
    ``Unable to create step`` says: its tasks times ``-c`` above the job's CPUs here
    (unless ``--overcommit``), or ``--mem`` above the job's memory."""
    from mtgpu.config.units import parse_size

    cpus = int(env.get("SLURM_CPUS_ON_NODE") or 0)
    per = int(args.cpus) if args.cpus and str(args.cpus).isdigit() else 1
    if cpus and count * per > cpus and not args.overcommit:
        return (
            f"More processors requested than permitted ({count} tasks x {per} CPUs on this member; "
            f"the job has {cpus} here; --overcommit runs them anyway)"
        )
    if args.mem and env.get("SLURM_MEM_PER_NODE"):
        try:
            asked = parse_size(args.mem + "M" if args.mem.isdigit() else args.mem) >> 20
        except ValueError:
            return f"--mem={args.mem} is not a size (such as 512M or 8G)"
        if asked > int(env["SLURM_MEM_PER_NODE"]):
            return f"Memory required by task is not available (--mem={args.mem}; the job has {env['SLURM_MEM_PER_NODE']}M)"
    return ""


def export_env(env: dict[str, str], spec: str | None) -> dict[str, str]:
    """The tasks' environment from ``--export``: ``ALL`` (the default) keeps this one,
    ``NONE`` keeps only the job's ``SLURM_*``/``MTGPU_*`` variables, PATH and HOME;
    ``VAR=VALUE`` items set, ``VAR`` items keep one.

    >>> export_env({"A": "1", "SLURM_JOB_ID": "7", "PATH": "/bin"}, "NONE,B=2")
    {'SLURM_JOB_ID': '7', 'PATH': '/bin', 'B': '2'}
    >>> export_env({"A": "1"}, "ALL,A=3")
    {'A': '3'}
    """
    if not spec:
        return dict(env)
    items = [i for i in spec.split(",") if i]
    words = {i.upper() for i in items if "=" not in i}
    if "NONE" in words or ("ALL" not in words and items):
        out = {
            k: v
            for k, v in env.items()
            if k.startswith(("SLURM_", "SLURMD_", "MTGPU_")) or k in ("PATH", "HOME")
        }
    else:
        out = dict(env)
    for item in items:
        key, eq, value = item.partition("=")
        if eq:
            out[key] = value
        elif key.upper() not in ("ALL", "NONE") and key in env:
            out[key] = env[key]
    return out


def output_name(pattern: str, job_id: str, step: int, task: int, node: str) -> str:
    """``-o``/``-e``'s file for one task: ``%t`` task, ``%j`` job, ``%s`` step, ``%N``
    member, ``%%`` a percent sign.

    >>> output_name("out-%j.%s-%t.txt", "12", 0, 3, "n1")
    'out-12.0-3.txt'
    """
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "%" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            sub = {"t": str(task), "j": job_id, "s": str(step), "N": node, "%": "%"}.get(nxt)
            if sub is not None:
                out.append(sub)
                i += 2
                continue
        out.append(ch)
        i += 1
    return "".join(out)


def task_env(
    base: dict[str, str], step: int, procid: int, localid: int, ntasks: int, nnodes: int
) -> dict[str, str]:
    """One task's environment: the job's, with the step's and the task's numbers."""
    env = dict(base)
    env.update(
        SLURM_STEP_ID=str(step),
        SLURM_STEPID=str(step),
        SLURM_PROCID=str(procid),
        SLURM_LOCALID=str(localid),
        SLURM_NTASKS=str(ntasks),
        SLURM_NPROCS=str(ntasks),
        SLURM_STEP_NUM_TASKS=str(ntasks),
        SLURM_STEP_NUM_NODES=str(nnodes),
    )
    return env


def _copy(stream: IO[bytes], out: Any, label: str, lock: threading.Lock) -> None:
    for line in iter(stream.readline, b""):
        with lock:
            out.write(label.encode() + line)
            out.flush()


def exit_status(codes: list[int]) -> int:
    """srun's exit status from its tasks' return codes (negative: killed by that
    signal): the highest exit status, a signal counting as 128 + its number.

    >>> exit_status([0, 3, 1]), exit_status([0, -9]), exit_status([])
    (3, 137, 0)
    """
    return max((c if c >= 0 else 128 - c for c in codes), default=0)


def run_step(args: argparse.Namespace, api: Any | None) -> int:
    """Run this member's tasks of a step of the job in ``$MTGPU_JOB_ID``."""
    env = dict(os.environ)
    job_id = env["MTGPU_JOB_ID"]
    nnodes_job = max(1, int(env.get("MTGPU_NNODES") or env.get("SLURM_JOB_NUM_NODES") or 1))
    rank = int(env.get("MTGPU_NODE_RANK") or 0)
    nnodes = min(args.nodes or nnodes_job, nnodes_job)
    if args.ntasks:
        ntasks = args.ntasks
    elif args.ntasks_per_node:
        ntasks = args.ntasks_per_node * nnodes
    else:
        ntasks = int(env.get("SLURM_NTASKS") or nnodes)
    if ntasks < 1 or nnodes < 1:
        print("srun: error: --ntasks and --nodes must be at least 1", file=sys.stderr)
        return 1
    nnodes = min(nnodes, ntasks)
    dist = (args.distribution or "block").lower()
    if dist.split(":")[0] not in ("block", "cyclic"):
        print(
            f"srun: error: --distribution={args.distribution}: MTGPU places tasks block or cyclic",
            file=sys.stderr,
        )
        return 1
    ids = task_ids(ntasks, nnodes, rank, dist) if rank < nnodes else []
    count = len(ids)
    if count == 0:
        return 0  # this member has no share of the step
    first = ids[0]
    refused = step_limits(args, env, count)
    if refused:
        print(f"srun: error: Unable to create step for job {job_id}: {refused}", file=sys.stderr)
        return 1
    held = [g for g in (env.get("CUDA_VISIBLE_DEVICES") or "").split(",") if g]
    want = args.gpus_per_task * count if args.gpus_per_task else step_gpus(args)
    if want > len(held):
        how = (
            f"--gpus-per-task={args.gpus_per_task} for {count} tasks here"
            if args.gpus_per_task
            else "the step"
        )
        print(
            f"srun: error: {how} needs {want} GPUs; the job holds {len(held)} on this member", file=sys.stderr
        )
        return 1
    if args.mpi and args.mpi.lower() not in ("none",):
        print(
            f"srun: warning: --mpi={args.mpi}: tasks start without a PMI server; an MPI program "
            "started this way runs each task alone: start it with mpirun inside the job",
            file=sys.stderr,
        )
    env = export_env(env, args.export)
    step = 0
    places = list(range(want))  # unrecorded: the first of the job's GPUs
    if api is not None:
        from mtgpu.errors import ApiError, MtgpuError

        said = False
        while True:
            try:
                r = api.call(
                    "job.step",
                    job_id=job_id,
                    action="begin",
                    ntasks=count,
                    first_task=first,
                    command=shlex.join(args.command),
                    **({"gpus": want} if want else {}),
                )
                step, places = r["step"], list(r.get("gpus") or places)
                break
            except ApiError as exc:
                if exc.code != "step_busy":
                    print(f"srun: warning: the step is not recorded: {exc}", file=sys.stderr)
                    api = None
                    break
                if not said:  # as Slurm's: the step waits for the GPUs its siblings hold
                    print(
                        "srun: Job step creation temporarily disabled, retrying (Requested nodes are busy)",
                        file=sys.stderr,
                    )
                    said = True
                time.sleep(1)
            except MtgpuError as exc:
                print(f"srun: warning: the step is not recorded: {exc}", file=sys.stderr)
                api = None
                break
        if said:
            print(f"srun: Step created for job {job_id}", file=sys.stderr)
    mine = [held[p] for p in places if p < len(held)]
    gpu_sets: list[str] | None = None
    if args.gpus_per_task:
        per = args.gpus_per_task
        gpu_sets = [",".join(mine[i * per : (i + 1) * per]) for i in range(count)]
    elif want:
        gpu_sets = [",".join(mine)] * count
    lock = threading.Lock()
    procs: list[subprocess.Popen[bytes]] = []
    copiers: list[threading.Thread] = []
    pipe = subprocess.PIPE if args.label else None
    node = env.get("SLURMD_NODENAME") or "localhost"
    files: list[IO[bytes]] = []
    try:
        for local, procid in enumerate(ids):
            e = task_env(env, step, procid, local, ntasks, nnodes)
            if gpu_sets is not None:
                e["CUDA_VISIBLE_DEVICES"] = e["NVIDIA_VISIBLE_DEVICES"] = gpu_sets[local]
            out: Any = pipe
            err: Any = pipe
            if args.output:
                out = open(output_name(args.output, job_id, step, procid, node), "ab")  # noqa: SIM115
                files.append(out)
            if args.error:
                err = open(output_name(args.error, job_id, step, procid, node), "ab")  # noqa: SIM115
                files.append(err)
            elif args.output:
                err = out  # as Slurm's: -o alone takes both streams
            p = spawn(args.command, env=e, stdout=out, stderr=err)
            procs.append(p)
            if args.label:
                for stream, dest in ((p.stdout, sys.stdout.buffer), (p.stderr, sys.stderr.buffer)):
                    if stream is None:
                        continue
                    t = threading.Thread(target=_copy, args=(stream, dest, f"{procid}: ", lock), daemon=True)
                    t.start()
                    copiers.append(t)
    except OSError as exc:
        for f in files:
            f.close()
        print(f"srun: error: cannot run {args.command[0]}: {exc.strerror}", file=sys.stderr)
        for p in procs:
            p.kill()
        procs_codes = [p.wait() for p in procs]
        rc = 2 if isinstance(exc, FileNotFoundError) else 1
        _end(api, job_id, step, rc)
        return rc if not procs_codes else max(rc, exit_status(procs_codes))

    def forward(signum: int, _frame: Any) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, forward)
    codes: list[int | None] = [None] * len(procs)
    while any(c is None for c in codes):
        for i, p in enumerate(procs):
            if codes[i] is None and (c := p.poll()) is not None:
                codes[i] = c
                if c != 0:
                    what = f"exit code {c}" if c > 0 else f"signal {-c}"
                    print(f"srun: error: {node}: task {ids[i]}: Exited with {what}", file=sys.stderr)
                    if args.kill_on_bad_exit:
                        forward(signal.SIGKILL, None)
        time.sleep(0.05)
    for t in copiers:
        t.join(5)
    for f in files:
        f.close()
    rc = exit_status([c for c in codes if c is not None])
    _end(api, job_id, step, rc)
    return rc


def _end(api: Any | None, job_id: str, step: int, rc: int) -> None:
    if api is None:
        return
    from mtgpu.errors import MtgpuError

    try:
        api.call("job.step", job_id=job_id, action="end", step=step, exit_code=rc)
    except MtgpuError as exc:
        print(f"srun: warning: the step's end is not recorded: {exc}", file=sys.stderr)


def overrides_of(args: argparse.Namespace) -> dict[str, str]:
    """The job file overrides a job of one step is submitted with.

    >>> overrides_of(build_parser().parse_args(["--gres=gpu:2", "--mem", "512", "-N", "2", "true"]))
    {'gpus': '2', 'ram': '512M', 'nodes': '2', 'name': 'true'}
    """
    gpus = args.gpus
    if args.gres and not gpus:
        kind, _, rest = args.gres.partition(":")
        gpus = rest if kind == "gpu" and rest else args.gres
    mem = args.mem + "M" if args.mem and args.mem.isdigit() else args.mem
    pairs = (
        ("gpus", gpus),
        ("cpus", args.cpus),
        ("ram", mem),
        ("time", args.time),
        ("nodes", str(args.nodes) if args.nodes else None),
        ("server", args.server),
        ("name", args.name or (os.path.basename(args.command[0]) if args.command else None)),
    )
    return {k: v for k, v in pairs if v}


FINAL = FINAL_STATES


def run_job(args: argparse.Namespace, api: Any) -> int:
    """A job of one step: submit, wait, stream its output, exit with its status."""
    from mtgpu.cli.job import submit_once

    step = ["srun"]
    if args.ntasks:
        step.append(f"--ntasks={args.ntasks}")
    if args.ntasks_per_node:
        step.append(f"--ntasks-per-node={args.ntasks_per_node}")
    if args.label:
        step.append("--label")
    script = "#!/bin/sh\nexec " + shlex.join([*step, *args.command]) + "\n"
    r = submit_once(api, script=script, overrides=overrides_of(args), workdir=os.getcwd())
    for w in r.get("warnings", []):
        print(f"srun: warning: {w}", file=sys.stderr)
    jid = r["job_id"]
    offsets = {"stdout": 0, "stderr": 0}
    queued = ran = False
    since = time.monotonic()
    try:
        while True:
            j = api.call("job.show", job_id=jid)
            # As Slurm's: "queued" only for a job that waits, not one that starts at once.
            if j["state"] == PENDING and not queued and time.monotonic() - since > 1.0:
                print(f"srun: job {jid} queued and waiting for resources", file=sys.stderr)
                queued = True
            elif queued and not ran and j["state"] != PENDING:
                print(f"srun: job {jid} has been allocated resources", file=sys.stderr)
                ran = True
            _stream(j, offsets)
            if j["state"] in FINAL:
                break
            time.sleep(0.3)
    except KeyboardInterrupt:
        api.call("job.cancel", job_ids=[jid], reason="srun was interrupted")
        print(f"srun: Job {jid} cancelled", file=sys.stderr)
        return 130
    _stream(j, offsets)
    code = j.get("exit_code")
    if j["state"] != COMPLETED:
        why = f": {j['reason']}" if j.get("reason") else ""
        print(f"srun: error: job {jid} ended {j['state']}{why}", file=sys.stderr)
        return code if isinstance(code, int) and code > 0 else 1
    return code if isinstance(code, int) and code >= 0 else 0


def _stream(j: dict[str, Any], offsets: dict[str, int]) -> None:
    """Copy what the job's output files gained since ``offsets`` (read as the tenant)."""
    same = j["stdout"] == j["stderr"]
    for key, out in (("stdout", sys.stdout.buffer), ("stderr", sys.stderr.buffer)):
        if key == "stderr" and same:
            continue
        try:
            with open(j[key], "rb") as f:
                f.seek(offsets[key])
                data = f.read(1 << 24)
        except OSError:
            continue
        if data:
            out.write(data)
            out.flush()
            offsets[key] += len(data)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        print("srun: fatal: No command given to execute.", file=sys.stderr)
        return 1
    from mtgpu.cli.common import run_cli, tenant_client

    if os.environ.get("MTGPU_JOB_ID"):
        from mtgpu.errors import MtgpuError

        def inside() -> int:
            try:
                api = tenant_client(args)
            except MtgpuError as exc:  # no configuration to find the daemon: run unrecorded
                print(f"srun: warning: the step is not recorded: {exc}", file=sys.stderr)
                api = None
            return run_step(args, api)

        return run_cli("srun", inside)
    if args.pty:
        from mtgpu.cli.job import alloc_args, main_with

        alloc = argparse.Namespace(
            cmd="alloc",
            join=None,
            window=False,
            gpus=args.gpus,
            gres=args.gres,
            time=args.time,
            cpus=args.cpus,
            mem=args.mem,
            vram=None,
            server=args.server,
            gpu_mode=None,
            name=args.name,
            command=args.command,
            config=args.config,
            json=False,
        )
        return main_with(alloc_args(alloc), "srun")
    return run_cli("srun", lambda: run_job(args, tenant_client(args)))

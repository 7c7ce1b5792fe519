"""Slurm beside MTGPU on this machine: the same CLI work timed through both, in one run.

Used by ``benchmarks/sched_bench.py --slurm`` (and, for the API-socket part of
``--journal``, by :func:`api_socket_bench`). Needs root: it installs Debian's
``slurm-wlm`` and ``munge`` if they are missing, brings up a single-node Slurm over
loopback with the anchor recipe copied under ``benchmarks/slurm/`` (tuned config by
default), times the work, stops Slurm, then starts a real ``mtgpu-server`` (the
test harness's private mount namespace and ``/etc``) with one tenant and times the
same work as that tenant, in one SSH session, so no connection cost is counted.

The timing itself is one shell script for both systems, ``benchmarks/slurm/cli_bench.sh``:

a. 500 sequential CLI submissions of a trivial job, each a separate process
   (``sbatch -Q --wrap=true -o /dev/null`` against ``mt-job submit --parsable - < job``,
   both the Python ``mt-job`` and the C fast path ``mtgpu/cli/fastjob.c``);
b. submit->start latency on an idle node, 30 samples: t0 just before the submit
   command is exec'd, start = ``date +%s.%N`` written by the job into a FIFO;
c. a 1,000-task array of trivial jobs to completion, on comparable concurrency:
   Slurm's ``over`` partition (2 cores x ``OverSubscribe=FORCE:16`` = 32 jobs at once)
   against an MTGPU host with ``SIMULATED_CPUS: 32`` and ``cpus=1`` jobs.

Slurm and MTGPU never run at the same time. Nothing here asserts a timing.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SLURM_DIR = HERE / "slurm"
#: Where the anchor's slurm.conf puts pid files and logs.
SLURM_STATE = Path("/tmp/slurm-anchor")
#: Tenant UIDs for the benchmark's daemon, away from the test suite's default range,
#: so that a test run's clean-up on this machine never touches the benchmark's tenant.
UID_RANGE = "31000-31999"
SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: The anchor's published figures (Slurm 22.05 on a 2-vCPU Debian 12 VM, median of 2 reps).
ANCHOR = {
    "sbatch_loop_per_s": {"stock": 181.0, "tuned": 132.0},
    "latency_p50_ms": {"stock": 1785.0, "tuned": 496.0},
    "latency_p99_ms": {"stock": 2397.0, "tuned": 1026.0},
    "array_over_per_s": {"stock": 13.2, "tuned": 54.5},
}


# ------------------------------------------------------------------ the machine


def machine_info() -> dict[str, Any]:
    """What the figures were measured on."""
    info: dict[str, Any] = {
        "cpu": "unknown",
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["ram_gib"] = round(int(line.split()[1]) / 2**20, 1)
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                info["os"] = line.split("=", 1)[1].strip('"')
        info["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        pass
    try:  # which code was measured
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", "mtgpu"],
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        ).stdout.strip()
        if head:
            info["code"] = head + (" + uncommitted changes under mtgpu/" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def machine_line(m: dict[str, Any]) -> str:
    return (
        f"{m.get('cpu')}, {m.get('cores')} cores ({m.get('usable_cores')} usable), "
        f"{m.get('ram_gib', '?')} GiB RAM, {m.get('os', '?')}, kernel {m.get('kernel')}, "
        f"Python {m.get('python')}; load average at start {' '.join(m.get('loadavg', []))}"
        + (f"; code {m['code']}" if m.get("code") else "")
    )


def _proc_stats(pid: int) -> dict[str, float]:
    """RSS, peak RSS (MB) and CPU seconds (user+system) of one process."""
    out: dict[str, float] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                out["rss_mb" if line.startswith("VmRSS") else "hwm_mb"] = round(
                    int(line.split()[1]) / 1024, 1
                )
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        out["cpu_s"] = round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)
    except (OSError, ValueError, IndexError):
        pass
    return out


def _pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile, as the anchor's summary computes it."""
    v = sorted(values)
    k = -(-len(v) * p // 100)
    return v[max(1, int(k)) - 1]


def _run_timed_script(
    argv: list[str], *, env: dict[str, str] | None = None, input: bytes | None = None, timeout: float = 900
) -> str:
    """Run a timing script: its records on stdout (returned), its progress on our stderr."""
    proc = subprocess.run(
        argv,
        input=input,
        stdout=subprocess.PIPE,
        stderr=None,
        env=env,
        check=False,
        timeout=timeout,
        stdin=None if input is not None else subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"{argv[0]} exited {proc.returncode}; its output so far:\n"
            f"{proc.stdout.decode(errors='replace')[-3000:]}"
        )
    return proc.stdout.decode()


def parse_records(text: str) -> dict[str, Any]:
    """cli_bench.sh's output: ``rec`` values by test and metric, and ``lat`` samples."""
    recs: dict[str, dict[str, float | str]] = {}
    lat: list[dict[str, float]] = []
    for line in text.splitlines():
        f = line.split("\t")
        if f[0] == "rec" and len(f) == 4:
            try:
                val: float | str = float(f[3])
            except ValueError:
                val = f[3]
            recs.setdefault(f[1], {})[f[2]] = val
        elif f[0] == "lat" and len(f) == 8:
            try:
                lat.append(
                    {"gap": float(f[4]), "t0": float(f[5]), "returned": float(f[6]), "start": float(f[7])}
                )
            except ValueError:
                continue
    return {"records": recs, "latency": latency_stats(lat)}


def latency_stats(samples: list[dict[str, float]]) -> dict[str, Any]:
    ok = [s for s in samples if s["start"] == s["start"]]  # NaN: the job did not start
    lat = [(s["start"] - s["t0"]) * 1e3 for s in ok]
    ret = [(s["returned"] - s["t0"]) * 1e3 for s in samples]
    if not lat:
        return {"n": 0, "missing": len(samples)}
    return {
        "n": len(lat),
        "missing": len(samples) - len(lat),
        "p50_ms": round(_pct(lat, 50), 1),
        "p90_ms": round(_pct(lat, 90), 1),
        "p99_ms": round(_pct(lat, 99), 1),
        "min_ms": round(min(lat), 1),
        "max_ms": round(max(lat), 1),
        "mean_ms": round(statistics.fmean(lat), 1),
        "submit_returns_p50_ms": round(_pct(ret, 50), 1),
        "submit_returns_p99_ms": round(_pct(ret, 99), 1),
    }


# ------------------------------------------------------------------------ Slurm


def _pid_from(path: Path) -> int | None:
    try:
        pid = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


def _pids_named(name: str) -> set[int]:
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == name:
                    out.add(int(d.name))
            except OSError:
                continue
    return out


class Slurm:
    """A single-node Slurm brought up and stopped with the anchor recipe."""

    def __init__(self, conf: Path) -> None:
        self.conf = conf
        self.env = {**os.environ, "PATH": SBIN_PATH + ":" + os.environ.get("PATH", "")}
        self.started_munge = False
        self.conf_backup: bytes | None = None
        self.wrote_conf = False
        self.version = ""

    def ensure_installed(self) -> None:
        """Install Debian's slurm-wlm and munge if they are missing (as setup.sh would)."""
        if shutil.which("slurmctld", path=self.env["PATH"]) is None:
            print("installing slurm-wlm and munge with apt-get...", file=sys.stderr, flush=True)
            env = {**self.env, "DEBIAN_FRONTEND": "noninteractive"}
            subprocess.run(["apt-get", "update", "-q"], env=env, check=True, stdout=subprocess.DEVNULL)
            subprocess.run(
                ["apt-get", "install", "-y", "-q", "slurm-wlm", "munge"],
                env=env,
                check=True,
                stdout=subprocess.DEVNULL,
            )
        q = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Package} ${Version}, ", "slurm-wlm", "munge"],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        self.version = q.stdout.strip().rstrip(",") or "slurm-wlm (version unknown)"

    def start(self) -> None:
        ours = {
            p for p in (_pid_from(SLURM_STATE / "slurmctld.pid"), _pid_from(SLURM_STATE / "slurmd.pid")) if p
        }
        foreign = (_pids_named("slurmctld") | _pids_named("slurmd")) - ours
        if foreign:
            raise RuntimeError(
                f"a Slurm not started by this recipe runs here (pids {sorted(foreign)}); "
                "this benchmark would replace its configuration and state: stop it first"
            )
        if ours:
            self._stop_daemons()
        self.started_munge = _pid_from(Path("/run/munge/munged.pid")) is None
        conf = Path("/etc/slurm/slurm.conf")
        if conf.exists():
            self.conf_backup = conf.read_bytes()
        self.wrote_conf = True
        SLURM_STATE.mkdir(parents=True, exist_ok=True)
        with open(SLURM_STATE / "setup.log", "wb") as log:
            r = subprocess.run(
                ["bash", str(SLURM_DIR / "setup.sh"), str(self.conf)],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=180,
                check=False,
            )
        if r.returncode != 0:
            raise RuntimeError(
                f"Slurm did not come up; see {SLURM_STATE / 'setup.log'}:\n"
                + (SLURM_STATE / "setup.log").read_text()[-2000:]
            )

    def pids(self) -> dict[str, int | None]:
        return {
            "slurmctld": _pid_from(SLURM_STATE / "slurmctld.pid"),
            "slurmd": _pid_from(SLURM_STATE / "slurmd.pid"),
        }

    def stats(self) -> dict[str, dict[str, float]]:
        return {name: _proc_stats(pid) for name, pid in self.pids().items() if pid}

    def _stop_daemons(self, all_: bool = False) -> None:
        subprocess.run(
            ["bash", str(SLURM_DIR / "stop.sh")] + (["--all"] if all_ else []),
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
            check=False,
        )

    def stop(self) -> None:
        """Stop slurmctld and slurmd (and munged if this run started it); restore slurm.conf."""
        self._stop_daemons(all_=self.started_munge)
        conf = Path("/etc/slurm/slurm.conf")
        if self.conf_backup is not None:
            conf.write_bytes(self.conf_backup)
        elif self.wrote_conf:
            conf.unlink(missing_ok=True)


# ------------------------------------------------------------------------ MTGPU


class MtgpuHost:
    """A real mtgpu-server (the test harness's private namespace) with one tenant."""

    def __init__(self, config: dict[str, Any], user: str = "bench") -> None:
        if str(REPO / "tests") not in sys.path:
            sys.path.insert(0, str(REPO / "tests"))
        from mtgpu_testing import Host

        self.user = user
        # Throughput runs submit far past the per-tenant limits on purpose.
        self.host = Host(
            {"TENANT_UID_RANGE": UID_RANGE, "USER_SUBMIT_RATE": None, "USER_MAX_QUEUED_JOBS": None, **config},
            name="benchhost",
        )
        self.key: Path | None = None

    def start(self) -> MtgpuHost:
        self.host.start()
        self.key = self.host.add_user(self.user)
        r = self.host.ssh(self.user, self.key, "true")  # the first login creates the account
        if r.returncode != 0:
            raise RuntimeError(f"the tenant could not log in: {r.stderr.decode(errors='replace')}")
        return self

    @property
    def pid(self) -> int:
        return self.host._server_pid()

    def stats(self) -> dict[str, float]:
        return _proc_stats(self.pid)

    def pin(self, cpus: set[int]) -> None:
        """Pin every thread of the daemon (and what it starts later) to ``cpus``."""
        for t in Path(f"/proc/{self.pid}/task").iterdir():
            try:
                os.sched_setaffinity(int(t.name), cpus)
            except OSError:
                pass

    def tenant_argv(self, command: str) -> list[str]:
        assert self.key is not None
        return self.host.ssh_argv(self.user, self.key, command)

    def tenant(self, command: str, input: bytes | None = None, timeout: float = 600) -> str:
        """Run ``command`` in one SSH session as the tenant; its stdout."""
        return _run_timed_script(self.tenant_argv(command), input=input, timeout=timeout)

    def python_mt_job(self) -> str | None:
        """The Python mt-job the daemon puts on tenants' PATH (linked from beside its Python)."""
        cand = Path(sys.executable).parent / "mt-job"
        return str(cand) if cand.exists() else shutil.which("mt-job")

    def fast_client(self) -> str | None:
        """mtgpu/cli/fastjob.c compiled where the tenant can run it; None without a C compiler."""
        cc = shutil.which("cc") or shutil.which("gcc")
        src = REPO / "mtgpu" / "cli" / "fastjob.c"
        if cc is None or not src.exists():
            return None
        out = self.host.dir / "fastbin"
        out.mkdir(mode=0o755, exist_ok=True)
        os.chmod(out, 0o755)
        py = self.python_mt_job() or ""
        r = subprocess.run(
            [cc, "-O2", "-o", str(out / "mt-job"), str(src), f'-DMTGPU_PY_MTJOB="{py}"'],
            capture_output=True,
            text=True,
            check=False,
        )
        if r.returncode != 0:
            print(f"fastjob.c did not compile; timing the Python mt-job only:\n{r.stderr}", file=sys.stderr)
            return None
        return str(out / "mt-job")

    def cleanup(self) -> None:
        self.host.cleanup()


# ---------------------------------------------------------- API socket (--journal)

#: Runs as the tenant: ``job.submit`` over the API socket from CONNS connections, each
#: keeping DEPTH requests in flight (pipelined). Prints one JSON object.
API_CLIENT = r"""
import asyncio, json, os, sys, time, uuid
conns, depth, total, cpu = (int(a) for a in sys.argv[1:5])
script = json.loads(sys.argv[5])
if cpu >= 0:
    os.sched_setaffinity(0, {cpu})
path = os.environ["MTGPU_API_SOCKET"]
lat, errors, first_error = [], 0, None
share = [total // conns + (1 if i < total % conns else 0) for i in range(conns)]

async def conn(n):
    global errors, first_error
    r, w = await asyncio.open_unix_connection(path, limit=1 << 22)
    sent = {}
    async def reader():
        global errors, first_error
        for _ in range(n):
            a = json.loads(await r.readline())
            lat.append(time.perf_counter() - sent.pop(a["id"]))
            if not a.get("ok"):
                errors += 1
                first_error = first_error or a.get("error")
            window.release()
    window = asyncio.Semaphore(depth)
    rt = asyncio.create_task(reader())
    for i in range(n):
        await window.acquire()
        req = {"op": "job.submit", "args": {"script": script, "overrides": {}, "workdir": "",
               "token": uuid.uuid4().hex}, "id": i}
        sent[i] = time.perf_counter()
        w.write(json.dumps(req).encode() + b"\n")
        await w.drain()
    await rt
    w.close()

async def main():
    t0 = time.perf_counter()
    await asyncio.gather(*(conn(n) for n in share if n))
    return time.perf_counter() - t0

took = asyncio.run(main())
lat.sort()
pick = lambda p: lat[min(len(lat) - 1, int(p / 100 * len(lat)))] * 1e3
print(json.dumps({"connections": conns, "depth": depth, "submissions": len(lat), "errors": errors,
                  "first_error": first_error, "seconds": round(took, 3),
                  "per_s": round(len(lat) / took, 1), "p50_ms": round(pick(50), 2),
                  "p99_ms": round(pick(99), 2), "max_ms": round(lat[-1] * 1e3, 1)}))
"""

API_JOB = (
    "#!/bin/bash\n#MTGPU cpus=1 ram=1G time=1h name=api-bench\n#SBATCH --output=logs/%x-%j.out\n"
    "source ~/venv/bin/activate\npython train.py --config configs/base.yaml --epochs 20\n"
)


#: Runs as the tenant in one session: the cost of one CLI call, each a new process.
#: The host is full, so the submitted jobs wait and nothing else competes for the CPUs.
CLI_LOOP = r"""
cd ~ && printf '#!/bin/bash\n#MTGPU cpus=1 ram=64M output=/dev/null\ntrue\n' > cli-bench.sh
run() {   # LABEL COUNT COMMAND...: COUNT sequential calls, standard input from the job file
  local label=$1 n=$2 t0 t1 i f=0; shift 2
  t0=$EPOCHREALTIME
  for i in $(seq "$n"); do "$@" < cli-bench.sh > /dev/null || f=$((f + 1)); done
  t1=$EPOCHREALTIME
  printf 'cli\t%s\t%s\t%s\t%s\n' "$label" "$n" "$(awk -v a="$t0" -v b="$t1" -v n="$n" 'BEGIN{printf "%.3f", (b-a)/n*1000}')" "$f"
}
run "/bin/true (fork+exec)" 200 /bin/true
run "python3 -S -c pass" 50 /usr/bin/python3 -S -c pass
run "mt-job --help (Python)" 30 mt-job --help
run "mt-job submit (Python)" "$PY_N" mt-job submit --parsable -
[ -n "$FAST" ] && run "mt-job submit (C fast path)" "$C_N" "$FAST" submit --parsable -
[ -n "$FAST" ] && run "C fast path, fallback to Python (--help)" 30 "$FAST" --help
true
"""


def cli_call_costs(mt: MtgpuHost, py_n: int, c_n: int) -> list[dict[str, Any]]:
    """Per-call time of the submit clients (and of Python's start-up alone), as the tenant."""
    fast = mt.fast_client() or ""
    env = f"export PY_N={py_n} C_N={c_n} FAST={shlex.quote(fast)}\n"
    out = []
    for line in mt.tenant("bash -s", input=(env + CLI_LOOP).encode(), timeout=600).splitlines():
        f = line.split("\t")
        if f[0] == "cli" and len(f) == 5:
            ms = float(f[3])
            out.append(
                {
                    "command": f[1],
                    "calls": int(f[2]),
                    "ms_per_call": ms,
                    "per_s": round(1000 / ms, 1) if ms else None,
                    "failed": int(f[4]),
                }
            )
    return out


def _tenant_submit(mt: MtgpuHost, script: str) -> str:
    out = mt.tenant("mt-job submit --parsable -", input=script.encode(), timeout=60)
    return out.strip()


def _tenant_show(mt: MtgpuHost, jid: str) -> dict[str, Any]:
    return json.loads(mt.tenant(f"mt-job show {shlex.quote(jid)} --json", timeout=60))


def api_socket_bench(args: Any) -> dict[str, Any]:
    """``job.submit`` through the API socket of a running daemon, as a tenant.

    The host has SIMULATED_CPUS: 4 and one running job holding all four, so every
    submission is accepted, journaled and queued (and each wakes a scheduling pass
    over the growing queue, as on a full cluster). First the per-call cost of the CLI
    clients (Python mt-job, the C fast path) is taken on the whole machine; then, with
    two or more cores, the daemon is pinned to one and the API client to another.
    """
    if os.geteuid() != 0:
        return {"skipped": "needs root (starts a daemon in a private mount namespace)"}
    levels = []
    for spec in str(args.api_clients).split(","):
        c, _, d = spec.partition("x")
        levels.append((int(c), int(d or 1)))
    cpus = sorted(os.sched_getaffinity(0))
    mt = MtgpuHost({"SIMULATED_CPUS": 4})
    out: dict[str, Any] = {"levels": []}
    try:
        mt.start()
        blocker = _tenant_submit(mt, "#!/bin/bash\n#MTGPU cpus=4 ram=64M output=/dev/null\nsleep 3600\n")
        deadline = time.time() + 30
        while _tenant_show(mt, blocker)["state"] != "RUNNING":
            if time.time() > deadline:
                raise RuntimeError("the blocking job did not start")
            time.sleep(0.2)
        print("CLI per-call cost: Python and C mt-job submit, as the tenant...", file=sys.stderr, flush=True)
        out["cli"] = cli_call_costs(mt, args.python_n, args.slurm_n)
        client_cpu = -1
        if len(cpus) >= 2:
            mt.pin({cpus[0]})
            client_cpu = cpus[1]
            out["pinning"] = f"daemon on CPU {cpus[0]}, client on CPU {cpus[1]}"
        else:
            out["pinning"] = "one CPU: daemon and client share it"
        s0 = mt.stats()
        for c, d in levels:
            n = min(args.api_n, args.journal_seq_n) if c * d == 1 else args.api_n
            print(
                f"api socket: {n} submissions, {c} connection(s) x {d} in flight...",
                file=sys.stderr,
                flush=True,
            )
            res = json.loads(
                mt.tenant(
                    f"/usr/bin/python3 - {c} {d} {n} {client_cpu} {shlex.quote(json.dumps(API_JOB))}",
                    input=API_CLIENT.encode(),
                    timeout=600,
                )
            )
            res["daemon_cpu_s"] = round(mt.stats().get("cpu_s", 0) - s0.get("cpu_s", 0), 2)
            s0 = mt.stats()
            out["levels"].append(res)
        out["daemon"] = mt.stats()
        mt.tenant(f"mt-job cancel {blocker}", timeout=60)
    finally:
        mt.cleanup()
    out["best_per_s"] = max((lv["per_s"] for lv in out["levels"]), default=0)
    return out


# ------------------------------------------------------------------ the comparison


def compare(args: Any) -> dict[str, Any]:
    """Time the same CLI work through Slurm and MTGPU, one after the other."""
    if os.geteuid() != 0:
        raise SystemExit("--slurm needs root: it installs and runs Slurm, and runs MTGPU as a real daemon")
    machine = machine_info()
    conf_name = "slurm-tuned.conf" if args.slurm_conf == "tuned" else "slurm.conf"
    common = {"N": str(args.slurm_n), "LAT_N": str(args.lat_n), "ARRAY": str(args.array)}
    res: dict[str, Any] = {
        "machine": machine,
        "slurm_conf": args.slurm_conf,
        "array_concurrency": {
            "slurm": "partition over: 2 CPUs x OverSubscribe=FORCE:16 = 32",
            "mtgpu": f"SIMULATED_CPUS: {args.sim_cpus}, jobs cpus=1 ram=64M",
        },
    }
    t_start = time.time()

    slurm = Slurm(SLURM_DIR / conf_name)
    slurm.ensure_installed()
    res["slurm_version"] = slurm.version
    print(f"Slurm ({slurm.version}, {conf_name}): starting", file=sys.stderr, flush=True)
    slurm.start()
    try:
        s0 = slurm.stats()
        work = SLURM_STATE / "cli-bench"
        text = _run_timed_script(
            ["bash", str(SLURM_DIR / "cli_bench.sh")],
            env={**slurm.env, **common, "SYSTEM": "slurm", "PART": "over", "WORK": str(work)},
        )
        s1 = slurm.stats()
    finally:
        slurm.stop()
    res["slurm"] = parse_records(text)
    res["slurm"]["daemons"] = {
        k: {**v, "cpu_s": round(v.get("cpu_s", 0) - s0.get(k, {}).get("cpu_s", 0), 2)} for k, v in s1.items()
    }

    import mtgpu

    res["mtgpu_version"] = mtgpu.__version__
    print(
        f"MTGPU {mtgpu.__version__}: starting a daemon with SIMULATED_CPUS: {args.sim_cpus}",
        file=sys.stderr,
        flush=True,
    )
    mt = MtgpuHost({"SIMULATED_CPUS": args.sim_cpus})
    try:
        mt.start()
        fast = mt.fast_client()
        clients = f"python:{args.python_n}=mt-job" + (f" c={fast}" if fast else "")
        lat_client = fast or "mt-job"
        res["mtgpu_clients"] = {
            "python": mt.python_mt_job(),
            "c": fast,
            "used_for_latency_and_array": "c" if fast else "python",
        }
        env = {**common, "SYSTEM": "mtgpu", "MT_CLIENTS": clients, "LAT_CLIENT": lat_client}
        preamble = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
        script = preamble + (SLURM_DIR / "cli_bench.sh").read_text()
        m0 = mt.stats()
        text = mt.tenant("bash -s", input=script.encode(), timeout=1800)
        m1 = mt.stats()
    finally:
        mt.cleanup()
    res["mtgpu"] = parse_records(text)
    res["mtgpu"]["daemons"] = {
        "mtgpu-server": {**m1, "cpu_s": round(m1.get("cpu_s", 0) - m0.get("cpu_s", 0), 2)}
    }
    res["seconds"] = round(time.time() - t_start, 1)
    res["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
    res["table"] = table_rows(res, args)
    return res


def _get(side: dict[str, Any], test: str, metric: str) -> float | None:
    v = side["records"].get(test, {}).get(metric)
    return v if isinstance(v, float) else None


def table_rows(res: dict[str, Any], args: Any) -> list[dict[str, Any]]:
    """Rows of the side-by-side table; ``factor`` is how many times better MTGPU is."""
    s, m = res["slurm"], res["mtgpu"]
    n, a = args.slurm_n, args.array
    rows: list[dict[str, Any]] = []

    def row(
        label: str, sv: float | None, mv: float | None, higher_better: bool, target: float | None, unit: str
    ) -> None:
        factor = None
        if sv and mv:
            factor = round(mv / sv if higher_better else sv / mv, 2)
        rows.append(
            {
                "metric": label,
                "unit": unit,
                "slurm": sv,
                "mtgpu": mv,
                "factor": factor,
                "target": target,
                "met": None if factor is None or target is None else factor >= target,
            }
        )

    sb = _get(s, "seq_sbatch", "submit_per_s")
    # The installed `mt-job` is the C client (mtgpu-setup builds it), so the target is
    # its; the Python one, which it hands every other command to, is shown alongside.
    has_c = _get(m, "seq_mtjob_c", "submit_per_s") is not None
    for label in ("python", "c"):
        mv = _get(m, f"seq_mtjob_{label}", "submit_per_s")
        if mv is not None:
            k = int(_get(m, f"seq_mtjob_{label}", "n") or 0)
            target = None if label == "python" and has_c else 1.0
            row(
                f"a. sequential CLI submits: {n} sbatch vs {k} {label} mt-job", sb, mv, True, target, "subm/s"
            )
    for label in ("python", "c"):
        mv = _get(m, f"seq_mtjob_{label}", "done_per_s")
        if mv is not None:
            row(
                f"a. those jobs, first submit -> all ended ({label} mt-job)",
                _get(s, "seq_sbatch", "done_per_s"),
                mv,
                True,
                None,
                "jobs/s",
            )
    sl, ml = s["latency"], m["latency"]
    row("b. submit->start on an idle node, p50", sl.get("p50_ms"), ml.get("p50_ms"), False, 2.0, "ms")
    row("b. submit->start on an idle node, p99", sl.get("p99_ms"), ml.get("p99_ms"), False, 2.0, "ms")
    row(
        "b. submit command returns, p50",
        sl.get("submit_returns_p50_ms"),
        ml.get("submit_returns_p50_ms"),
        False,
        None,
        "ms",
    )
    row(
        f"c. {a}-task array, submit -> all ended",
        _get(s, f"array{a}", "done_per_s"),
        _get(m, f"array{a}", "done_per_s"),
        True,
        2.0,
        "tasks/s",
    )
    return rows


def print_comparison(res: dict[str, Any]) -> None:
    print(
        f"\nSlurm vs MTGPU, same machine, one run ({res['seconds']} s): {machine_line(res['machine'])}; "
        f"load average at end {' '.join(res['loadavg_end'])}"
    )
    print(
        f"  Slurm: {res['slurm_version']} ({res['slurm_conf']} config, single node over loopback); "
        f"MTGPU {res['mtgpu_version']} (one daemon, one tenant, one SSH session)"
    )
    print(
        f"  array concurrency: Slurm {res['array_concurrency']['slurm']}; MTGPU {res['array_concurrency']['mtgpu']}"
    )
    cl = res["mtgpu_clients"]
    print(
        f"  mt-job: python = {cl['python']}; c = {cl['c'] or 'not built (no C compiler)'}; "
        f"b. and c. submit with the {cl['used_for_latency_and_array']} one"
    )
    w = max(len(r["metric"]) for r in res["table"]) + 2
    print(f"\n  {'':{w}}{'Slurm':>10}{'MTGPU':>10}  {'MTGPU better by':>16}  target")
    for r in res["table"]:

        def fmt(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f}"

        factor = "-" if r["factor"] is None else f"{r['factor']:.2f}x"
        target = "" if r["target"] is None else f">= {r['target']:g}x {'met' if r['met'] else 'MISSED'}"
        print(
            f"  {r['metric']:{w}}{fmt(r['slurm']):>10}{fmt(r['mtgpu']):>10}  {factor:>16}  {target}"
            f"   [{r['unit']}]"
        )
    for side in ("slurm", "mtgpu"):
        lat = res[side]["latency"]
        ds = ", ".join(
            f"{k} CPU {v.get('cpu_s')} s, RSS {v.get('rss_mb')} MB (peak {v.get('hwm_mb')})"
            for k, v in res[side]["daemons"].items()
        )
        print(
            f"  {side}: latency n={lat.get('n')} (missing {lat.get('missing')}) p50 {lat.get('p50_ms')} "
            f"p90 {lat.get('p90_ms')} p99 {lat.get('p99_ms')} min {lat.get('min_ms')} max {lat.get('max_ms')} ms; "
            f"{ds}"
        )
    print(
        "  For reference, the anchor's published tuned figures: sbatch loop "
        f"{ANCHOR['sbatch_loop_per_s']['tuned']:g}/s (stock {ANCHOR['sbatch_loop_per_s']['stock']:g}/s), "
        f"submit->start p50/p99 {ANCHOR['latency_p50_ms']['tuned']:g}/{ANCHOR['latency_p99_ms']['tuned']:g} ms, "
        f"array on 'over' {ANCHOR['array_over_per_s']['tuned']:g} tasks/s"
    )

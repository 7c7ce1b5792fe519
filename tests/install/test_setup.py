"""mtgpu-setup: a real install into a temporary prefix, twice, then status and uninstall."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mtgpu_testing import REPO, free_port, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]

SETUP = str(REPO / "bin" / "mtgpu-setup")


def _env() -> dict[str, str]:
    """mtgpu-setup's environment: this one's, less what points at the test tree."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MTGPU_CONFIG")}
    env["MTGPU_PYTHON"] = "/usr/bin/python3"  # a fresh host has nothing but the system Python
    return env


def _where(tmp: Path) -> list[str]:
    """Where mtgpu-setup installs, inside ``tmp``."""
    where = ["--prefix", str(tmp / "opt"), "--bin-dir", str(tmp / "bin"), "--unit-dir", str(tmp / "units")]
    return where + ["--config", str(tmp / "etc" / "mtgpu.yaml")]


def _setup(args, tmp, check=True):
    argv = [SETUP, *args, *_where(tmp)]
    if args[0] == "install":
        argv += ["--skip-os-packages", "--log-file", str(tmp / "mtgpu.log")]
    r = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=600)
    if check and r.returncode != 0:
        raise AssertionError(f"{args}: {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def _write_config(tmp: Path, name: str) -> Path:
    """A configuration in ``tmp/etc`` that keeps the daemon's files in ``tmp`` and
    listens on a free loopback port."""
    cfg = tmp / "etc" / "mtgpu.yaml"
    cfg.parent.mkdir()
    cfg.write_text(
        yaml.safe_dump(
            {
                "SSH_LISTEN": f"127.0.0.1:{free_port()}",
                "STATE_DIR": str(tmp / "state"),
                "RUN_DIR": str(tmp / "run"),
                "TENANT_HOME_ROOT": str(tmp / "homes"),
                "SERVER_NAME": name,
            }
        )
    )
    return cfg


def _status(tmp):
    return subprocess.run(
        [str(tmp / "bin" / "mtgpu-setup"), "status", "--config", str(tmp / "etc" / "mtgpu.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def tmp(tmp_path_factory):
    d = Path(tmp_path_factory.mktemp("setup"))
    d.chmod(0o755)
    for p in d.parents:
        if p == Path("/tmp"):
            break
        p.chmod(p.stat().st_mode | 0o005)
    yield d
    _setup(["uninstall", "--purge"], d, check=False)
    shutil.rmtree(d, ignore_errors=True)


def test_install_is_idempotent_status_and_uninstall_keep_state(tmp):
    """Also: installing leaves OpenSSH's configuration alone and never listens on 22."""
    sshd_cfg = Path("/etc/ssh/sshd_config")
    sshd_before = sshd_cfg.read_bytes() if sshd_cfg.exists() else None
    cfg = _write_config(tmp, "setuptest")
    port = int(yaml.safe_load(cfg.read_text())["SSH_LISTEN"].rsplit(":", 1)[1])
    before_cfg = cfg.read_text()
    first = _setup(["install", "--yes"], tmp)
    assert "keeping the existing" in first.stdout
    venv_python = tmp / "opt" / "venv" / "bin" / "python"
    # Built from the system Python, never from an interpreter under /root.
    home = subprocess.run(
        [str(venv_python), "-c", "import sys; print(sys.base_prefix)"], capture_output=True, text=True
    ).stdout.strip()
    assert not home.startswith("/root")
    assert os.stat(tmp / "opt" / "venv").st_mode & 0o005 == 0o005
    for name in ("mtgpu-server", "mtgpu-admin", "mtgpu-setup"):
        assert (tmp / "bin" / name).resolve() == (tmp / "opt" / "venv" / "bin" / name).resolve()
    # Completion and manual pages, made from the parsers, linked beside BIN_DIR.
    shell_files = [
        tmp / "share" / "bash-completion" / "completions" / "mt-job",
        tmp / "share" / "zsh" / "site-functions" / "_mtgpu-admin",
        tmp / "share" / "man" / "man1" / "mt-job.1",
        tmp / "share" / "man" / "man8" / "mtgpu-setup.8",
    ]
    for path in shell_files:
        assert path.is_symlink() and path.resolve().is_relative_to(tmp / "opt"), path
    assert "complete -F _mtgpu_mt_job mt-job" in shell_files[0].read_text()
    profile = tmp / "etc" / "profile.d" / "mtgpu-completion.sh"
    assert str(shell_files[0]) in profile.read_text()
    # Without systemd the daemon writes and rotates its own log.
    assert "--log-file" in Path(f"/proc/{int((tmp / 'run' / 'mtgpu.pid').read_text())}/cmdline").read_text()
    key = tmp / "state" / "ssh_host_ed25519_key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    unit = (tmp / "units" / "mtgpu.service").read_text()
    assert "KillMode=process" in unit
    pid1 = int((tmp / "run" / "mtgpu.pid").read_text())
    assert (sshd_cfg.read_bytes() if sshd_cfg.exists() else None) == sshd_before
    listening = subprocess.run(["ss", "-Htlnp"], capture_output=True, text=True).stdout
    ours = [line for line in listening.splitlines() if f"pid={pid1}," in line]
    assert ours and all(f":{port} " in line for line in ours)

    snapshot = {
        p: hashlib.sha256(p.read_bytes()).hexdigest() for p in [cfg, key, tmp / "units" / "mtgpu.service"]
    }
    second = _setup(["install", "--yes"], tmp)
    assert "already runs" in second.stdout
    assert int((tmp / "run" / "mtgpu.pid").read_text()) == pid1
    assert snapshot == {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in snapshot}
    assert cfg.read_text() == before_cfg

    st = _status(tmp)
    assert st.returncode == 0, st.stderr
    assert f"running (pid {pid1})" in st.stdout
    assert "version:    mtgpu 0.1.0" in st.stdout
    assert f"127.0.0.1:{port}" in st.stdout
    fp = subprocess.run(
        ["ssh-keygen", "-lf", str(key) + ".pub"], capture_output=True, text=True
    ).stdout.split()[1]
    assert fp in st.stdout

    # The file now says cluster, the daemon runs standalone: install refuses in one line
    # naming the restart, and leaves the daemon alone. --restart is that command.
    cfg.write_text(before_cfg + "CLUSTER_MODE: cluster\nCLUSTER_ID: setuptest\n")
    third = _setup(["install", "--yes"], tmp, check=False)
    assert third.returncode == 1, third.stdout + third.stderr
    restart = (
        f"{SETUP} install --yes --restart --prefix {tmp / 'opt'} --config {cfg} "
        f"--bin-dir {tmp / 'bin'} --unit-dir {tmp / 'units'} --log-file {tmp / 'mtgpu.log'}"
    )
    assert third.stdout.splitlines()[-1] == (
        f"mtgpu-setup: the running mtgpu-server (pid {pid1}) is standalone but {cfg} now says "
        "CLUSTER_MODE: cluster, and only a restart changes that; everything else is installed. "
        f"Run `{restart}`: only the daemon restarts, tenants' tmux sessions and running jobs carry on"
    ), third.stdout
    assert "already runs" not in third.stdout
    assert int((tmp / "run" / "mtgpu.pid").read_text()) == pid1
    assert "CLUSTER_KEY: " in cfg.read_text() and stat.S_IMODE(cfg.stat().st_mode) == 0o600
    cfg.write_text(before_cfg)
    restarted = _setup(["install", "--yes", "--restart"], tmp)
    assert f"stopped mtgpu-server (pid {pid1}) to restart it" in restarted.stdout
    assert int((tmp / "run" / "mtgpu.pid").read_text()) != pid1

    out = _setup(["uninstall"], tmp)
    assert "stopped mtgpu-server" in out.stdout
    assert not (tmp / "opt").exists() and not (tmp / "bin" / "mtgpu-admin").exists()
    assert not any(p.is_symlink() for p in shell_files) and not profile.exists()
    assert key.exists() and cfg.exists()
    _setup(["install", "--yes"], tmp)
    st = _status(tmp)
    assert fp in st.stdout  # the host key survived the reinstall

    _setup(["uninstall", "--purge"], tmp)
    assert not key.exists() and not cfg.exists()


def test_install_writes_documented_default_config(tmp):
    r = _setup(["install", "--yes", "--no-start"], tmp)
    assert "wrote" in r.stdout
    written = (tmp / "etc" / "mtgpu.yaml").read_text()
    assert written == (REPO / "etc" / "mtgpu.yaml").read_text()
    # Uninstall without --purge keeps the configuration.
    _setup(["uninstall"], tmp)
    assert (tmp / "etc" / "mtgpu.yaml").exists()


def test_install_refuses_without_yes(tmp):
    r = _setup(["install"], tmp, check=False)
    assert r.returncode == 1 and "--yes" in r.stdout


def test_unit_passes_systemd_analyze_verify(tmp):
    fake = tmp / "prefix"
    (fake / "venv" / "bin").mkdir(parents=True)
    (fake / "venv" / "bin" / "mtgpu-server").symlink_to(sys.executable)
    text = (
        (REPO / "etc" / "mtgpu.service")
        .read_text()
        .replace("@PREFIX@", str(fake))
        .replace("@CONFIG@", str(tmp / "mtgpu.yaml"))
    )
    # State it cannot read makes the daemon exit 3; systemd does not start it again.
    from mtgpu.server import EXIT_STATE_FORMAT

    assert f"RestartPreventExitStatus={EXIT_STATE_FORMAT}" in text.splitlines()
    unit = tmp / "mtgpu.service"
    unit.write_text(text)
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr
    # The verifier does see mistakes: the same unit with a bad KillMode is reported.
    unit.write_text(text.replace("KillMode=process", "KillMode=sometimes"))
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert "kill mode" in r.stderr.lower()


def test_missing_os_packages_are_listed_and_nothing_is_installed(tmp):
    """A host (a stand-in root with none of the commands) where no package can be installed."""
    root = tmp / "root"
    (root / "usr" / "bin").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MTGPU_CONFIG")}
    env.update(MTGPU_PYTHON="/usr/bin/python3", MTGPU_HOST_ROOT=str(root))
    r = subprocess.run(
        [
            SETUP,
            "install",
            "--yes",
            "--prefix",
            str(tmp / "opt"),
            "--bin-dir",
            str(tmp / "bin"),
            "--unit-dir",
            str(tmp / "units"),
            "--config",
            str(tmp / "etc" / "mtgpu.yaml"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    rows = {line.split()[0]: line.split()[1] for line in r.stdout.splitlines() if line.startswith("    ")}
    assert rows == {
        "tmux": "required",
        "openssh-sftp-server": "required",
        "util-linux": "required",
        "passwd": "required",
        "uidmap": "optional",
        "iproute2": "optional",
        "iptables": "optional",
        "gcc": "optional",
    }
    assert "without it: terminals" in r.stdout and "without it: the C fast paths" in r.stdout
    assert "MTGPU cannot work without tmux, openssh-sftp-server, util-linux, passwd" in r.stdout
    assert "--skip-os-packages" in r.stdout and "Nothing was changed" in r.stdout
    assert not (tmp / "opt").exists() and not (tmp / "etc" / "mtgpu.yaml").exists()


def _fresh_host_pip_env() -> dict[str, str]:
    """pip as a fresh host has it: no cache, no configuration file, no local wheels
    (only the certificate settings a proxy needs are kept)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k == "PIP_CERT"}
    env.update(PIP_NO_CACHE_DIR="1", PIP_CONFIG_FILE=os.devnull)
    return env


def _clean_clone(dst: Path) -> Path:
    """What a fresh clone of this tree holds: its tracked and not-ignored files."""
    names = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "-co", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, names):
        src = REPO / os.fsdecode(name)
        if src.is_file():
            target = dst / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    return dst


def test_the_readme_first_command_installs_from_nothing_with_pips_cache_off(tmp, monkeypatch):
    """The README's first command, from a fresh clone, with pip's cache off and no local
    wheels: every package, PySyncObj's source distribution too, is built here, under the
    launcher's environment (PYTHONSAFEPATH once broke that build)."""
    clone = _clean_clone(tmp / "clone")
    cfg = _write_config(tmp, "freshtest")
    for k, v in _fresh_host_pip_env().items():
        monkeypatch.setenv(k, v)
    for k in [k for k in os.environ if k.startswith("PIP_") and k not in _fresh_host_pip_env()]:
        monkeypatch.delenv(k)
    monkeypatch.setattr(sys.modules[__name__], "SETUP", str(clone / "bin" / "mtgpu-setup"))
    first = _setup(["install", "--yes"], tmp)
    assert "Traceback" not in first.stdout + first.stderr
    py = tmp / "opt" / "venv" / "bin" / "python"
    assert subprocess.run([str(py), "-I", "-c", "import pysyncobj, asyncssh"]).returncode == 0
    st = _status(tmp)
    assert st.returncode == 0 and "running (pid" in st.stdout, st.stdout + st.stderr
    _setup(["uninstall", "--purge"], tmp)
    for gone in (
        tmp / "opt",
        tmp / "state",
        cfg,
        tmp / "bin" / "mtgpu-admin",
        tmp / "units" / "mtgpu.service",
    ):
        assert not gone.exists() and not gone.is_symlink(), gone


def test_a_failed_pip_step_is_named_with_what_to_do_and_no_traceback(tmp, monkeypatch):
    """A package index that cannot be reached: the step, pip's words and the fix, in
    one line; no traceback."""
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    r = _setup(["install", "--yes"], tmp, check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "Traceback" not in out
    line = next(ln for ln in out.splitlines() if "Python dependencies" in ln)
    assert "failed (1): " in line and "run `mtgpu-setup install --yes` again" in line, line


def _pids_fence(limit: int) -> Path:
    """A pids cgroup of this test's own, so a run-away command cannot take the host."""
    v1 = Path("/sys/fs/cgroup/pids")
    base = v1 if (v1 / "cgroup.procs").exists() else Path("/sys/fs/cgroup")
    fence = base / f"mtgpu-test-fence-{os.getpid()}"
    fence.mkdir()
    (fence / "pids.max").write_text(f"{limit}\n")
    return fence


def _purge_in_a_fence(tmp: Path) -> None:
    """``uninstall --purge`` inside a pids fence of 40, given a minute: it must end
    well, print no traceback and never reach the fence's limit."""
    fence = _pids_fence(40)
    try:
        r = subprocess.run(
            [SETUP, "uninstall", "--purge", *_where(tmp)],
            capture_output=True,
            text=True,
            env=_env(),
            timeout=60,
            preexec_fn=lambda: (fence / "cgroup.procs").write_text(f"{os.getpid()}\n"),
        )
        assert r.returncode == 0, r.stdout + r.stderr
        assert "Traceback" not in r.stdout + r.stderr
        events = fence / "pids.events"
        assert not events.exists() or events.read_text().split() == ["max", "0"], events.read_text()
    finally:
        for pid in (fence / "cgroup.procs").read_text().split():
            os.kill(int(pid), 9)
        wait_for(lambda: not (fence / "cgroup.procs").read_text().strip(), 10, "the fence empties")
        fence.rmdir()


@pytest.mark.parametrize("stage", ["venv-only", "venv-without-dependencies"])
def test_uninstall_purge_after_a_half_done_install_ends_and_leaves_nothing(tmp, stage):
    """An install killed after making the virtualenv, or after pip put MTGPU in without
    its libraries: `unpublish` asks the virtualenv's Python once and never itself, and
    `uninstall --purge` ends at once and leaves nothing."""
    venv = tmp / "opt" / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    if stage == "venv-without-dependencies":
        site = next((venv / "lib").glob("python3*/site-packages"))
        shutil.copytree(REPO / "mtgpu", site / "mtgpu")
    cfg = tmp / "etc" / "mtgpu.yaml"
    cfg.parent.mkdir()
    cfg.write_text(yaml.safe_dump({"STATE_DIR": str(tmp / "state"), "RUN_DIR": str(tmp / "run")}))
    (tmp / "state").mkdir()
    _purge_in_a_fence(tmp)
    assert not (tmp / "opt").exists() and not cfg.exists() and not (tmp / "state").exists()


def _wheelhouse() -> Path:
    """MTGPU's dependencies and its build backend as wheels, made once and kept between
    runs, so that each install below takes seconds and needs no index."""
    import json
    import tomllib

    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    want = sorted([*meta["project"]["dependencies"], *meta["build-system"]["requires"]])
    tag = hashlib.sha256(json.dumps(want).encode()).hexdigest()[:12]
    d = Path.home() / ".cache" / "mtgpu-tests" / f"server-wheels-{tag}"
    if not (d / "complete").exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "-w", str(d), *want],
            check=True,
            capture_output=True,
            timeout=600,
        )
        (d / "complete").write_text("\n".join(want))
    return d


#: What install prints as it starts each step, in order; the install is killed as the
#: line arrives, so it dies inside the step that follows.
KILL_POINTS = {
    "making-the-venv": "creating the virtualenv",
    "in-pip": "installing MTGPU from",
    "making-host-keys": "keeping the existing",
    "linking-commands": "job-start helper",
    "writing-the-unit": "shell completion (bash, zsh)",
    "daemon-started": "started mtgpu-server",
    "at-the-end": "next: `mtgpu-admin invite",
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_uninstall_purge_after_an_install_killed_at_each_step_leaves_nothing(tmp, point):
    """The README's first command killed (SIGKILL, the whole process group, as a lost
    terminal or an impatient admin would) as each step begins; `uninstall --purge`
    then ends within a minute, inside a pids fence, and leaves no file, link, unit or
    process of MTGPU's behind."""
    wheels = _wheelhouse()
    _write_config(tmp, "killtest")
    argv = [SETUP, "install", "--yes", "--skip-os-packages", "--wheelhouse", str(wheels), *_where(tmp)]
    argv += ["--log-file", str(tmp / "mtgpu.log")]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), start_new_session=True
    )
    seen = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if KILL_POINTS[point] in line:
                os.killpg(proc.pid, 9)
                break
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        proc.wait(timeout=60)
    assert KILL_POINTS[point] in "".join(seen), "".join(seen)  # the step was reached
    pid_file = tmp / "run" / "mtgpu.pid"
    daemon = int(pid_file.read_text()) if pid_file.exists() else None
    _purge_in_a_fence(tmp)
    if daemon is not None:
        assert (
            not Path(f"/proc/{daemon}").exists()
            or b"mtgpu" not in Path(f"/proc/{daemon}/cmdline").read_bytes()
        )
    left = [
        str(p.relative_to(tmp))
        for p in sorted(tmp.rglob("*"))
        if (p.is_symlink() or not p.is_dir()) and p != tmp / "mtgpu.log"
    ]
    assert left == [], "\n".join(left)

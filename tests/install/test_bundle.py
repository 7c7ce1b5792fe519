"""The offline release bundle: built here, installed on a host with no route out, upgraded
under a logged-in tenant with a running job, and an older one refused.

The host is a network namespace whose only link is to a bridge on this machine (no
default route, so no registry), with its own copy of /etc for the accounts. The bundle
of this tree is built once, from the registry; the "previous release" is this tree
with a lower version, bundled offline from the first bundle's wheels.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from mtgpu_testing import REPO, ClientTerminal, Host, Network

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.tmux]

OLD = "0.0.1"


#: Wheels kept from one test run to the next, so that bundling asks the registry only
#: when a dependency changed.
WHEEL_CACHE = Path("/var/tmp/mtgpu-test-wheels")


def _bundle(out: Path, source: Path, *extra: str, check: bool = True) -> Path | None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("MTGPU_")}
    env["MTGPU_PYTHON"] = sys.executable  # a Python with pip, as on the admin's machine
    r = subprocess.run(
        [str(source / "bin" / "mtgpu-setup"), "bundle", "--output", str(out), *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    if not check and r.returncode != 0:
        return None
    assert r.returncode == 0, r.stdout + r.stderr
    (tarball,) = out.glob("mtgpu-*.tar.gz")
    assert f"wrote {tarball}" in r.stdout and "scp " in r.stdout
    return tarball


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    d = tmp_path_factory.mktemp("bundles")
    new = None
    if WHEEL_CACHE.is_dir():
        new = _bundle(d / "new", REPO, "--find-links", str(WHEEL_CACHE), "--no-index", check=False)
    new = new or _bundle(d / "new", REPO)  # from the registry
    with tarfile.open(new) as tar:
        tar.extractall(d / "unpacked")
    wheels = d / "unpacked" / "mtgpu-0.1.0" / "wheels"
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    for w in wheels.iterdir():
        if not w.name.startswith("mtgpu-") and not (WHEEL_CACHE / w.name).exists():
            tmp = WHEEL_CACHE / f".{w.name}.{os.getpid()}"  # another run may read it meanwhile
            shutil.copy2(w, tmp)
            os.replace(tmp, WHEEL_CACHE / w.name)
    src = d / "old-src"
    src.mkdir()
    for item in ("pyproject.toml", "README.md", "bin", "etc", "docs", "mtgpu"):
        s = REPO / item
        if s.is_dir():
            shutil.copytree(s, src / item, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(s, src / item)
    init = src / "mtgpu" / "__init__.py"
    init.write_text(init.read_text().replace('__version__ = "0.1.0"', f'__version__ = "{OLD}"'))
    old = _bundle(d / "old", src, "--find-links", str(wheels), "--no-index")
    yield new, old
    shutil.rmtree(d, ignore_errors=True)


def test_bundle_holds_mtgpu_and_every_dependency_as_wheels(bundles):
    new, _ = bundles
    with tarfile.open(new) as tar:
        names = tar.getnames()
        manifest = json.loads(tar.extractfile("mtgpu-0.1.0/BUNDLE.json").read())
    assert manifest["version"] == "0.1.0" and manifest["state_format"] == 2
    assert manifest["python"] == "{}.{}".format(*sys.version_info[:2])
    wheels = {n.split("/")[-1] for n in names if n.startswith("mtgpu-0.1.0/wheels/")}
    assert wheels == set(manifest["wheels"]) and all(w.endswith(".whl") for w in wheels)
    dists = {w.split("-")[0].lower().replace("_", "-") for w in wheels}
    assert {"mtgpu", "asyncssh", "pyyaml", "psutil", "pysyncobj", "libtmux", "cryptography"} <= dists
    assert "torch" not in dists
    assert "mtgpu-0.1.0/bin/mtgpu-setup" in names and not any("/tests/" in n for n in names)
    assert not any(n.endswith(".egg-info") or "/build/" in n for n in names)


def _install(host: Host, tree: Path, *, first: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("MTGPU_")}
    env.update(MTGPU_PYTHON="/usr/bin/python3", PIP_NO_INDEX="1")
    argv = [
        str(tree / "bin" / "mtgpu-setup"),
        "install",
        "--yes",
        "--prefix",
        str(host.dir / "opt"),
        "--bin-dir",
        str(host.dir / "bin"),
        "--unit-dir",
        str(host.dir / "units"),
        "--config",
        str(host.config_path),
        "--log-file",
        str(host.log_path),
    ]
    if first:  # the host's namespaces: its network (entered as nsenter does, keeping /sys), its /etc
        argv = [
            "nsenter",
            f"--net=/run/netns/{host.netns}",
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            f'mount --bind {host.etc} /etc && exec "$@"',
            "sh",
            *argv,
        ]
    else:  # the same namespaces, entered through the running daemon
        argv = ["nsenter", "-t", str(host._server_pid()), "-m", "-n", *argv]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)


def _version(host: Host) -> str:
    r = subprocess.run(
        [str(host.dir / "bin" / "mtgpu-setup"), "status", "--config", str(host.config_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return next(line.split()[-1] for line in r.stdout.splitlines() if line.startswith("version:"))


def _job(host: Host, key: Path, jid: str) -> dict:
    r = host.ssh("bea", key, "mt-job", "show", jid, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _wait_job(host: Host, key: Path, jid: str, states: set[str]) -> dict:
    deadline = time.time() + 30
    while (j := _job(host, key, jid))["state"] not in states:
        assert time.time() < deadline, j
        time.sleep(0.2)
    return j


def test_offline_install_then_upgrade_keeps_terminal_and_job_and_older_refuses(bundles):
    new, old = bundles
    net = Network()
    host = net.add(Host(name="offline"))
    terms: list[ClientTerminal] = []
    try:
        route = subprocess.run(
            ["ip", "netns", "exec", host.netns, "ip", "route", "get", "1.1.1.1"],
            capture_output=True,
            text=True,
        )
        assert route.returncode != 0  # no route out of this host: no registry
        upload = host.dir / "upload"  # where the admin unpacks what scp brought
        upload.mkdir()
        for tarball in (old, new):
            with tarfile.open(tarball) as tar:
                tar.extractall(upload)

        r = _install(host, upload / f"mtgpu-{OLD}", first=True)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "from the bundle's wheels" in r.stdout and "offline" in r.stdout
        assert _version(host) == OLD
        first_pid = host._server_pid()

        key = host.add_user("bea")
        term = ClientTerminal(host, "bea", key)
        terms.append(term)
        term.wait_for("$")
        term.type("echo marker-$((6*7))")
        term.wait_for("marker-42")
        script = "#!/bin/bash\nwhile [ ! -e ~/go ]; do sleep 0.1; done\necho finished\n"
        sub = host.ssh("bea", key, "mt-job", "submit", "--parsable", "-", input=script.encode())
        assert sub.returncode == 0, sub.stderr
        jid = sub.stdout.decode().strip()
        _wait_job(host, key, jid, {"RUNNING"})

        r = _install(host, upload / "mtgpu-0.1.0", first=False)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "tmux sessions and running jobs are kept" in r.stdout
        assert host._server_pid() != first_pid and _version(host) == "0.1.0"
        stamp = json.loads((host.state_dir / "release.json").read_text())
        assert (stamp["version"], stamp["state_format"]) == ("0.1.0", 2)

        # The job ran on through the upgrade, and completes now.
        assert _job(host, key, jid)["state"] == "RUNNING"
        assert host.ssh("bea", key, "touch", "go").returncode == 0
        done = _wait_job(host, key, jid, {"COMPLETED", "FAILED", "NODE_FAIL", "CANCELLED"})
        assert done["state"] == "COMPLETED", done
        assert Path(done["stdout"]).read_text() == "finished\n"
        # The terminal too: a new login re-attaches the same tmux session, screen and all.
        again = ClientTerminal(host, "bea", key)
        terms.append(again)
        again.wait_for("marker-42")

        pid = host._server_pid()
        r = _install(host, upload / f"mtgpu-{OLD}", first=False)
        assert r.returncode == 1
        assert f"this is MTGPU {OLD}" in r.stdout and "older than MTGPU 0.1.0" in r.stdout
        assert "nothing was changed" in r.stdout
        assert host._server_pid() == pid
        assert json.loads((host.dir / "opt" / "release.json").read_text())["version"] == "0.1.0"
    finally:
        for t in terms:
            t.close()
        if (host.run_dir / "mtgpu.pid").exists():
            subprocess.run(
                [
                    "nsenter",
                    "-t",
                    str(host._server_pid()),
                    "-m",
                    "-n",
                    str(host.dir / "bin" / "mtgpu-setup"),
                    "uninstall",
                    "--purge",
                    "--prefix",
                    str(host.dir / "opt"),
                    "--bin-dir",
                    str(host.dir / "bin"),
                    "--unit-dir",
                    str(host.dir / "units"),
                    "--config",
                    str(host.config_path),
                ],
                capture_output=True,
                timeout=60,
            )
        host.cleanup()
        net.close()


def test_a_bundle_for_another_machine_is_refused_before_anything_changes(bundles, tmp_path):
    new, _ = bundles
    with tarfile.open(new) as tar:
        tar.extractall(tmp_path)
    tree = tmp_path / "mtgpu-0.1.0"
    manifest = json.loads((tree / "BUNDLE.json").read_text())
    (tree / "BUNDLE.json").write_text(json.dumps({**manifest, "python": "3.99", "machine": "s390x"}))
    have = subprocess.run(
        ["/usr/bin/python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    machine = os.uname().machine
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("MTGPU_")}
    env["MTGPU_PYTHON"] = "/usr/bin/python3"
    r = subprocess.run(
        [
            str(tree / "bin" / "mtgpu-setup"),
            "install",
            "--yes",
            "--prefix",
            str(tmp_path / "opt"),
            "--config",
            str(tmp_path / "mtgpu.yaml"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 1
    assert f"wheels for Python 3.99 on s390x, but this host has Python {have} on {machine}" in r.stdout
    assert f"--python-version {have} --platform manylinux2014_{machine}" in r.stdout
    assert not (tmp_path / "opt").exists() and not (tmp_path / "mtgpu.yaml").exists()

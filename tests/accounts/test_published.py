"""Published datasets and Python interpreters, on a real host, driven by real ssh.

One host for the module: a dataset whose files are mode 0666/0777, a missing one,
the system ``/usr/bin/python3``, an interpreter with a prefix of its own (a venv,
also made writable by mode) and a broken interpreter path.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from mtgpu_testing import Host, python_env

pytestmark = pytest.mark.root

SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture(scope="module")
def pub():
    base = Path(tempfile.mkdtemp(prefix="mtgpu-pub-", dir="/tmp"))
    os.chmod(base, 0o755)
    ds = base / "imagenet"
    (ds / "open").mkdir(parents=True)
    (ds / "labels.txt").write_text("cat\ndog\n")
    os.chmod(ds, 0o777)
    os.chmod(ds / "open", 0o777)
    os.chmod(ds / "labels.txt", 0o666)
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(base / "sealed")], check=True)
    os.chmod(base / "sealed", 0o777)
    os.chmod(base / "sealed" / "pyvenv.cfg", 0o666)
    host = Host(
        {
            "DATASETS_DIRECTORIES": [str(ds), str(base / "absent")],
            "PYTHON_INTERPRETERS": [
                SYSTEM_PYTHON,
                {"broken": "/nonexistent/bin/python3"},
                {"sealed": str(base / "sealed" / "bin" / "python")},
            ],
        }
    )
    host.start()
    keys = {name: host.add_user(name) for name in ("ann", "bob")}
    yield host, base, keys
    host.cleanup()
    shutil.rmtree(base, ignore_errors=True)


def sh(host: Host, key: Path, user: str, script: str) -> subprocess.CompletedProcess[str]:
    r = host.ssh(user, key, script)
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(), r.stderr.decode())


def test_every_tenant_reads_a_dataset_both_ways_and_writes_it_no_way(pub):
    host, base, keys = pub
    src = base / "imagenet"
    for user in ("ann", "bob"):
        script = "; ".join(
            [
                "cat /datasets/imagenet/labels.txt",
                "cat ~/datasets/imagenet/labels.txt",
                "readlink ~/datasets",
                # The files' own modes allow all of this; the read-only mounts do not.
                "echo x >> /datasets/imagenet/labels.txt",
                "echo x >> ~/datasets/imagenet/labels.txt",
                f"echo x >> {src}/labels.txt",
                "touch /datasets/imagenet/open/new",
                f"touch {src}/open/new",
                f"mkdir {src}/sub",
                f"rm {src}/labels.txt",
                "mkdir /datasets/mine",
                "echo end",
            ]
        )
        r = sh(host, keys[user], user, script)
        out = r.stdout.splitlines()
        assert out == ["cat", "dog", "cat", "dog", "/datasets", "end"], (r.stdout, r.stderr)
        assert r.stderr.count("Read-only file system") == 7, r.stderr
        assert "/datasets/mine" in r.stderr and "Permission denied" in r.stderr
        link = host.homes / user / "datasets"
        assert os.lstat(link).st_uid == int(host.passwd(user)[2])
    assert (src / "labels.txt").read_text() == "cat\ndog\n"
    assert sorted(os.listdir(src)) == ["labels.txt", "open"] and not os.listdir(src / "open")


def test_an_interpreter_with_its_own_prefix_is_read_only_too(pub):
    host, base, keys = pub
    r = sh(host, keys["ann"], "ann", f"touch {base}/sealed/x; echo y >> {base}/sealed/pyvenv.cfg")
    assert r.stderr.count("Read-only file system") == 2, r.stderr
    assert not (base / "sealed" / "x").exists()


def test_mt_python_lists_the_working_interpreters(pub):
    host, base, keys = pub
    r = sh(host, keys["ann"], "ann", "mt-python list --json")
    assert r.returncode == 0, r.stderr
    found = {i["name"]: i for i in json.loads(r.stdout)}
    version = subprocess.run(
        [SYSTEM_PYTHON, "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    system = "python" + ".".join(version.split(".")[:2])
    assert set(found) == {system, "sealed"}  # the broken one is skipped
    assert found[system]["path"] == SYSTEM_PYTHON and found[system]["version"] == version
    assert found["sealed"]["prefix"] == str(base / "sealed")
    text = sh(host, keys["ann"], "ann", "mt-python list").stdout
    assert system in text and SYSTEM_PYTHON in text and version in text


def test_mt_python_venv_makes_the_tenants_own_working_venv(pub):
    host, base, keys = pub
    uid = int(host.passwd("bob")[2])
    r = sh(host, keys["bob"], "bob", "mt-python list --json")
    system = next(i["name"] for i in json.loads(r.stdout) if i["path"] == SYSTEM_PYTHON)
    # --without-pip: ensurepip would add 10 s; the venv itself is the same.
    r = sh(
        host,
        keys["bob"],
        "bob",
        f"mt-python venv ~/v --interpreter {system} --without-pip && ~/v/bin/python -c "
        "'import os, sys; print(sys.prefix, sys.base_prefix, os.getuid())'",
    )
    assert r.returncode == 0, r.stderr
    venv = host.homes / "bob" / "v"
    assert r.stdout.splitlines()[-1] == f"{venv} /usr {uid}"
    assert (venv / "pyvenv.cfg").stat().st_uid == uid and venv.stat().st_uid == uid
    r = sh(host, keys["bob"], "bob", "mt-python venv /tmp/elsewhere --without-pip")
    assert r.returncode != 0 and "is outside your home" in r.stderr and not Path("/tmp/elsewhere").exists()
    r = sh(host, keys["bob"], "bob", "mt-python venv ~/w --interpreter broken")
    assert r.returncode != 0 and "no published interpreter is named 'broken'" in r.stderr


def test_mt_python_run_runs_one_as_the_tenant(pub):
    host, base, keys = pub
    uid = int(host.passwd("ann")[2])
    r = sh(
        host,
        keys["ann"],
        "ann",
        "mt-python run sealed -- -c 'import os, sys; print(os.getuid(), sys.prefix)'",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{uid} {base / 'sealed'}"


def test_status_reports_a_broken_interpreter_and_a_missing_dataset(pub):
    host, base, _ = pub
    r = subprocess.run(
        [sys.executable, "-m", "mtgpu.install.setup", "status", "--config", str(host.config_path)],
        capture_output=True,
        text=True,
        env=python_env(),
    )
    assert r.returncode == 0, r.stderr
    assert f"/datasets/imagenet  from {base}/imagenet, read-only" in r.stdout
    assert f"absent: NOT PUBLISHED: {base}/absent does not exist" in r.stdout
    assert "broken: NOT PUBLISHED: /nonexistent/bin/python3 does not exist" in r.stdout
    assert "sealed  Python" in r.stdout
    assert "not published: interpreter broken" in host.log()


def test_a_reload_publishes_a_new_dataset_and_links_existing_homes(pub):
    host, base, keys = pub
    extra = base / "extra"
    extra.mkdir()
    (extra / "readme").write_text("hello\n")
    os.chmod(extra, 0o755)
    os.chmod(extra / "readme", 0o666)
    link = host.homes / "ann" / "datasets"
    link.unlink()  # as if ann's account predated the datasets
    host.config["DATASETS_DIRECTORIES"] = [*host.config["DATASETS_DIRECTORIES"], str(extra)]
    host.write_config()
    os.kill(host._server_pid(), signal.SIGHUP)
    deadline = time.time() + 20
    while not os.path.islink(link) and time.time() < deadline:
        time.sleep(0.05)
    r = sh(host, keys["ann"], "ann", "cat ~/datasets/extra/readme; echo x >> /datasets/extra/readme")
    assert r.stdout == "hello\n" and "Read-only file system" in r.stderr, (r.stdout, r.stderr)

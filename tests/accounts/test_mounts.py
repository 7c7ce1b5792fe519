"""The publisher's mounts in a private mount namespace, and how interpreters are named."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from mtgpu_testing import python_env

from mtgpu.accounts.published import plan_interpreters
from mtgpu.config import InterpreterSpec


def test_interpreters_are_named_from_their_version_unless_named_and_a_taken_name_is_skipped():
    versions = {
        "/a/python3": "3.11.2",
        "/b/python3": "3.11.9",
        "/c/python3": "3.12.1",
        "/d/python3": "3.10.0",
    }

    def probe(path):
        if path not in versions:
            return {"problem": f"{path} does not exist"}
        return {"version": versions[path], "prefix": "/opt/" + path[1], "pip": True, "venv": True}

    got = plan_interpreters(
        [
            InterpreterSpec("/a/python3"),
            InterpreterSpec("/b/python3"),
            InterpreterSpec("/c/python3", "py312"),
            InterpreterSpec("/d/python3", "python3.11"),
            InterpreterSpec("/e/python3", "gone"),
        ],
        probe,
    )
    assert [(i.name, i.ok) for i in got] == [
        ("python3.11", False),
        ("python3.11", False),
        ("py312", True),
        ("python3.11", True),
        ("gone", False),
    ]
    # An explicit name wins over a name made from a version; the problem says what to do.
    assert "/d/python3 has" in got[0].problem and "(NAME: /a/python3)" in got[0].problem
    assert got[2].read_only and got[2].prefix == "/opt/c"


SCRIPT = textwrap.dedent("""
    import errno, os, sys
    from mtgpu.accounts import mounts
    from mtgpu.accounts.published import Publisher
    from mtgpu.config import load_text

    base = sys.argv[1]
    src = f"{base}/corpus"

    def writable(path):
        try:
            with open(path, "a"):
                return True
        except OSError as exc:
            assert exc.errno == errno.EROFS, exc
            return False

    p = Publisher(f"{base}/run")
    on = load_text(f"DATASETS_DIRECTORIES: [{src}]")
    pub = p.apply(on)
    assert [d.ok for d in pub.datasets] == [True], pub
    # Read-only for root too: the mount, not the mode, refuses.
    assert not writable(f"{src}/a.txt") and not writable("/datasets/corpus/a.txt")
    assert not writable(f"{src}/inner/b.txt")  # a filesystem mounted inside it as well
    assert open("/datasets/corpus/inner/b.txt").read() == "b"
    p.apply(on)  # again, as after a restart: nothing more is mounted
    assert sum(m.path == src for m in mounts.table()) == 1
    p.apply(load_text(""))  # removed from the configuration: undone
    assert writable(f"{src}/a.txt") and not os.path.exists("/datasets/corpus")
    other = f"{base}/other/corpus"  # the same name, another directory: it replaces the first
    p.apply(load_text(f"DATASETS_DIRECTORIES: [{other}]"))
    assert sorted(os.listdir("/datasets/corpus")) == ["c.txt"] and writable(f"{src}/a.txt")
    p.apply(on)
    assert p.undo_all()
    assert writable(f"{src}/a.txt") and writable(f"{src}/inner/b.txt")
    assert not [m for m in mounts.table() if m.path.startswith(("/datasets", src))
                and m.path != f"{src}/inner"]
    print("OK")
""")


@pytest.mark.root
def test_publish_is_read_only_for_everyone_idempotent_and_undone(tmp_path):
    (tmp_path / "run").mkdir()
    corpus = tmp_path / "corpus"
    (corpus / "inner").mkdir(parents=True)
    (corpus / "a.txt").write_text("a")
    (tmp_path / "other" / "corpus").mkdir(parents=True)
    (tmp_path / "other" / "corpus" / "c.txt").write_text("c")
    script = (
        f"mount -t tmpfs inner {corpus}/inner && echo -n b > {corpus}/inner/b.txt && "
        f"exec {sys.executable} -c '{SCRIPT}' {tmp_path}"
    )
    r = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        env=python_env(),
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout.strip() == "OK", r.stderr

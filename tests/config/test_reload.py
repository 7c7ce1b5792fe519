"""A reload (SIGHUP, `mtgpu-setup reload`) applies each changed key or names it as
needing a restart, keeping its old value in force: never a silent "reloaded"."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest
import yaml
from mtgpu_testing import REPO, python_env, wait_for

from mtgpu.config.options import _KEYS, APPLIED, RELOAD, RESTART, Options, plan_reload


def test_every_key_of_the_options_is_classified_for_reload():
    assert set(RELOAD) == set(_KEYS), set(RELOAD) ^ set(_KEYS)
    assert set(RELOAD.values()) <= {APPLIED, RESTART}
    for key in RELOAD:  # one field per key: a reload compares and keeps by that field
        assert key.lower() in Options.__dataclass_fields__, key


def test_a_reload_keeps_the_old_value_of_every_restart_key():
    old = Options()
    changed = Options(
        tenant_uid_range=(30000, 30099),
        cluster_lost_after=99.0,
        ssh_login_grace_time=5.0,
        allow_agent_forwarding=True,
        priority_aging=1.0,
        admins=("ann",),
        user_disk_limit=1 << 30,
    )
    plan = plan_reload(old, changed)
    assert set(plan.needs_restart) == {
        "TENANT_UID_RANGE",
        "CLUSTER_LOST_AFTER",
        "SSH_LOGIN_GRACE_TIME",
        "ALLOW_AGENT_FORWARDING",
        "PRIORITY_AGING",
    }
    assert set(plan.applied) == {"ADMINS", "USER_DISK_LIMIT"}
    for key in plan.needs_restart:
        assert getattr(plan.options, key.lower()) == getattr(old, key.lower()), key
    for key in plan.applied:
        assert getattr(plan.options, key.lower()) == getattr(changed, key.lower()), key
    assert plan_reload(old, old).applied == plan_reload(old, old).needs_restart == ()


def _applied_list(text: str) -> set[str]:
    """The keys a document says a reload applies: the KEY words after its marker."""
    m = re.search(r"[Aa]\s+reload\s+applies\s+these\s+keys\s+at\s+once:(.*?)(?:\.\s|\.$)", text, re.DOTALL)
    assert m, "the document lists the keys a reload applies"
    return set(re.findall(r"\b[A-Z][A-Z_]{2,}\b", m.group(1)))


def test_the_example_config_and_the_manual_list_the_keys_a_reload_applies():
    applied = {k for k, v in RELOAD.items() if v == APPLIED}
    assert _applied_list((REPO / "etc" / "mtgpu.yaml").read_text()) == applied
    assert _applied_list((REPO / "docs" / "manual.md").read_text()) == applied


# ------------------------------------------------------------ on a real daemon


def _setup_reload(host) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mtgpu.install.setup", "reload", "--config", str(host.config_path)],
        capture_output=True,
        text=True,
        env=python_env(),
        timeout=60,
        check=False,
    )


def _write(host, **changes) -> None:
    """The host's file with ``changes``; ``host.config`` is left as it was (the harness
    cleans up by the UID range it started with)."""
    host.config_path.write_text(yaml.safe_dump({**host.config, **changes}))


@pytest.mark.root
def test_an_applied_key_takes_effect_on_reload(make_host):
    host = make_host()
    key = host.add_user("hal")
    r = host.ssh("hal", key, "mtgpu-admin whoami --json")
    assert r.returncode == 0 and json.loads(r.stdout)["admin"] is False, r.stderr
    _write(host, ADMINS=["hal"], USER_DISK_LIMIT="5G")
    out = _setup_reload(host)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "applied: ADMINS, USER_DISK_LIMIT" in out.stdout, out.stdout
    assert "needs a restart" not in out.stdout
    r = host.ssh("hal", key, "mtgpu-admin whoami --json")
    assert r.returncode == 0 and json.loads(r.stdout)["admin"] is True, r.stderr
    log = host.log_path.read_text()
    assert "configuration reloaded" in log and "applied: ADMINS, USER_DISK_LIMIT" in log
    assert "need a restart" not in log


@pytest.mark.root
def test_a_restart_key_is_named_on_reload_and_its_old_value_stays_in_force(make_host):
    host = make_host()
    lo, hi = (int(x) for x in host.config["TENANT_UID_RANGE"].split("-"))
    mid = lo + (hi - lo) // 2
    # The upper half of the host's own UID block: a user added after the reload shows
    # which range is in force.
    _write(host, TENANT_UID_RANGE=f"{mid}-{hi}", SSH_LOGIN_GRACE_TIME="5s")
    out = _setup_reload(host)
    assert out.returncode == 0, out.stdout + out.stderr
    for name in ("TENANT_UID_RANGE", "SSH_LOGIN_GRACE_TIME"):
        assert f"{name} needs a restart" in out.stdout, out.stdout
    assert "applied: no key changed" in out.stdout
    log = host.log_path.read_text()
    assert "TENANT_UID_RANGE, SSH_LOGIN_GRACE_TIME changed but need a restart" in log, log[-2000:]
    key = host.add_user("rex")
    assert host.ssh("rex", key, "true").returncode == 0
    uid = int(host.passwd("rex")[2])
    assert lo <= uid < mid, (uid, lo, mid)  # the old range allocated it
    # SIGHUP says the same in the log.
    before = host.log_path.read_text().count("need a restart")
    os.kill(host._server_pid(), signal.SIGHUP)
    wait_for(
        lambda: host.log_path.read_text().count("need a restart") > before, 30, "the SIGHUP reload's log line"
    )


@pytest.mark.root
def test_setup_reload_refuses_a_bad_file_and_the_daemon_keeps_its_configuration(make_host):
    host = make_host()
    host.config_path.write_text(host.config_path.read_text() + "USER_DISK_LIMIT: 20Q\n")
    out = _setup_reload(host)
    assert out.returncode == 2 and "USER_DISK_LIMIT" in out.stdout and "not reloaded" in out.stdout, (
        out.stdout
    )
    assert host.api("whoami")["ok"]

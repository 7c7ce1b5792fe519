"""LOCAL_ACCOUNTS and retired tenants, decided by a pure function; user names."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mtgpu.accounts.local import LocalFacts, refusal, shadow_expired
from mtgpu.accounts.names import check_username
from mtgpu.accounts.registry import WRONG_CODE, Registry, hash_code
from mtgpu.config import load_text
from mtgpu.errors import AccountError, ConfigError

PLAIN = LocalFacts("olga", 1001, "Olga", "/bin/bash", False, False, False, None)
ADMIN = replace(PLAIN, name="boss", admin=True)
GRANTED = replace(PLAIN, grant=True)
REVOKED = replace(PLAIN, grant=False)


@pytest.mark.parametrize(
    "facts,policy,allowed",
    [
        (PLAIN, "allow", True),
        (PLAIN, "admins", False),
        (PLAIN, "deny", False),
        (ADMIN, "allow", True),
        (ADMIN, "admins", True),
        (ADMIN, "deny", False),
        (GRANTED, "allow", True),
        (GRANTED, "admins", True),
        (GRANTED, "deny", False),
        (REVOKED, "allow", False),
        (REVOKED, "admins", False),
        (REVOKED, "deny", False),
        (replace(ADMIN, grant=False), "admins", False),
    ],
)
def test_local_accounts_policy_table(facts, policy, allowed):
    why = refusal(facts, policy, "alpha")
    assert (why is None) == allowed, why
    if not allowed:
        assert "olga" in why or "boss" in why


@pytest.mark.parametrize(
    "facts",
    [
        replace(ADMIN, retired_uid=True),  # the registry gave this UID out
        replace(ADMIN, gecos="MTGPU tenant"),  # MTGPU made the account
        replace(ADMIN, expired=True),  # usermod --expiredate
        replace(ADMIN, shell="/usr/sbin/nologin"),
        replace(ADMIN, shell="/bin/false"),
    ],
)
def test_retired_expired_and_nologin_accounts_are_refused_whatever_the_policy(facts):
    for policy in ("allow", "admins", "deny"):
        assert refusal(facts, policy, "alpha") is not None


def test_removed_tenant_is_told_so():
    why = refusal(replace(PLAIN, retired_uid=True), "allow", "alpha")
    assert "removed from MTGPU" in why


def test_shadow_expiry_is_read_from_field_eight(tmp_path):
    shadow = tmp_path / "shadow"
    shadow.write_text(
        "old:!:19000:0:99999:7::1:\nnew:!:19000:0:99999:7:::\nlater:!:19000:0:99999:7::99999:\n"
    )
    assert shadow_expired("old", str(shadow))
    assert not shadow_expired("new", str(shadow))
    assert not shadow_expired("later", str(shadow))
    assert not shadow_expired("absent", str(shadow))
    assert not shadow_expired("old", str(tmp_path / "missing"))


def test_local_accounts_key_is_validated():
    assert load_text("").local_accounts == "allow"
    assert load_text("LOCAL_ACCOUNTS: Deny\n").local_accounts == "deny"
    with pytest.raises(ConfigError, match="LOCAL_ACCOUNTS.*allow, admins or deny"):
        load_text("LOCAL_ACCOUNTS: some\n")


@pytest.mark.parametrize("name", ["alice\n", "alice\r\n", "\nalice", "ali\nce"])
def test_user_names_with_a_newline_are_refused(name):
    with pytest.raises(AccountError, match="not a valid user name"):
        check_username(name)


def test_admins_names_with_a_trailing_newline_are_refused():
    with pytest.raises(ConfigError, match="ADMINS"):
        load_text('ADMINS: ["boss\\n"]\n')


# ---------------------------------------------------------------- invites


def _invite(reg: Registry) -> None:
    reg.create_invite("ivy", hash_code("right-code"), 1000.0, False, 0.0, "root", _doApply=True)


def _redeem(reg: Registry, code: str, key: str) -> dict:
    return reg.redeem_invite("ivy", hash_code(code), key, 1.0, [], 3, (20000, 20010), "alpha", _doApply=True)


def test_a_strangers_wrong_codes_bar_only_the_strangers_key():
    reg = Registry((20000, 20010))
    _invite(reg)
    stranger, ivy = "ssh-ed25519 AAAAstranger", "ssh-ed25519 AAAAivy"
    answers = [_redeem(reg, "wrong", stranger) for _ in range(5)]
    # One answer for every refusal: nothing tells whether an invite exists or how
    # often someone tried.
    assert {a["error"] for a in answers} == {WRONG_CODE}
    assert all("tries" not in a["error"] and "revoked" not in a["error"] for a in answers)
    assert reg.pending_invite("ivy", 1.0, stranger, 3) is None  # barred at authentication
    assert reg.pending_invite("ivy", 1.0, ivy, 3) is not None  # still open for ivy
    r = _redeem(reg, "right-code", ivy)
    assert "error" not in r and r["name"] == "ivy"


def test_no_invite_and_expired_invite_read_like_a_wrong_code():
    reg = Registry((20000, 20010))
    assert _redeem(reg, "x", "ssh-ed25519 AAAA")["error"] == WRONG_CODE
    reg.create_invite("ivy", hash_code("c"), 0.5, False, 0.0, "root", _doApply=True)
    assert _redeem(reg, "c", "ssh-ed25519 AAAA")["error"] == WRONG_CODE

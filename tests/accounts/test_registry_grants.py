"""Grants and carried records in the user registry (its replicated methods, applied
directly): one UID per user everywhere, clashes refused, revokes that keep the UID."""

from __future__ import annotations

from mtgpu.accounts.registry import Registry

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBoxzmTYIh alice@laptop"
KEY2 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIP5clRj carol@laptop"


def reg() -> Registry:
    return Registry((30000, 30009))


def test_a_user_added_here_is_granted_this_cluster_only():
    r = reg()
    r.add_user("bob", [KEY], False, 1.0, [], "root", None, ["alpha"], _doApply=True)
    assert r.granted("bob", "alpha") and not r.granted("bob", "beta")
    assert not r.granted("nobody", "alpha")


def test_carried_record_keeps_its_uid_and_merges_keys():
    r = reg()
    out = r.import_user("alice", [KEY], 30005, False, "beta", 1.0, _doApply=True)
    assert out == {"name": "alice", "uid": 30005, "granted": False, "created": True, "keys_added": 1}
    assert not r.granted("alice", "beta")
    # The UID is reserved: the next user added here does not get it.
    r.add_user(
        "bob", [KEY2], False, 2.0, [30000, 30001, 30002, 30003, 30004], "root", None, ["beta"], _doApply=True
    )
    assert r.get("bob")["uid"] == 30006
    out = r.import_user("alice", [KEY, KEY2], 30005, True, "beta", 3.0, _doApply=True)
    assert out["granted"] and not out["created"] and out["keys_added"] == 1
    assert r.get("alice")["keys"] == [KEY, KEY2] and r.get("alice")["admin"] is False


def test_clashing_uids_are_refused():
    r = reg()
    r.add_user("bob", [KEY], False, 1.0, [], "root", None, ["beta"], _doApply=True)
    bob = r.get("bob")["uid"]
    assert r.import_user("carol", [KEY2], bob, True, "beta", 2.0, _doApply=True) == {
        "error": f"UID {bob} belongs to the user 'bob' here",
        "code": "uid_conflict",
    }
    assert r.get("carol") is None
    assert (
        r.import_user("bob", [KEY], bob + 1, True, "beta", 2.0, _doApply=True)["error"]
        == f"'bob' already has UID {bob} here, not {bob + 1}"
    )
    r.remove_user("bob", 3.0, "root", _doApply=True)
    assert "removed user" in r.import_user("dan", [KEY2], bob, True, "beta", 4.0, _doApply=True)["error"]


def test_revoke_keeps_the_record_and_an_invite_grants_again():
    r = reg()
    r.add_user("bob", [KEY], False, 1.0, [], "root", None, ["alpha"], _doApply=True)
    assert r.set_grant("bob", "alpha", False, _doApply=True)["changed"]
    assert not r.granted("bob", "alpha") and r.get("bob")["uid"] == 30000
    assert not r.set_grant("bob", "alpha", False, _doApply=True)["changed"]
    assert r.set_grant("nobody", "alpha", False, _doApply=True)["code"] == "not_found"
    r.create_invite("bob", "h", 100.0, False, 1.0, "root", _doApply=True)
    r.redeem_invite("bob", "h", KEY2, 2.0, [], 3, None, "alpha", _doApply=True)
    assert r.granted("bob", "alpha") and len(r.get("bob")["keys"]) == 2

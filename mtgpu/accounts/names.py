"""Which user names MTGPU accepts for tenants."""

from __future__ import annotations

import pwd
import re

from mtgpu.errors import AccountError

# fullmatch, not match with "$": "$" also matches before a final newline.
_VALID = re.compile(r"[a-z][a-z0-9_-]{0,31}")
# Names that must never become tenants even where no such local account exists.
RESERVED = frozenset(
    {
        "root",
        "daemon",
        "bin",
        "sys",
        "sync",
        "nobody",
        "sshd",
        "mtgpu",
        "admin",
        "raft",
        "operator",
        "adm",
        "wheel",
        "sudo",
        "git",
    }
)


def check_username(name: str, *, system_uid_max: int = 999) -> str:
    """Return ``name`` if it may be a tenant; raise AccountError saying why not.

    >>> check_username("alice")
    'alice'
    >>> check_username("../x")
    Traceback (most recent call last):
    ...
    mtgpu.errors.AccountError: '../x' is not a valid user name: use 1-32 lower-case letters, digits, '-' or '_', starting with a letter
    >>> check_username("alice\\n")
    Traceback (most recent call last):
    ...
    mtgpu.errors.AccountError: 'alice\\n' is not a valid user name: use 1-32 lower-case letters, digits, '-' or '_', starting with a letter
    """
    if not isinstance(name, str) or not _VALID.fullmatch(name):
        raise AccountError(
            f"{name!r} is not a valid user name: use 1-32 lower-case letters, "
            "digits, '-' or '_', starting with a letter"
        )
    if name in RESERVED:
        raise AccountError(f"{name!r} is reserved for the system and cannot be a tenant; choose another name")
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        return name
    if pw.pw_uid <= system_uid_max:
        raise AccountError(
            f"{name!r} is a system account (UID {pw.pw_uid}) and cannot be a tenant; choose another name"
        )
    return name

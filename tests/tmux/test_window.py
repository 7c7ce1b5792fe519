"""``mt-container shell`` on a terminal: mtgpu.tmux.window opens the command in a window
of the tenant's tmux and attaches, as the tenant, in a real pty."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Tenant, Terminal

pytestmark = [pytest.mark.tmux, pytest.mark.root]

PYTHON = sys.executable
Tenants = Callable[[], "Tenant"]
Terminals = Callable[..., "Terminal"]


def window(*args: str) -> list[str]:
    return [PYTHON, "-P", "-m", "mtgpu.tmux.window", *args]


def windows(t: Tenant, session: str) -> list[str]:
    return t.tmux(
        "list-windows", "-t", f"={session}", "-F", "#{window_name}:#{pane_current_command}", check=False
    ).stdout.split()


def test_the_command_runs_in_its_session_and_a_second_one_in_a_new_window(
    tenant: Tenants, terminals: Terminals
) -> None:
    a = tenant()
    terminals(a, window("--", "ws-box", "box", a.home, "sleep 1000"))
    a.until(lambda: a.sessions().get("ws-box") == 1, what=lambda: f"ws-box attached; have {a.sessions()}")
    a.until(lambda: windows(a, "ws-box") == ["box:sleep"], what=lambda: windows(a, "ws-box"))
    # The server it started goes away when empty, as after a login.
    assert a.tmux("show", "-gv", "exit-empty").stdout.strip() == "on"
    terminals(a, window("--new-window", "--", "ws-box", "box", a.home, "sleep 2000"))
    a.until(
        lambda: windows(a, "ws-box") == ["box:sleep", "box:sleep"] and a.sessions().get("ws-box") == 2,
        what=lambda: (windows(a, "ws-box"), a.sessions()),
    )

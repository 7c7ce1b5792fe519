"""The pure choice of what a new terminal attaches to, and the argv it leads to."""

from __future__ import annotations

import doctest

import pytest

from mtgpu.tmux import terminal
from mtgpu.tmux.terminal import (
    Action,
    Decision,
    attach_argv,
    choose,
    menu_text,
    next_name,
    parse_choice,
    sessions_table,
    terminal_argv,
    tmux_attach_argv,
    tmux_new_argv,
)
from mtgpu.tmux.terminal import TenantSession as S


@pytest.mark.parametrize(
    "sessions, action, name",
    [
        # nothing yet: the first terminal is "main"
        ([], Action.NEW, "main"),
        # one detached: re-attach it directly, whatever its name
        ([S("main")], Action.ATTACH, "main"),
        ([S("work", windows=3)], Action.ATTACH, "work"),
        # every session has a client: a new view of its own, never a mirror
        ([S("main", attached=1)], Action.NEW, "2"),
        ([S("main", attached=1), S("2", attached=2)], Action.NEW, "3"),
        ([S("2", attached=1)], Action.NEW, "main"),
        ([S("main", attached=1), S("3", attached=1)], Action.NEW, "2"),
        # attached ones do not count when exactly one other is detached
        ([S("main", attached=1), S("2"), S("3", attached=1)], Action.ATTACH, "2"),
        # several detached: ask; "n" would make the next free name
        ([S("main"), S("2")], Action.MENU, "3"),
        ([S("main", attached=1), S("2"), S("3")], Action.MENU, "4"),
    ],
)
def test_choose(sessions: list[S], action: Action, name: str) -> None:
    d = choose(sessions)
    assert (d.action, d.name) == (action, name)


def test_menu_lists_only_detached_most_recent_first() -> None:
    d = choose(
        [
            S("main", created=100, last_attached=500),
            S("2", created=200),
            S("3", attached=1, created=300),
            S("old", created=50, last_attached=60),
        ]
    )
    assert [s.name for s in d.choices] == ["main", "2", "old"]


@pytest.mark.parametrize(
    "answer, action, name",
    [
        ("", Action.ATTACH, "a"),
        ("  ", Action.ATTACH, "a"),
        ("1", Action.ATTACH, "a"),
        ("2", Action.ATTACH, "b"),
        ("n", Action.NEW, "main"),
        ("N", Action.NEW, "main"),
        ("new", Action.NEW, "main"),
        ("b", Action.ATTACH, "b"),
    ],
)
def test_parse_choice(answer: str, action: Action, name: str) -> None:
    d = Decision(Action.MENU, "main", (S("a"), S("b")))
    picked = parse_choice(answer, d)
    assert picked is not None and (picked.action, picked.name) == (action, name)


@pytest.mark.parametrize("answer", ["0", "3", "-1", "x", "1 2"])
def test_parse_choice_asks_again(answer: str) -> None:
    assert parse_choice(answer, Decision(Action.MENU, "main", (S("a"), S("b")))) is None


def test_next_name_skips_taken() -> None:
    assert next_name(["main"]) == "2"
    assert next_name(["main", "2", "3"]) == "4"
    assert next_name(["2", "3"]) == "main"


def test_menu_text_shows_name_windows_created_and_command() -> None:
    d = choose(
        [
            S("main", windows=2, created=1_700_000_000, command="vim"),
            S("2", windows=1, created=1_700_000_100, command="bash"),
        ]
    )
    text = menu_text(d)
    lines = text.splitlines()
    assert lines[0] == "Detached terminals:"
    assert lines[1].split()[:4] == ["1)", "2", "1", "window"]
    assert "bash" in lines[1] and terminal.when(1_700_000_100) in lines[1]
    assert lines[2].split()[:4] == ["2)", "main", "2", "windows"] and lines[2].endswith("vim")
    assert lines[3].split()[:2] == ["n)", "a"] and "(3)" in lines[3]


def test_sessions_table() -> None:
    assert "No terminal sessions" in sessions_table([])
    out = sessions_table([S("main", attached=1, command="top"), S("2")]).splitlines()
    assert out[0].split() == ["NAME", "WINDOWS", "STATE", "CREATED", "COMMAND"]
    assert out[1].split()[:3] == ["main", "1", "attached"] and out[1].endswith("top")
    assert out[2].split()[:3] == ["2", "1", "detached"]


def test_argv_the_gateway_runs() -> None:
    assert terminal_argv("/opt/mtgpu/bin/python") == [
        "/opt/mtgpu/bin/python",
        "-P",
        "-X",
        "utf8",
        "-m",
        "mtgpu.tmux.attach",
    ]
    assert attach_argv("/py", "work") == ["/py", "-P", "-X", "utf8", "-m", "mtgpu.tmux.attach", "--", "work"]
    # a name that looks like an option is still a name
    assert attach_argv("/py", "-d")[-2:] == ["--", "-d"]


def test_tmux_client_argv() -> None:
    assert tmux_attach_argv("2") == ["tmux", "-L", "mtgpu", "attach-session", "-t", "=2"]
    assert tmux_attach_argv("2", detach_others=True) == [
        "tmux",
        "-L",
        "mtgpu",
        "attach-session",
        "-d",
        "-t",
        "=2",
    ]
    assert tmux_attach_argv("2", switch=True) == ["tmux", "-L", "mtgpu", "switch-client", "-t", "=2"]
    assert tmux_new_argv("main", "/home/a", restore_exit_empty=False) == [
        "tmux",
        "-L",
        "mtgpu",
        "new-session",
        "-s",
        "main",
        "-c",
        "/home/a",
    ]
    assert tmux_new_argv("2", None, restore_exit_empty=True)[-5:] == [
        ";",
        "set-option",
        "-g",
        "exit-empty",
        "on",
    ]


def test_doctests() -> None:
    assert doctest.testmod(terminal).failed == 0


def test_reclaim_discounts_only_sessions_whose_every_client_is_dead() -> None:
    from mtgpu.tmux.terminal import TenantClient as C
    from mtgpu.tmux.terminal import reclaim, takeover_message

    sessions = [S("main", attached=1), S("2", attached=2), S("3", attached=1)]
    clients = [
        C("/dev/pts/1", "main", 100),
        C("/dev/pts/2", "2", 200),
        C("/dev/pts/3", "2", 300),
        C("/dev/pts/4", "3", 400),
    ]
    view, takeovers = reclaim(sessions, clients, {"/dev/pts/1", "/dev/pts/2"})
    assert [(s.name, s.attached) for s in view] == [("main", 0), ("2", 2), ("3", 1)]
    assert list(takeovers) == ["main"] and takeovers["main"].ttys == ("/dev/pts/1",)
    # The login then re-attaches main rather than making an empty "4".
    assert (choose(view).action, choose(view).name) == (Action.ATTACH, "main")
    assert takeover_message(takeovers["main"]).startswith("took over `main` from a connection idle since ")
    # Nothing dead: nothing changes.
    assert reclaim(sessions, clients, set()) == (sessions, {})


@pytest.mark.parametrize(
    "sessions, action, name",
    [
        ([], Action.NEW, "proj"),
        ([S("proj")], Action.ATTACH, "proj"),
        ([S("proj", attached=1)], Action.NEW, "proj-2"),
        ([S("proj", attached=1), S("proj-2")], Action.ATTACH, "proj-2"),
        ([S("proj", attached=1), S("proj-2", attached=1), S("main")], Action.NEW, "proj-3"),
    ],
)
def test_workspace_session(sessions: list[S], action: Action, name: str) -> None:
    from mtgpu.tmux.terminal import workspace_session

    d = workspace_session("/home/a/proj", sessions)
    assert (d.action, d.name) == (action, name)


def test_clock_shows_the_day_only_when_it_is_not_today() -> None:
    import time as _time

    now = _time.mktime((2025, 3, 4, 18, 30, 0, 0, 0, -1))
    assert terminal.clock(int(now) - 1680, now=now) == "18:02"
    assert terminal.clock(int(now) - 86400, now=now) == "2025-03-03 18:30"

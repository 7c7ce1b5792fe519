"""Where remotegpu-cli finds servers: servers.yaml, ~/.ssh/config and cluster members.
Plain files and plain data: no server needed."""

from __future__ import annotations

import pytest

from mtgpu.tui.fleet import Fleet, ServerState
from mtgpu.tui.sources import (
    CLUSTER,
    ServerList,
    ServerListError,
    Target,
    add_server,
    load_server_list,
    parse_destination,
    remove_server,
    save_server_list,
    ssh_config_hosts,
)


@pytest.mark.parametrize(
    "text, error",
    [
        ("servers: [gpu01, 'bad host']", "servers entry 2: 'bad host' is not a server"),
        ("servers: [{host: gpu01, port: 70000}]", "servers entry 1: port must be a number"),
        ("servers: [{host: gpu01, colour: red}]", "servers entry 1: unknown key 'colour'"),
        ("servers: [{name: x}]", "servers entry 1: write a destination"),
        ("servers: gpu01", "`servers` must be a list"),
        ("server: [gpu01]", "unknown key 'server'"),
        ("ssh_config: maybe", "ssh_config must be true or false"),
        ("servers: [", "not valid YAML"),
    ],
)
def test_a_bad_servers_yaml_names_the_entry_and_the_fix(tmp_path, text, error) -> None:
    p = tmp_path / "servers.yaml"
    p.write_text(text)
    with pytest.raises(ServerListError, match=str(p)) as exc:
        load_server_list(p)
    assert error in str(exc.value)


def test_servers_yaml_round_trips_and_is_edited_by_add_and_remove(tmp_path) -> None:
    p = tmp_path / "remotegpu" / "servers.yaml"
    assert load_server_list(p).targets == ()  # no file yet: an empty list
    sl = ServerList(path=p)
    sl = add_server(sl, parse_destination("alice@gpu01:2222"))
    sl = add_server(sl, Target("lab", "lab.example.org", None, "bob", "~/.ssh/id_lab"))
    with pytest.raises(ServerListError, match="already in the list"):
        add_server(sl, parse_destination("alice@gpu01:2222"))
    save_server_list(sl)
    assert "- alice@gpu01:2222" in p.read_text()
    back = load_server_list(p)
    assert back.targets == sl.targets and back.ssh_config
    back = remove_server(back, "gpu01")
    assert [t.name for t in back.targets] == ["lab"]
    with pytest.raises(ServerListError, match="not in your list"):
        remove_server(back, "gpu01")


def test_ssh_config_hosts_follow_include_and_skip_patterns(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    ssh = tmp_path / ".ssh"
    (ssh / "conf.d").mkdir(parents=True)
    (ssh / "config").write_text("Include conf.d/*\nHost gpu01 *.lab\n  Port 2222\nHost=gpu02\n")
    (ssh / "conf.d" / "team").write_text("Host team-a !team-b\n")
    assert ssh_config_hosts() == ["team-a", "gpu01", "gpu02"]


def test_members_of_a_known_cluster_are_added_once_as_the_same_user() -> None:
    f = Fleet(
        ServerList(targets=(Target("a", "gpu-a.example.org", 2222, None, "~/.ssh/k"),), ssh_config=False)
    )
    st: ServerState = f.states["a"]
    st.server, st.user, st.cluster_id = "node-a", "alice", "lab"
    st.members = [
        {"name": "node-a", "address": "10.0.0.1:2222"},
        {"name": "node-b", "address": "10.0.0.2:2222"},
        {"name": "node-c", "address": "0.0.0.0:2222"},
    ]  # no address to dial
    f._learn_members(st)
    f._learn_members(st)
    added = [s.target for s in f.states.values() if s.target.source == CLUSTER]
    assert added == [Target("node-b", "10.0.0.2", 2222, "alice", "~/.ssh/k", CLUSTER)]


@pytest.mark.parametrize("module", ["mtgpu.tui.sources", "mtgpu.tui.view", "mtgpu.tui.screen"])
def test_the_examples_in_the_docstrings(module) -> None:
    import doctest
    import importlib

    r = doctest.testmod(importlib.import_module(module))
    assert r.attempted and not r.failed


def test_the_manuals_examples_read_as_the_manual_says(tmp_path, monkeypatch) -> None:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "manual.md").read_text()
    section = text[text.index("## The terminal client: `remotegpu-cli`") :]
    [servers] = re.findall(r"```yaml\n(.*?)```", section, re.S)
    p = tmp_path / "servers.yaml"
    p.write_text(re.sub(r"(?m)^  ", "", servers))
    sl = load_server_list(p)
    assert [(t.name, t.host, t.port, t.user) for t in sl.targets] == [
        ("gpu01", "gpu01", None, None),
        ("10.0.0.7", "10.0.0.7", 2222, "alice"),
        ("lab", "lab.example.org", 2222, "alice"),
    ]
    assert sl.ssh_config
    config = re.findall(r"```\n(Host .*?)```", re.sub(r"(?m)^  ", "", section), re.S)[0]
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(config)
    assert ssh_config_hosts() == ["gpu01"]

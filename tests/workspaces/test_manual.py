"""The manual's "Container workspaces" section: its configuration loads, its rule table
is the policy's, and the messages it quotes are the real ones."""

from __future__ import annotations

import re
from pathlib import Path

from mtgpu.config.options import load_text
from mtgpu.workspaces.policy import RULES, check_podman
from mtgpu.workspaces.types import Policy, PolicyRefusal

MANUAL = Path(__file__).resolve().parents[2] / "docs" / "manual.md"


def section() -> str:
    text = MANUAL.read_text()
    start = text.index("\n## Container workspaces\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def test_the_configuration_example_loads() -> None:
    [yaml_text] = re.findall(r"```yaml\n(.*?)```", section(), flags=re.DOTALL)
    o = load_text(yaml_text)
    t = o.containers.templates["jupyter"]
    assert (t["gpus"], t["gpu_type"], t["ports"], o.containers.port_publishing) == (
        1,
        "nvidia",
        (8888,),
        "loopback",
    )


def test_the_rule_table_is_the_policys() -> None:
    names = re.findall(r"^\| `([a-z-]+)` \|", section(), flags=re.MULTILINE)
    assert set(RULES) <= set(names)


def test_the_quoted_refusal_is_real() -> None:
    quoted = re.search(
        r"mt-podman: (refused by the container policy, rule 'no-privileged': .*)", section()
    ).group(1)
    try:
        check_podman(
            ["run", "--privileged", "localhost/mine", "true"], Policy(home="/h", allow_user_images=True)
        )
    except PolicyRefusal as exc:
        assert str(exc) == quoted
    else:
        raise AssertionError("not refused")


def test_the_container_store_lines_are_podman_checks() -> None:
    from mtgpu.workspaces.hostcheck import store_finding

    text = section()
    [yaml_text] = re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL)
    assert load_text(yaml_text).containers.storage == "auto"
    assert store_finding("auto", "/home", "ext4").line() in text.splitlines()
    nfs = store_finding("auto", "/home", "nfs4")
    assert " ".join(f"`ok container stores: {nfs.detail}`".split()) in " ".join(text.split())

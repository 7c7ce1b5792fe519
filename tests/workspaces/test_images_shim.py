"""Pre-pull archives (names, credentials, lookups) and the docker shim's answers."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from mtgpu.config.options import ContainersOptions
from mtgpu.workspaces.images import ImageArchives, archive_file, auth_json
from mtgpu.workspaces.shim import render, version_info
from mtgpu.workspaces.types import WorkspaceError


def test_archives_are_found_by_any_spelling(tmp_path: Path) -> None:
    c = ContainersOptions(
        enabled=True,
        prepull=("team/img:1", "ubuntu"),
        registry={"url": "r:5000", "credentials": None, "tls_verify": False},
        archive_dir=str(tmp_path),
    )
    a = ImageArchives(c, str(tmp_path))
    assert a.wanted() == ["r:5000/team/img:1", "r:5000/ubuntu:latest"]
    assert a.path_for("team/img:1") is None
    (tmp_path / archive_file("r:5000/team/img:1")).write_bytes(b"x")
    for ref in ("team/img:1", "r:5000/team/img:1", "docker://r:5000/team/img:1"):
        assert a.path_for(ref) == str(tmp_path / "r_5000_team_img_1.tar")
        assert a.resolve(ref) == "r:5000/team/img:1"
    assert a.resolve("other:2") == "other:2"


def test_credentials_become_an_auth_file() -> None:
    d = json.loads(auth_json("robot:s3cr:et", "r:5000"))
    assert base64.b64decode(d["auths"]["r:5000"]["auth"]) == b"robot:s3cr:et"
    existing = '{"auths": {"r:5000": {"auth": "eA=="}}}'
    assert auth_json(existing, "r:5000") == existing
    with pytest.raises(WorkspaceError, match="USER:PASSWORD"):
        auth_json("nocolon", "r")


def test_docker_version_has_a_server_part() -> None:
    v = version_info({"Client": {"Version": "4.3.1", "APIVersion": "4.3.1", "OsArch": "linux/amd64"}})
    assert render("{{.Server.APIVersion}}", v) == "1.41"
    assert render("{{.Server.Version}} {{.Client.Os}}", v) == "4.3.1 linux"
    assert json.loads(render("{{json .}}", v))["Server"]["Arch"] == "amd64"
    assert render("{{ json .Server.Components }}", v).startswith("[{")

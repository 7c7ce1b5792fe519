"""devcontainer.json -> WorkspaceSpec: the fields MTGPU honours, and what it refuses."""

from __future__ import annotations

import pytest

from mtgpu.workspaces.devcontainer import (
    build_argv,
    load_devcontainer,
    merge_overrides,
    spec_from_devcontainer,
    strip_jsonc,
)
from mtgpu.workspaces.types import Mount, WorkspaceError

CFG = "/home/ann/proj/.devcontainer/devcontainer.json"

TEXT = """{
  // A comment, as VS Code writes them
  "name": "proj",
  "image": "localhost/mtgpu-test:1",
  "containerEnv": {"GREETING": "hello", "URL": "http://x//y"},  /* block */
  "remoteEnv": {"EDITOR": "vi"},
  "mounts": ["source=${localWorkspaceFolder}/data,target=/data,type=bind,readonly",
             {"source": "pipcache", "target": "/root/.cache/pip", "type": "volume"}],
  "forwardPorts": [8888, "localhost:6006", "db:5432"],
  "appPort": ["127.0.0.1:3000:3000"],
  "postCreateCommand": "echo $GREETING > /tmp/made",
  "remoteUser": "root",
  "runArgs": ["--cap-add=SYS_PTRACE"],
  "hostRequirements": {"cpus": 4, "memory": "8gb", "gpu": true},
}"""


def test_fields_map_onto_the_workspace() -> None:
    spec = spec_from_devcontainer(load_devcontainer(TEXT), name="dc", config_path=CFG)
    assert spec.image == "localhost/mtgpu-test:1" and spec.source == f"devcontainer:{CFG}"
    assert spec.env == {"GREETING": "hello", "URL": "http://x//y", "EDITOR": "vi"}
    assert spec.mounts == (
        Mount("/home/ann/proj/data", "/data", True, "bind"),
        Mount("pipcache", "/root/.cache/pip", False, "volume"),
    )
    assert spec.ports == (8888, 6006, 3000)
    assert spec.post_create == (("/bin/sh", "-c", "echo $GREETING > /tmp/made"),)
    assert spec.user == "root" and spec.workdir == "/home/ann/proj"
    assert spec.run_args == ("--cap-add=SYS_PTRACE",)
    assert (spec.cpus, spec.ram, spec.gpus) == (4, 8 << 30, 1)
    assert not spec.use_image_command and spec.build is None


@pytest.mark.parametrize(
    "value,want",
    [
        (["make", "setup"], (("make", "setup"),)),
        ({"a": "x", "b": ["y", "1"]}, (("/bin/sh", "-c", "x"), ("y", "1"))),
        (None, ()),
    ],
)
def test_post_create_forms(value: object, want: tuple) -> None:
    cfg = {"image": "i", "postCreateCommand": value}
    assert spec_from_devcontainer(cfg, name="d", config_path=CFG).post_create == want


def test_build_uses_the_dockerfile_beside_the_json() -> None:
    cfg = {
        "build": {"dockerfile": "Dockerfile", "context": "..", "args": {"V": 1}, "target": "dev"},
        "overrideCommand": False,
        "workspaceFolder": "/home/ann/proj/src",
    }
    spec = spec_from_devcontainer(cfg, name="b", config_path=CFG)
    assert spec.build is not None and spec.image == "localhost/mtgpu-devcontainer/b:latest"
    assert spec.build.dockerfile == "/home/ann/proj/.devcontainer/Dockerfile"
    assert spec.build.context == "/home/ann/proj"
    assert build_argv(spec.build, spec.image) == [
        "build",
        "--file",
        "/home/ann/proj/.devcontainer/Dockerfile",
        "--tag",
        spec.image,
        "--build-arg",
        "V=1",
        "--target",
        "dev",
        "/home/ann/proj",
    ]
    assert spec.use_image_command and spec.workdir == "/home/ann/proj/src"


def test_unsupported_parts_warn_or_refuse() -> None:
    spec = spec_from_devcontainer(
        {"image": "i", "features": {"x": {}}, "containerUser": "u"}, name="d", config_path=CFG
    )
    assert len(spec.warnings) == 2
    with pytest.raises(WorkspaceError, match="Compose"):
        spec_from_devcontainer({"dockerComposeFile": "c.yml"}, name="d", config_path=CFG)
    with pytest.raises(WorkspaceError, match="no image"):
        spec_from_devcontainer({}, name="d", config_path=CFG)
    with pytest.raises(WorkspaceError, match="not valid JSON"):
        load_devcontainer("{nope", "x.json")


def test_jsonc_keeps_strings_intact() -> None:
    assert (
        strip_jsonc('{"a": "// not a comment, }", "b": [1, 2,],}')
        == '{"a": "// not a comment, }", "b": [1, 2]}'
    )
    assert strip_jsonc('{"q": "say \\"/*x*/\\"" /* c */}') == '{"q": "say \\"/*x*/\\"" }'


def test_command_line_choices_override_the_file() -> None:
    spec = spec_from_devcontainer({"image": "i", "forwardPorts": [1]}, name="d", config_path=CFG)
    spec = merge_overrides(spec, {"gpus": 2, "ports": [1, 2], "env": {"K": "v"}, "cpus": None})
    assert (spec.gpus, spec.ports, spec.env, spec.cpus) == (2, (1, 2), {"K": "v"}, 1)

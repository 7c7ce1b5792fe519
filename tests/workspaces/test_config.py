"""CONTAINERS is validated key by key; a bad value names its key path and line."""

from __future__ import annotations

import pytest

from mtgpu.config.options import load_text
from mtgpu.errors import ConfigError

GOOD = """\
CONTAINERS:
  enabled: true
  templates:
    jupyter:
      image: quay.io/jupyter/base-notebook:latest
      gpus: nvidia:1
      cpus: 4
      ram: 16G
      ports: [8888]
      env: {JUPYTER_ENABLE_LAB: yes, N: 3}
      mounts: ["~/data:/data:ro", {source: /srv/models, target: /models}]
      command: start-notebook.sh --NotebookApp.token=''
  prepull: [team/base:1]
  registry: {url: https://registry.example.com:5000/, credentials: /etc/mtgpu/registry-auth, tls_verify: false}
  cache_volumes: [/root/.cache]
  port_publishing: loopback
  archive_dir: /srv/mtgpu-images
"""


def test_a_full_containers_section() -> None:
    c = load_text(GOOD).containers
    t = c.templates["jupyter"]
    assert (t["gpus"], t["gpu_type"], t["cpus"], t["ram"], t["ports"]) == (1, "nvidia", 4, 16 << 30, (8888,))
    assert t["env"] == {"JUPYTER_ENABLE_LAB": "true", "N": "3"}
    assert t["mounts"] == [
        {"source": "~/data", "target": "/data", "readonly": True},
        {"source": "/srv/models", "target": "/models", "readonly": False},
    ]
    assert t["command"][0] == "start-notebook.sh"
    assert c.registry == {
        "url": "registry.example.com:5000",
        "credentials": "/etc/mtgpu/registry-auth",
        "tls_verify": False,
    }
    assert c.archive_dir == "/srv/mtgpu-images" and c.prepull == ("team/base:1",)


@pytest.mark.parametrize(
    "text,key,line,words",
    [
        (
            "CONTAINERS:\n  templates:\n    j:\n      image: x\n      ports: [0]\n",
            "CONTAINERS.templates.j.ports",
            5,
            "1 to 65535",
        ),
        ("CONTAINERS:\n  templates:\n    j:\n      gpus: 1\n", "CONTAINERS.templates.j", 3, "needs 'image'"),
        (
            "CONTAINERS:\n  templates:\n    j:\n      image: x\n      colour: red\n",
            "CONTAINERS.templates.j.colour",
            5,
            "unknown key",
        ),
        (
            "CONTAINERS:\n  templates:\n    j:\n      image: x\n      mounts: [rel:/x]\n",
            "CONTAINERS.templates.j.mounts",
            5,
            "absolute path or start with ~/",
        ),
        (
            "CONTAINERS:\n  templates:\n    j:\n      image: x\n      gpus: lots\n",
            "CONTAINERS.templates.j.gpus",
            5,
            "TYPE:COUNT",
        ),
        ("CONTAINERS:\n  templates:\n    J: {image: x}\n", "CONTAINERS.templates.J", 3, "lower-case"),
        ("CONTAINERS:\n  registry:\n    url: a/b\n", "CONTAINERS.registry.url", 3, "host[:port]"),
        ("CONTAINERS:\n  registry:\n    credentials: /x\n", "CONTAINERS.registry", 2, "needs 'url'"),
        (
            "CONTAINERS:\n  registry:\n    url: r\n    credentials: rel\n",
            "CONTAINERS.registry.credentials",
            4,
            "absolute path",
        ),
        ("CONTAINERS:\n  port_publishing: all\n", "CONTAINERS.port_publishing", 2, "none, loopback or any"),
        ("CONTAINERS:\n  archive_dir: images\n", "CONTAINERS.archive_dir", 2, "absolute path"),
        ("CONTAINERS:\n  prepul: []\n", "CONTAINERS.prepul", 2, "unknown key"),
    ],
)
def test_bad_values_name_the_key_and_line(text: str, key: str, line: int, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(text, "m.yaml")
    msg = str(info.value)
    assert msg.startswith(f"m.yaml:{line}: {key}:"), msg
    assert words in msg

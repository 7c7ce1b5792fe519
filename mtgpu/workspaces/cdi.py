"""Container Device Interface specs (``/etc/cdi``, ``/var/run/cdi``): which fully
qualified device names exist (``nvidia.com/gpu=0``) and which host paths they mount.

``nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`` writes NVIDIA's; podman
reads them when it sees ``--device nvidia.com/gpu=N``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger("mtgpu.workspaces")

CDI_DIRS = ("/etc/cdi", "/var/run/cdi")


def load_specs(dirs: Sequence[str] = CDI_DIRS) -> list[dict[str, Any]]:
    """Every readable CDI spec in ``dirs`` (YAML or JSON)."""
    specs = []
    for d in dirs:
        p = Path(d)
        if not p.is_dir():
            continue
        for f in sorted(p.iterdir()):
            if f.suffix not in (".yaml", ".yml", ".json"):
                continue
            try:
                text = f.read_text()
                data = json.loads(text) if f.suffix == ".json" else yaml.safe_load(text)
            except (OSError, ValueError, yaml.YAMLError) as exc:
                log.warning("skipping the CDI spec %s: %s", f, exc)
                continue
            if isinstance(data, dict) and data.get("kind"):
                specs.append(data)
    return specs


def device_names(specs: Iterable[Mapping[str, Any]]) -> set[str]:
    """Fully qualified device names, such as ``nvidia.com/gpu=0``.

    >>> sorted(device_names([{"kind": "nvidia.com/gpu", "devices": [{"name": "0"}, {"name": "GPU-1"}]}]))
    ['nvidia.com/gpu=0', 'nvidia.com/gpu=GPU-1']
    """
    return {
        f"{s['kind']}={d.get('name')}"
        for s in specs
        for d in s.get("devices") or []
        if d.get("name") is not None
    }


def host_paths(specs: Iterable[Mapping[str, Any]]) -> set[str]:
    """Host paths the specs mount or expose (driver libraries, device nodes)."""
    out: set[str] = set()

    def edits(e: Mapping[str, Any] | None) -> None:
        for m in (e or {}).get("mounts") or []:
            if m.get("hostPath"):
                out.add(m["hostPath"])
        for n in (e or {}).get("deviceNodes") or []:
            out.add(n.get("hostPath") or n.get("path") or "")

    for s in specs:
        edits(s.get("containerEdits"))
        for d in s.get("devices") or []:
            edits(d.get("containerEdits"))
    out.discard("")
    return out


def pick_name(names: set[str], kind: str, candidates: Iterable[str]) -> str | None:
    """The first ``kind=candidate`` that the specs define.

    >>> pick_name({"nvidia.com/gpu=0"}, "nvidia.com/gpu", ["GPU-x", "0"])
    'nvidia.com/gpu=0'
    """
    for c in candidates:
        if c and f"{kind}={c}" in names:
            return f"{kind}={c}"
    return None

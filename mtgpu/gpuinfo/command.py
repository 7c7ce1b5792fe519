"""GPUs of other brands, reported by a configured command (``GPU_PROBES``).

The command prints one JSON object on stdout and exits 0::

    {"gpus": [{"index": 0, "name": "Ascend 910B", "uuid": "...",
               "vram_total": 68719476736, "vram_used": 3221225472, "util": 12,
               "processes": [{"pid": 4242, "used_memory": 3221225472}],
               "devices": ["/dev/davinci0"]}]}

Required per GPU: ``index`` (a whole number, unique), ``name``, ``vram_total`` and
``vram_used`` (bytes). Optional: ``uuid``, ``util`` (0-100, default 0), ``type``
(default: derived from ``name``), ``visibility_id`` (what the visibility variable
takes for this GPU; default: the index), ``processes`` (``pid``, ``used_memory``,
optionally ``uid``), and ``devices`` (extra device files for this GPU only). Any
other key is an error, so a misspelt key is caught rather than ignored.
:data:`SCHEMA` is the same as a JSON Schema.

The command should enumerate GPUs through the runtime that jobs use, so that it
honours the visibility variable: ``mtgpu-setup gpu-check`` re-runs it with the
variable set to one GPU and expects to see exactly that GPU.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

from mtgpu.config import GpuProbeSpec
from mtgpu.errors import CommandError, GpuProbeError
from mtgpu.gpuinfo.base import GpuProbe, existing, job_env, process_uid
from mtgpu.gpuinfo.names import normalize_type
from mtgpu.gpuinfo.types import GpuInfo, GpuProcess
from mtgpu.proc import run

_BYTES = {"type": "integer", "minimum": 0}
SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "required": ["gpus"],
    "properties": {
        "version": {"const": 1},
        "gpus": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "name", "vram_total", "vram_used"],
                "additionalProperties": False,
                "properties": {
                    "index": {"type": "integer", "minimum": 0},
                    "name": {"type": "string", "minLength": 1},
                    "uuid": {"type": "string"},
                    "type": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_.-]*$"},
                    "vram_total": _BYTES,
                    "vram_used": _BYTES,
                    "util": {"type": "number", "minimum": 0, "maximum": 100},
                    "visibility_id": {"type": ["string", "integer"]},
                    "processes": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["pid", "used_memory"],
                            "properties": {
                                "pid": {"type": "integer", "minimum": 1},
                                "used_memory": _BYTES,
                                "uid": {"type": ["integer", "null"]},
                            },
                        },
                    },
                    "devices": {"type": "array", "items": {"type": "string", "pattern": "^/"}},
                },
            },
        },
    },
}
_GPU_KEYS = frozenset(SCHEMA["properties"]["gpus"]["items"]["properties"])
_MAX_ERRORS = 10
_TYPE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


def _kind(v: object) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"a boolean ({v!r})"
    if isinstance(v, (int, float)):
        return f"a number ({v!r})"
    if isinstance(v, str):
        return f"a string ({v[:40]!r})"
    return "a list" if isinstance(v, list) else "an object" if isinstance(v, dict) else type(v).__name__


def _whole(v: object, minimum: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= minimum


def validate(data: object) -> tuple[list[dict[str, Any]], list[str]]:
    """Check parsed probe output against :data:`SCHEMA`.

    Returns the GPU entries (with defaults filled in) and a list of errors, each
    naming the JSON path, what was expected and what was found.

    >>> validate({"gpus": [{"index": 0, "name": "X", "vram_total": 8, "vram_used": "2G"}]})[1]
    ["gpus[0].vram_used: expected a whole number of bytes (0 or more), got a string ('2G')"]
    """
    errors: list[str] = []
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
        return [], [f'expected an object like {{"gpus": [...]}}, got {_kind(data)}']
    out = []
    seen: set[int] = set()
    for i, g in enumerate(data["gpus"]):
        where = f"gpus[{i}]"
        if not isinstance(g, dict):
            errors.append(f"{where}: expected an object, got {_kind(g)}")
            continue
        for key in sorted(set(g) - _GPU_KEYS):
            errors.append(f"{where}.{key}: unknown key; expected one of {', '.join(sorted(_GPU_KEYS))}")
        for key in ("index", "name", "vram_total", "vram_used"):
            if key not in g:
                errors.append(f"{where}: missing {key!r}")
        if "index" in g:
            if not _whole(g["index"]):
                errors.append(f"{where}.index: expected a whole number (0 or more), got {_kind(g['index'])}")
            elif g["index"] in seen:
                errors.append(f"{where}.index: {g['index']} is used twice; each GPU needs its own index")
            else:
                seen.add(g["index"])
        if "name" in g and (not isinstance(g["name"], str) or not g["name"].strip()):
            errors.append(f"{where}.name: expected the model name as a string, got {_kind(g['name'])}")
        for key in ("vram_total", "vram_used"):
            if key in g and not _whole(g[key]):
                errors.append(
                    f"{where}.{key}: expected a whole number of bytes (0 or more), got {_kind(g[key])}"
                )
        if _whole(g.get("vram_total")) and _whole(g.get("vram_used")) and g["vram_used"] > g["vram_total"]:
            errors.append(f"{where}.vram_used: {g['vram_used']} is more than vram_total {g['vram_total']}")
        util = g.get("util", 0)
        if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0 <= util <= 100:
            errors.append(f"{where}.util: expected a number from 0 to 100, got {_kind(util)}")
        if "uuid" in g and not isinstance(g["uuid"], str):
            errors.append(f"{where}.uuid: expected a string, got {_kind(g['uuid'])}")
        if "type" in g and not (isinstance(g["type"], str) and _TYPE.match(g["type"])):
            errors.append(
                f"{where}.type: expected a lower-case type name such as ascend910b, got {_kind(g['type'])}"
            )
        vis = g.get("visibility_id", "")
        if isinstance(vis, bool) or not isinstance(vis, (str, int)):
            errors.append(f"{where}.visibility_id: expected a string or a number, got {_kind(vis)}")
        procs = g.get("processes", [])
        if not isinstance(procs, list):
            errors.append(f"{where}.processes: expected a list, got {_kind(procs)}")
            procs = []
        for j, p in enumerate(procs):
            pw = f"{where}.processes[{j}]"
            if not isinstance(p, dict):
                errors.append(f"{pw}: expected an object, got {_kind(p)}")
            elif not _whole(p.get("pid"), 1) or not _whole(p.get("used_memory")):
                errors.append(f"{pw}: expected pid (a number above 0) and used_memory (bytes)")
            elif p.get("uid") is not None and not _whole(p["uid"]):
                errors.append(f"{pw}.uid: expected a whole number or null, got {_kind(p['uid'])}")
        devices = g.get("devices", [])
        if not isinstance(devices, list) or not all(
            isinstance(d, str) and d.startswith("/") for d in devices
        ):
            errors.append(f"{where}.devices: expected a list of absolute paths such as /dev/davinci0")
        out.append(g)
    if errors:
        return [], errors
    return sorted(out, key=lambda g: g["index"]), []


def parse_output(text: str, brand: str, proc_root: str = "/proc") -> list[GpuInfo]:
    """The GPUs in a probe command's stdout; raise GpuProbeError listing what is wrong."""
    return _parse(text, brand, proc_root)[0]


def _parse(text: str, brand: str, proc_root: str) -> tuple[list[GpuInfo], dict[int, tuple[str, ...]]]:
    """The GPUs, and each GPU's own device files, from a probe command's stdout."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        head = text.strip()[:80]
        raise GpuProbeError(f"the output is not JSON ({exc}); it began {head!r}") from exc
    gpus, errors = validate(data)
    if errors:
        more = f" (and {len(errors) - _MAX_ERRORS} more)" if len(errors) > _MAX_ERRORS else ""
        raise GpuProbeError(
            "the output does not match the GPU_PROBES schema: " + "; ".join(errors[:_MAX_ERRORS]) + more
        )
    out = []
    for g in gpus:
        procs = tuple(
            GpuProcess(
                p["pid"],
                p["uid"] if p.get("uid") is not None else process_uid(p["pid"], proc_root),
                p["used_memory"],
            )
            for p in g.get("processes", [])
        )
        out.append(
            GpuInfo(
                index=g["index"],
                brand=brand,
                type=g.get("type") or normalize_type(brand, g["name"]),
                name=g["name"],
                uuid=g.get("uuid", ""),
                vram_total=g["vram_total"],
                vram_used=g["vram_used"],
                util=round(g.get("util", 0)),
                processes=procs,
                mig_mode=None,
                visibility_id=str(g.get("visibility_id", g["index"])),
            )
        )
    return out, {g["index"]: tuple(g.get("devices", ())) for g in gpus}


class CommandProbe(GpuProbe):
    """A ``GPU_PROBES`` entry: run its command and read the JSON it prints."""

    def __init__(self, spec: GpuProbeSpec, *, proc_root: str = "/proc") -> None:
        self.brand = spec.brand
        super().__init__(f"command:{spec.name or spec.brand}")
        self.spec = spec
        self.proc_root = proc_root
        self._devices: dict[int, tuple[str, ...]] = {}

    def _missing(self) -> str:
        exe = self.spec.command[0]
        if os.sep in exe:
            return "" if os.access(exe, os.X_OK) else f"{exe} does not exist or is not executable"
        return "" if shutil.which(exe) else f"{exe}: not found on PATH"

    def probe(self) -> list[GpuInfo]:
        """Run the command and return the GPUs it reports."""
        why = self._missing()
        if why:
            return self._unavailable(why)
        gpus, self._devices = self._run(None)
        return self._found(gpus)

    def _run(self, env: Mapping[str, str] | None) -> tuple[list[GpuInfo], dict[int, tuple[str, ...]]]:
        try:
            out = run(
                self.spec.command, timeout=self.spec.timeout, env=job_env(env) if env is not None else None
            ).stdout
        except CommandError as exc:
            raise GpuProbeError(
                f"GPU probe {self.name}: {exc}; fix the command or remove it from GPU_PROBES"
            ) from exc
        try:
            return _parse(out, self.brand, self.proc_root)
        except GpuProbeError as exc:
            raise GpuProbeError(f"GPU probe {self.name}: {exc}") from exc

    def visibility_env(self, indices: Sequence[int]) -> dict[str, str]:
        """The configured variable, set to the GPUs' visibility ids."""
        return {self.spec.visibility_env: ",".join(self.visibility_ids(indices))}

    def device_nodes(self, indices: Sequence[int]) -> list[str]:
        """The GPUs' own device files, then the configured ones every job needs."""
        own = [d for i in indices for d in self._devices.get(i, ())]
        return existing(own + list(self.spec.devices))

    def visible_devices(self, env: Mapping[str, str]) -> list[str]:
        """Re-run the command as a job with ``env``: the UUIDs ("" if none) it reports."""
        return [g.uuid for g in self._run(env)[0]]

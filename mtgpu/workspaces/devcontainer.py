"""A ``devcontainer.json`` turned into a :class:`WorkspaceSpec`. Pure; the file is read
by the tenant's own ``mt-container`` and sent as JSON, never opened by the daemon.

Supported (containers.dev's reference): ``image``; ``build.dockerfile``/``context``/
``args``/``target``; ``containerEnv`` and ``remoteEnv``; ``mounts`` (strings or
objects); ``forwardPorts`` and ``appPort``; ``postCreateCommand`` (string, array or
object); ``remoteUser``; ``workspaceFolder``; ``overrideCommand``; ``runArgs``
(checked by the container policy); ``hostRequirements`` (``cpus``, ``memory``,
``gpu``) as the reservation's defaults. ``features`` and Docker Compose files are
not supported and say so. A ``build`` is handed to the ``devcontainer`` CLI where it
is installed, and to ``podman build`` otherwise.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from mtgpu.workspaces.policy import parse_publish
from mtgpu.workspaces.types import BuildSpec, Mount, WorkspaceError, WorkspaceSpec


def _scan(text: str):  # type: ignore[no-untyped-def]
    """Yield (index, char, inside_a_string) over JSON text."""
    in_str = esc = False
    for i, c in enumerate(text):
        yield i, c, in_str
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True


def strip_jsonc(text: str) -> str:
    """JSON with comments and trailing commas (what devcontainer.json allows) -> JSON.

    >>> json.loads(strip_jsonc('{"a": [1,], // one\\n /* x */ "b": "//, }",}'))
    {'a': [1], 'b': '//, }'}
    """
    out: list[str] = []
    skip_to = 0
    for i, c, in_str in _scan(text):
        if i < skip_to:
            continue
        if not in_str and text.startswith("//", i):
            j = text.find("\n", i)
            skip_to = len(text) if j < 0 else j
            continue
        if not in_str and text.startswith("/*", i):
            j = text.find("*/", i + 2)
            skip_to = len(text) if j < 0 else j + 2
            continue
        out.append(c)
    plain = "".join(out)
    result: list[str] = []
    for i, c, in_str in _scan(plain):
        if c == "," and not in_str:
            rest = plain[i + 1 :].lstrip()
            if rest[:1] in ("}", "]"):
                continue
        result.append(c)
    return "".join(result)


def load_devcontainer(text: str, path: str = "devcontainer.json") -> dict[str, Any]:
    """Parse a devcontainer.json's text; raise WorkspaceError naming the file."""
    try:
        data = json.loads(strip_jsonc(text))
    except ValueError as exc:
        raise WorkspaceError(f"{path} is not valid JSON (comments allowed): {exc}") from exc
    if not isinstance(data, dict):
        raise WorkspaceError(f"{path} must hold one JSON object")
    return data


def workspace_folder(config_path: str) -> str:
    """The folder a devcontainer.json belongs to (the parent of ``.devcontainer/``).

    >>> workspace_folder("/home/a/proj/.devcontainer/devcontainer.json")
    '/home/a/proj'
    >>> workspace_folder("/home/a/proj/.devcontainer.json")
    '/home/a/proj'
    """
    d = os.path.dirname(os.path.normpath(config_path))
    return os.path.dirname(d) if os.path.basename(d) == ".devcontainer" else d


def _subst(value: Any, folder: str) -> Any:
    if isinstance(value, str):
        return (
            value.replace("${localWorkspaceFolder}", folder)
            .replace("${containerWorkspaceFolder}", folder)
            .replace("${localWorkspaceFolderBasename}", os.path.basename(folder))
            .replace("${containerWorkspaceFolderBasename}", os.path.basename(folder))
        )
    if isinstance(value, list):
        return [_subst(v, folder) for v in value]
    if isinstance(value, dict):
        return {k: _subst(v, folder) for k, v in value.items()}
    return value


def _command(value: Any, key: str) -> tuple[tuple[str, ...], ...]:
    """A lifecycle command: a string (run by /bin/sh), an argv array, or an object of them."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (("/bin/sh", "-c", value),)
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        return (tuple(value),) if value else ()
    if isinstance(value, dict):
        out: list[tuple[str, ...]] = []
        for v in value.values():
            out += _command(v, key)
        return tuple(out)
    raise WorkspaceError(f"{key} must be a string, an array of strings or an object of them")


def _mount(value: Any) -> Mount:
    if isinstance(value, str):
        kv = {}
        for part in value.split(","):
            k, _, v = part.partition("=")
            kv[k.strip().lower()] = v.strip()
        src = kv.get("source") or kv.get("src") or ""
        dst = kv.get("target") or kv.get("dst") or kv.get("destination") or ""
        kind = kv.get("type", "volume")
        ro = "readonly" in kv or "ro" in kv
    elif isinstance(value, dict):
        src, dst = str(value.get("source", "")), str(value.get("target", ""))
        kind, ro = str(value.get("type", "volume")), bool(value.get("readonly", False))
    else:
        raise WorkspaceError(f"a mount must be a string or an object, not {value!r}")
    if kind not in ("bind", "volume") or not dst.startswith("/"):
        raise WorkspaceError(f"mount {value!r}: need type bind or volume and an absolute target")
    return Mount(source=src, target=dst, readonly=ro, kind=kind)


def _ports(config: Mapping[str, Any]) -> tuple[int, ...]:
    ports: list[int] = []
    for p in config.get("forwardPorts") or []:
        if isinstance(p, int):
            ports.append(p)
        elif isinstance(p, str) and p.rpartition(":")[0] in ("", "localhost", "127.0.0.1"):
            ports.append(int(p.rpartition(":")[2]))
    app = config.get("appPort")
    for p in app if isinstance(app, list) else ([app] if app is not None else []):
        ports.append(p if isinstance(p, int) else int(parse_publish(str(p))[2]))
    out: list[int] = []
    for p in ports:
        if not 1 <= p <= 65535:
            raise WorkspaceError(f"port {p} is not between 1 and 65535")
        if p not in out:
            out.append(p)
    return tuple(out)


def spec_from_devcontainer(
    config: Mapping[str, Any],
    *,
    name: str,
    config_path: str,
) -> WorkspaceSpec:
    """The workspace a devcontainer.json describes (before the tenant's overrides)."""
    from mtgpu.config.units import parse_size

    folder = workspace_folder(config_path)
    config = _subst(dict(config), folder)
    warnings: list[str] = []
    if config.get("dockerComposeFile"):
        raise WorkspaceError("Docker Compose devcontainers are not supported; use image or build.dockerfile")
    if config.get("features"):
        warnings.append(
            "devcontainer features are not supported and were skipped; install them in a Dockerfile"
        )
    if config.get("containerUser"):
        warnings.append(
            "containerUser is ignored: the container runs as your own account "
            "(--userns=keep-id); remoteUser is honoured for shells"
        )
    build = config.get("build") or {}
    image = config.get("image") or ""
    spec_build = None
    if build.get("dockerfile"):
        cfg_dir = os.path.dirname(os.path.normpath(config_path))
        spec_build = BuildSpec(
            dockerfile=os.path.normpath(os.path.join(cfg_dir, build["dockerfile"])),
            context=os.path.normpath(os.path.join(cfg_dir, build.get("context", "."))),
            args={str(k): str(v) for k, v in (build.get("args") or {}).items()},
            target=str(build.get("target", "")),
            config_path=os.path.normpath(config_path),
            workspace_folder=folder,
        )
        image = image or f"localhost/mtgpu-devcontainer/{name}:latest"
    if not image:
        raise WorkspaceError(f"{config_path} names no image and no build.dockerfile")
    env = {str(k): str(v) for k, v in (config.get("containerEnv") or {}).items()}
    env.update({str(k): str(v) for k, v in (config.get("remoteEnv") or {}).items() if v is not None})
    req = config.get("hostRequirements") or {}
    gpus = 0
    gpu = req.get("gpu")
    if gpu is True or isinstance(gpu, dict):
        gpus = 1
    elif gpu == "optional":
        warnings.append("hostRequirements.gpu is optional: no GPU reserved (use --gpus N)")
    run_args = config.get("runArgs") or []
    if not isinstance(run_args, list) or not all(isinstance(a, str) for a in run_args):
        raise WorkspaceError("runArgs must be an array of strings")
    return WorkspaceSpec(
        name=name,
        image=image,
        source=f"devcontainer:{os.path.normpath(config_path)}",
        gpus=gpus,
        cpus=int(req.get("cpus") or 1),
        ram=parse_size(req["memory"]) if req.get("memory") else 1 << 30,
        ports=_ports(config),
        env=env,
        mounts=tuple(_mount(m) for m in config.get("mounts") or []),
        use_image_command=config.get("overrideCommand") is False,
        post_create=_command(config.get("postCreateCommand"), "postCreateCommand"),
        user=str(config.get("remoteUser") or ""),
        workdir=str(config.get("workspaceFolder") or folder),
        run_args=tuple(run_args),
        build=spec_build,
        warnings=tuple(warnings),
    )


def build_argv(build: BuildSpec, image: str) -> list[str]:
    """``podman build`` for a devcontainer's Dockerfile (without ``podman``)."""
    argv = ["build", "--file", build.dockerfile, "--tag", image]
    for k, v in build.args.items():
        argv += ["--build-arg", f"{k}={v}"]
    if build.target:
        argv += ["--target", build.target]
    return [*argv, build.context]


def devcontainer_cli_argv(cli: str, build: BuildSpec, image: str, docker_path: str) -> list[str]:
    """The ``devcontainer build`` command line, when that CLI is installed."""
    return [
        cli,
        "build",
        "--workspace-folder",
        build.workspace_folder,
        "--config",
        build.config_path,
        "--image-name",
        image,
        "--docker-path",
        docker_path,
    ]


def merge_overrides(spec: WorkspaceSpec, overrides: Mapping[str, Any]) -> WorkspaceSpec:
    """The tenant's command-line choices (``gpus``, ``cpus``, ``ram``, ``ports``, ``env``)."""
    import dataclasses

    changes: dict[str, Any] = {}
    for k in ("gpus", "gpu_type", "vram", "cpus", "ram"):
        if overrides.get(k) is not None:
            changes[k] = overrides[k]
    if overrides.get("ports"):
        changes["ports"] = tuple(dict.fromkeys([*spec.ports, *overrides["ports"]]))
    if overrides.get("env"):
        changes["env"] = {**spec.env, **overrides["env"]}
    return dataclasses.replace(spec, **changes)


def as_argv(value: str | Sequence[str]) -> tuple[str, ...]:
    return ("/bin/sh", "-c", value) if isinstance(value, str) else tuple(value)

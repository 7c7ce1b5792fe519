"""The ``ws_host`` fixture: one host with workspaces on, shared by a module's tests."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workspace_testing import IMAGE, WorkspaceHost, podman_ready, start_workspace_host, stop_workspace_host


@pytest.fixture(scope="module")
def ws_host() -> Iterator[WorkspaceHost]:
    import tempfile

    why = podman_ready()
    if why:
        pytest.skip(why)
    datasets = Path(tempfile.mkdtemp(prefix="mtgpu-datasets-", dir="/tmp"))
    (datasets / "imagenet").mkdir()
    (datasets / "imagenet" / "labels.txt").write_text("cat\ndog\n")
    for p in (datasets, datasets / "imagenet"):
        os.chmod(p, 0o755)
    os.chmod(datasets / "imagenet" / "labels.txt", 0o644)
    wh = start_workspace_host(
        {
            "DATASETS_DIRECTORIES": [str(datasets)],
            "CONTAINERS": {
                "enabled": True,
                "port_publishing": "loopback",
                "cache_volumes": ["/cache"],
                "templates": {"busybox": {"image": IMAGE, "cpus": 1, "ram": "256M"}},
            },
        }
    )
    wh.datasets = datasets  # type: ignore[attr-defined]
    yield wh
    stop_workspace_host(wh.host)
    shutil.rmtree(datasets, ignore_errors=True)

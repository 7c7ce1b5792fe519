"""Fixtures shared by every test: real MTGPU hosts on loopback."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mtgpu_testing
from mtgpu_testing import Host  # noqa: E402


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked ``mtjob_clients`` runs once per mt-job client (Python, C)."""
    if (
        "mtjob_client" in metafunc.fixturenames
        and metafunc.definition.get_closest_marker("mtjob_clients") is not None
    ):
        metafunc.parametrize("mtjob_client", mtgpu_testing.MT_JOB_CLIENTS, indirect=True)


@pytest.fixture
def mtjob_client(request: pytest.FixtureRequest) -> Iterator[str]:
    """The mt-job the tenants of hosts made in this test run: ``python`` unless the
    test is marked ``mtjob_clients`` (then each in turn)."""
    client = getattr(request, "param", "python")
    mtgpu_testing.mt_job_client = client
    yield client
    mtgpu_testing.mt_job_client = "python"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="needs root (accounts, namespaces)")
        for item in items:
            if "root" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def make_host(mtjob_client: str) -> Iterator:
    """A factory of started hosts, each stopped and removed after the test."""
    hosts: list[Host] = []

    def make(config: dict | None = None, start: bool = True, name: str = "testhost") -> Host:
        h = Host(config, name=name)
        hosts.append(h)
        return h.start() if start else h

    yield make
    for h in hosts:
        h.cleanup()


@pytest.fixture(scope="module")
def shared_host() -> Iterator[Host]:
    """One started host for the read-mostly tests of a module."""
    h = Host()
    h.start()
    yield h
    h.cleanup()


_FAILED: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keeps the node id of each failed test (its setup, call or teardown) for
    tests/run.sh, which runs those again alone (MTGPU_TEST_FAILED names the file)."""
    if report.failed and report.nodeid not in _FAILED:
        _FAILED.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("MTGPU_TEST_FAILED")
    if path:
        Path(path).write_text("".join(f"{n}\n" for n in _FAILED))


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001
    """The figures of the security, fuzz and fault tests that ran (docs/SECURITY.md)."""
    from figures import FIGURES

    if not FIGURES:
        return
    terminalreporter.section("MTGPU security figures")
    for k in sorted(FIGURES):
        terminalreporter.write_line(f"{k}: {FIGURES[k]}")
    path = os.environ.get("MTGPU_FIGURES")
    if path:
        import json

        Path(path).write_text(json.dumps(dict(FIGURES), indent=1, sort_keys=True) + "\n")

"""Fixtures: the real archivist binary started per module or per test, and
a fake provider. The binary is $ARCHIVIST_BIN if set, else debug/archivist
in the directory cargo builds into (`cargo build` or `cargo test` makes it):
the repository's target/, or CARGO_TARGET_DIR, or a cargo config's
build.target-dir, as `cargo metadata` tells."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from support import ArchivistServer, FakeProvider

REPO = Path(__file__).resolve().parents[3]


def cargo_target_dir() -> Path:
    """Where cargo puts this repository's builds, as `cargo metadata` says
    (it honours CARGO_TARGET_DIR and build.target-dir); without cargo,
    CARGO_TARGET_DIR or the repository's target/."""
    try:
        metadata = subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline"],
            cwd=REPO,
            capture_output=True,
            check=True,
            text=True,
            timeout=120,
        ).stdout
        return Path(json.loads(metadata)["target_directory"])
    except (OSError, subprocess.SubprocessError, ValueError, KeyError):
        return Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")


@pytest.fixture(scope="session")
def archivist_bin() -> Path:
    configured = os.environ.get("ARCHIVIST_BIN")
    binary = Path(configured) if configured else cargo_target_dir() / "debug" / "archivist"
    if not binary.is_file() or not os.access(binary, os.X_OK):
        how = "ARCHIVIST_BIN" if configured else "where cargo builds, by `cargo metadata`"
        pytest.fail(
            f"no archivist binary at {binary} ({how}). Build it first with "
            "`cargo build` (or `cargo test`) at the repository root, or point "
            "ARCHIVIST_BIN at one.",
            pytrace=False,
        )
    return binary


@pytest.fixture(scope="module")
def server(archivist_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArchivistServer]:
    """One server with the default configuration (the built-in extractive
    summariser), shared by a module's tests; each test uses its own sessions."""
    srv = ArchivistServer(archivist_bin, tmp_path_factory.mktemp("archivist")).start()
    yield srv
    srv.stop()


@pytest.fixture
def start_server(
    archivist_bin: Path, tmp_path: Path
) -> Iterator[Callable[..., ArchivistServer]]:
    """Starts servers with a given configuration; stops them after the test."""
    started: list[ArchivistServer] = []

    def start(config: str = "", env: dict[str, str] | None = None) -> ArchivistServer:
        workdir = tmp_path / f"server-{len(started)}"
        srv = ArchivistServer(archivist_bin, workdir, config, env)
        started.append(srv)
        return srv.start()

    yield start
    for srv in started:
        srv.stop()


@pytest.fixture
def fake_provider() -> Iterator[FakeProvider]:
    provider = FakeProvider()
    yield provider
    provider.close()


@pytest.fixture
def session_id(request: pytest.FixtureRequest) -> str:
    """A fresh session name for the test."""
    return f"py-{request.node.name[:60]}-{uuid.uuid4().hex[:8]}".replace("[", ".").replace("]", "")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """No silent skips: a skipped test (a missing plugin, a missing
    dependency) fails, so CI never passes on tests that did not run."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"test was skipped, which this suite does not allow: {report.longrepr}"



@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):  # type: ignore[no-untyped-def]
    """The same for a whole module skipped at collection (importorskip)."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped:
        report.outcome = "failed"
        report.longrepr = f"module was skipped, which this suite does not allow: {report.longrepr}"

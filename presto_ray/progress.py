"""A small progress bar on stderr (a redrawn line on a terminal, a line every 10% otherwise)."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, label: str = "samples", stream=None, enabled: bool = True) -> None:
        self.total, self.label, self.done = total, label, 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self._tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._start = time.perf_counter()
        self._last_decile = -1

    def update(self, note: str = "") -> None:
        self.done += 1
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self._start
        eta = elapsed / self.done * (self.total - self.done)
        width = 24
        filled = width * self.done // max(self.total, 1)
        line = f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {self.label}  {elapsed:.1f}s  eta {eta:.1f}s  {note}"
        if self._tty:
            self.stream.write("\r" + line[:160].ljust(100))
            if self.done == self.total:
                self.stream.write("\n")
        else:
            decile = 10 * self.done // max(self.total, 1)
            if decile != self._last_decile:
                self._last_decile = decile
                self.stream.write(line + "\n")
        self.stream.flush()

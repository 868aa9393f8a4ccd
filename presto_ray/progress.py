"""The sampling progress bar on stderr: tqdm, fed one finished sample at a time."""

from __future__ import annotations

import sys

from tqdm import tqdm


class Progress:
    def __init__(self, total: int, enabled: bool = True) -> None:
        self._bar = tqdm(
            total=total,
            disable=not enabled,
            file=sys.stderr,
            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} samples [{elapsed}<{remaining}{postfix}]",
        )

    def update(self, note: str = "") -> None:
        """One more sample done; `note` (e.g. prompt#chain) names it."""
        self._bar.set_postfix_str(note, refresh=False)
        self._bar.update()
        if self._bar.n >= self._bar.total:
            self._bar.close()  # draws the final count: tqdm may have skipped the last redraw

"""Writing the benchmarks' plots: one place lays out, creates the folder, saves and frees a figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_figure(fig: Any, path: str | Path, dpi: int = 110) -> None:
    """Tight layout, the output's folder created, the PNG written, the figure closed (pyplot keeps
    every open figure alive)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)

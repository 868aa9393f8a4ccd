"""What more than one benchmark command parses: --budgets (bench and bench-real) and a measured
device's --device-curve file (bench --virtual-clock and bench-real --chains)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from presto_ray.cli.common import BadInput, comma_ints

if TYPE_CHECKING:
    from presto_ray.engines.device_curve import DeviceCurve


def parse_budgets(text: str) -> tuple[int, ...]:
    """--budgets: the prefetch budgets, each at least 1 (BadInput otherwise)."""
    return comma_ints(
        text,
        invalid="--budgets: expected comma-separated integers, got {text!r}",
        below_one="--budgets: every budget must be at least 1",
    )


def load_device_curve(path: str) -> DeviceCurve:
    """The DeviceCurve JSON at `path` (BadInput naming the file and the bad field)."""
    from pydantic import ValidationError

    from presto_ray.engines.device_curve import DeviceCurve

    try:
        return DeviceCurve.load(path)
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "the curve"
        raise BadInput(f"--device-curve {path}: {field}: {first['msg']}") from None
    except (OSError, ValueError) as e:  # unreadable, or not JSON
        raise BadInput(f"--device-curve {path}: {e}") from None

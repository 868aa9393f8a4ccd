"""Where `presto-ray validate` and `presto-ray eval` run: a Backend in process, or through Ray
(`--ray`: actors/ray_backend.py, imported only then), built, used and closed in one place."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, Callable

from presto_ray.cli.common import BadInput, fail, watch_engine_processes

if TYPE_CHECKING:
    from presto_ray.backend import Backend
    from presto_ray.job import JobConfig


def backend_for(args: argparse.Namespace, config: JobConfig) -> Backend:
    """Where validate and eval run: the in-process driver, or Ray (--ray)."""
    if args.ray:
        try:
            from actors.ray_backend import RayBackend
        except ImportError as e:
            raise BadInput(f"--ray needs Ray: pip install 'presto-ray[ray]' ({e})") from None
        return RayBackend(config, address=args.address)
    if args.address:
        raise BadInput("--address needs --ray")
    from presto_ray.backend import LocalBackend
    from presto_ray.engines import build_engine

    watch_engine_processes(config)
    return LocalBackend(build_engine(config.engine), config.max_active_chains)


def run_with_backend(args: argparse.Namespace, config: JobConfig, work: Callable[[Backend], int]) -> int:
    """Build the backend, run `work(backend)`, close it; bad input or a failed start is exit 2."""
    from presto_ray.models import ModelProvisionError

    try:
        backend = backend_for(args, config)
    except BadInput as e:
        return fail(str(e))
    except ModelProvisionError as e:
        return fail(str(e))
    try:
        return work(backend)
    except ValueError as e:  # e.g. a prompt longer than the model's context, a serial config
        return fail(str(e))
    finally:
        backend.close()


def provenance(config: JobConfig) -> dict[str, Any]:
    """When and with what a report was made (the command line, the engine spec)."""
    from datetime import datetime, timezone

    from presto_ray import __version__

    return {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "presto_ray_version": __version__,
        "argv": sys.argv[1:],
        "engine": config.engine.model_dump(),
    }

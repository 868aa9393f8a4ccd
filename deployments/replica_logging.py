"""The service's log on a Serve replica's stderr."""

from __future__ import annotations

import logging
import sys

SERVICE_LOGGER = "presto_ray.serve"  # the library's service log: error ids, client disconnects


def log_to_stderr() -> None:
    """The library's service log on this process's stderr, INFO and up (Python's last-resort
    handler would print warnings only). Once per process: a second call changes nothing."""
    logger = logging.getLogger(SERVICE_LOGGER)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s presto_ray.serve -- %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False

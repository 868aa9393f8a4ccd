"""`presto-ray serve`: the OpenAI-compatible HTTP service on Ray Serve (deployments/serve_app.py's
run_service, imported only when the command runs)."""

from __future__ import annotations

import argparse

from presto_ray.cli.common import OK, BadInput, Subparsers, add_ray_options, fail, load_job_config


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        config = load_job_config(args)
    except BadInput as e:
        return fail(str(e))
    try:
        from deployments.serve_app import run_service
    except ImportError as e:
        return fail(f"serve needs Ray Serve: pip install 'presto-ray[ray]' ({e})")
    run_service(config, address=args.address)
    return OK


def add_serve(sub: Subparsers) -> None:
    v = sub.add_parser("serve", help="the OpenAI-compatible HTTP service on Ray Serve (Ctrl-C stops it)")
    v.add_argument("--config", default=None, help="YAML job config (engine, sampler defaults, ray, serve)")
    v.add_argument("--host", default=None, help="bind address (overrides serve.host; default 127.0.0.1)")
    v.add_argument("--port", type=int, default=None, help="port (overrides serve.port; default 8000)")
    add_ray_options(v, None)
    v.set_defaults(func=cmd_serve)


COMMANDS = {"serve": add_serve}

"""`presto-ray model`: prepare the packaged SmolLM2-135M-Instruct (offline) and print its folder."""

from __future__ import annotations

import argparse

from presto_ray.cli.common import OK, Subparsers, fail


def cmd_model(args: argparse.Namespace) -> int:
    from presto_ray.models import ModelProvisionError, prepare_smollm2

    try:
        path = prepare_smollm2(args.dir, force=args.force)
    except ModelProvisionError as e:
        return fail(str(e))
    print(path)
    return OK


def add_model(sub: Subparsers) -> None:
    m = sub.add_parser("model", help="prepare the packaged SmolLM2-135M-Instruct (offline) and print its folder")
    m.add_argument("--dir", default=None, help="target folder (default: the user cache)")
    m.add_argument("--force", action="store_true", help="convert again even if prepared")
    m.set_defaults(func=cmd_model)


COMMANDS = {"model": add_model}

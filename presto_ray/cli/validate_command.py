"""`presto-ray validate`: does prefetching sample the serial chain's law on this model? (serial vs
the config's traversal; with --reference-config, the serial side on another engine)."""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

from presto_ray.cli.check_backend import provenance, run_with_backend
from presto_ray.cli.common import (
    EXAMPLES, OK, BadInput, Subparsers, add_ray_options, fail, load_job_config, progress, validation_message,
    watch_engine_processes,
)  # fmt: skip

if TYPE_CHECKING:
    from presto_ray.backend import Backend
    from presto_ray.job import JobConfig


def cmd_validate(args: argparse.Namespace) -> int:
    from presto_ray.job import encode_prompt
    from presto_ray.output import write_json_atomic
    from presto_ray.prompts import PromptFileError, read_prompts
    from presto_ray.validate import run_validation
    from presto_ray.validate_audit import audit_line, disagreement_lines
    from presto_ray.validate_stats import Margins, samples_needed

    try:
        config = load_job_config(args)
        margins = Margins.parse(args.margin or [])
    except BadInput as e:
        return fail(str(e))
    except ValueError as e:
        return fail(f"--margin: {e}")
    if not 0.0 < args.alpha_level < 0.5:
        return fail("--alpha-level must be in (0, 0.5)")
    if config.sampler.traversal == "serial":
        return fail("sampler.traversal is 'serial': validate compares serial with bfs or predictive prefetching")
    try:
        items = read_prompts(args.prompts)
    except PromptFileError as e:
        return fail(str(e))
    if args.max_samples is not None and args.max_samples < 2:
        return fail("--max-samples must be at least 2")
    try:
        reference_job = _reference_job(args, config)
    except BadInput as e:
        return fail(str(e))
    needed = samples_needed(margins)
    if args.chains is None and needed and len(items) * config.chains_per_prompt < needed:
        # the default run must be able to show equivalence: as many chains as the margin needs
        chains = math.ceil(needed / len(items))
        progress(f"{chains} chains per prompt: about {needed} samples per side are needed to show equivalence "
                 f"within {margins.sd:g} sd (--chains sets fewer)")
        config = config.model_copy(update={"chains_per_prompt": chains})
    # sized for power against the fault too, up to --max-samples per side (--chains: exactly that many)
    most = args.max_samples if args.max_samples is not None else MAX_SAMPLES_FACTOR * max(needed or 0, len(items) * config.chains_per_prompt)
    max_chains = None if args.chains is not None else max(config.chains_per_prompt, most // len(items))

    def work(backend: Backend) -> int:
        prompts = [(item.id, encode_prompt(backend.tokenizer, item)) for item in items]
        reference = None if reference_job is None else _reference_backend(args, config, reference_job, backend, items, prompts)
        try:
            return report_validation(backend, reference, prompts)
        finally:
            if reference is not None:
                reference.close()

    def report_validation(backend: Backend, reference: Backend | None, prompts: list[tuple[str, list[int]]]) -> int:
        report = run_validation(
            backend,
            prompts,
            config.sampler,
            chains_per_prompt=config.chains_per_prompt,
            max_chains_per_prompt=max_chains,
            margins=margins,
            alpha_level=args.alpha_level,
            fault=args.fault,
            reference=reference,
            progress=progress,
        )
        made = provenance(config)
        if reference_job is not None:
            made["reference"] = {"config": args.reference_config, "engine": reference_job.engine.model_dump()}
        write_json_atomic({**report.to_json(), **made}, args.out)
        side = config.sampler.traversal + ("/streaming" if config.sampler.schedule == "streaming" else "")
        serial = "serial" if reference_job is None else f"serial on {reference_job.engine.kind} ({args.reference_config})"
        side += "" if reference_job is None else f" on {config.engine.kind}"
        n = len(prompts) * report.chains_per_prompt
        print(f"{serial} vs {side}: {len(prompts)} prompts x {report.chains_per_prompt} chains = {n} samples per side"
              + (" (FAULT: prefetching without the length correction)" if args.fault else ""))
        print(report.table())
        if line := report.power_line():
            print(line)
        if report.audit is not None:
            print(audit_line(report.audit))
            for line in disagreement_lines(report.audit):
                print(line)
        for note in report.notes:
            print(f"note: {note}")
        for reason in report.reasons:
            print(f"NOT equivalent: {reason}")
        if report.verdict == "equivalence not shown":  # not a difference: too few samples to tell
            print(f"equivalence not shown: {n} per side, about {needed or 'more'} needed" if not needed or n < needed
                  else f"equivalence not shown: {n} per side; no statistic differs beyond its margin")
        print(f"equivalent: {report.equivalent}   (wall time: serial {report.wall_time_s['serial']:.1f} s, "
              f"prefetch {report.wall_time_s['prefetch']:.1f} s)")
        print(f"wrote {args.out}")
        return OK

    return run_with_backend(args, config, work)


def _reference_job(args: argparse.Namespace, config: JobConfig) -> JobConfig | None:
    """--reference-config: the config whose engine runs the serial side, refused (BadInput, naming
    the field) where it would sample another law than the tested config."""
    if not args.reference_config:
        return None
    from pydantic import ValidationError

    from presto_ray.job import ConfigFileError, JobConfig
    from presto_ray.validate_reference import law_difference

    try:
        reference = JobConfig.from_yaml(args.reference_config)
    except ValidationError as e:
        raise BadInput(validation_message(e, args.reference_config)) from None
    except ConfigFileError as e:
        raise BadInput(str(e)) from None
    except (OSError, ValueError) as e:
        raise BadInput(f"--reference-config {args.reference_config}: {e}") from None
    if why := law_difference(config.sampler, reference.sampler, args.reference_config):
        raise BadInput(why)
    return reference


def _reference_backend(
    args: argparse.Namespace, config: JobConfig, reference: JobConfig, tested: Backend, items: list,
    prompts: list[tuple[str, list[int]]],
) -> Backend:
    """The reference config's engine, in process, once its tokens are the tested engine's (ValueError, one line, if not)."""
    from presto_ray.backend import LocalBackend
    from presto_ray.engines import build_engine
    from presto_ray.job import encode_prompt
    from presto_ray.models import ModelProvisionError
    from presto_ray.validate_reference import token_difference

    if config.engine.kind != "vllm" or args.ray:  # else the tested engine's watchdog covers this process already
        watch_engine_processes(reference)
    try:
        backend = LocalBackend(build_engine(reference.engine), reference.max_active_chains)
    except ModelProvisionError as e:
        raise ValueError(f"--reference-config {args.reference_config}: {e}") from None
    try:
        pairs = [(pid, ids, encode_prompt(backend.tokenizer, item)) for (pid, ids), item in zip(prompts, items)]
        eos = (tested.tokenizer.eos_token_id, backend.tokenizer.eos_token_id)
        if why := token_difference(pairs, eos, args.reference_config):
            raise ValueError(why)
    except BaseException:
        backend.close()
        raise
    return backend


MAX_SAMPLES_FACTOR = 4  # validate's default --max-samples: 4 x the run it would make for equivalence alone




def add_validate(sub: Subparsers) -> None:
    a = sub.add_parser(
        "validate",
        help="TOST: does prefetching sample the serial chain's law on this model? (serial vs the config's traversal)",
    )
    a.add_argument("--config", default=None, help="YAML job config (engine, sampler; its traversal is the prefetching side)")
    a.add_argument("--prompts", default=str(EXAMPLES), help="JSONL or Parquet with id and prompt/messages")
    a.add_argument("--chains", type=int, default=None, help="chains per prompt and side (overrides chains_per_prompt)")
    a.add_argument("--seed", type=int, default=None, help="seed of both sides' chains (overrides the config)")
    a.add_argument("--out", default="out/validate.json", help="JSON report (top-level key `equivalent`)")
    a.add_argument(
        "--margin", action="append", default=None, metavar="SD|NAME=VALUE",
        help="equivalence margin: a number sets every statistic's margin in pooled standard deviations "
        "(default 0.5); NAME=VALUE an absolute margin for one statistic (mean_logp0, length, alpha_logp0, "
        "acceptance_rate); repeatable",
    )  # fmt: skip
    a.add_argument("--alpha-level", type=float, default=0.05, help="level of each one-sided test (default 0.05: a 90%% CI)")
    a.add_argument("--fault", action="store_true", help="break the prefetching side's kernel (no length correction): the check "
                   "must fail where the fault changes the law (the power line says whether it can)")
    a.add_argument("--reference-config", default=None, metavar="C",
                   help="run the serial side on C's engine (in process), e.g. the transformers engine in fp32 against "
                   "vLLM: refused unless C's sampler has the same law and its engine the same prompt tokens")
    a.add_argument("--max-samples", type=int, default=None, metavar="N",
                   help="samples per side the run may grow to for 90%% power against the fault (default: 4x the samples "
                   "equivalence needs); ignored with --chains")
    add_ray_options(a, "run the chains through Ray (replicas and the batching coordinator)")
    a.set_defaults(func=cmd_validate)

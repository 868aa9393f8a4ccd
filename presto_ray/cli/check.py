"""`presto-ray eval` (accuracy on a verifiable task) and the command table of the checks (`validate`:
validate_command.py), on a Backend: in process, or through Ray (`eval --ray`: one resumable Ray
Data job per method, deployments/eval_job.py; imported only then)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from presto_ray.cli.check_backend import provenance, run_with_backend
from presto_ray.cli.common import FAILED, OK, BadInput, Subparsers, add_ray_options, fail, progress, validation_message
from presto_ray.cli.validate_command import add_validate

if TYPE_CHECKING:
    from presto_ray.backend import Backend
    from presto_ray.eval_config import EvalConfig
    from presto_ray.evaluate import EvalReport
    from presto_ray.job import JobConfig


def eval_png_path(out: str, png: str | None) -> str | None:
    """Where eval's plot goes: `--png`, else beside `--out` with the suffix .png; '' for none."""
    if png is None:
        return str(Path(out).with_suffix(".png"))
    return png or None


def quick_scaled(data: dict[str, Any], source: str) -> tuple[dict[str, Any], list[str]]:
    """`eval --quick`: the YAML with its `eval.quick` section applied (the engine section replaced,
    sampler, job and eval fields set), and what changed, one line each."""
    from presto_ray.eval_config import QuickScale

    section: dict[str, Any] = data["eval"] if isinstance(data.get("eval"), dict) else {}
    if not section.get("quick"):
        raise BadInput(f"--quick: {source} has no eval.quick section (what to scale to this machine)")
    quick = QuickScale.model_validate(section["quick"])
    out = {**data, "eval": {k: v for k, v in section.items() if k != "quick"}}
    changed = []
    if quick.engine is not None:
        out["engine"] = dict(quick.engine)
        changed.append("engine: " + ", ".join(f"{k} {v}" for k, v in quick.engine.items()))
    if quick.sampler:
        before = data.get("sampler") or {}
        out["sampler"] = {**before, **quick.sampler}
        changed.append("sampler: " + ", ".join(f"{k} {before.get(k, '(default)')} -> {v}" for k, v in quick.sampler.items()))
    for k, v in quick.job.items():
        changed.append(f"{k}: {data.get(k, '(default)')} -> {v}")
        out[k] = v
    for k in ("best_of_n", "samples", "seeds"):
        if (v := getattr(quick, k)) is not None:
            changed.append(f"eval.{k}: {section.get(k, '(default)')} -> {v}")
            out["eval"][k] = v
    out["eval"]["quick"] = section["quick"]  # kept in the report: what --quick did
    return out, changed


def load_eval_configs(args: argparse.Namespace) -> tuple[JobConfig, EvalConfig]:
    """The job config and its `eval:` section, with --quick, --seed, --samples, --seeds and
    --best-of applied."""
    import yaml
    from pydantic import ValidationError

    from presto_ray.config import SamplerConfig
    from presto_ray.job import JobConfig, yaml_error_text

    source = args.config or "default configuration"
    try:
        data = (yaml.safe_load(Path(args.config).read_text()) or {}) if args.config else {}
        if not isinstance(data, dict):
            raise BadInput(f"{args.config}: expected a mapping of sections (engine, sampler, eval ...)")
        if getattr(args, "quick", False):
            data, changed = quick_scaled(data, source)
            quick_n = (data["eval"]["quick"] or {}).get("n")
            if args.n is None and quick_n is not None:
                args.n = quick_n
                changed.append(f"problems: the first {quick_n}")
            progress("--quick: " + "; ".join(changed))
            source += " with --quick"
        job = JobConfig.model_validate(data)
        section = job.eval
        if args.seed is not None:
            job = job.model_copy(update={"sampler": SamplerConfig.model_validate({**job.sampler.model_dump(), "seed": args.seed})})
        overrides = {k: v for k, v in (("samples", args.samples), ("best_of_n", args.best_of), ("seeds", getattr(args, "seeds", None)))
                     if v is not None}  # fmt: skip
        if overrides:
            section = type(section).model_validate({**section.model_dump(), **overrides})
    except ValidationError as e:
        raise BadInput(validation_message(e, source + (" with command-line overrides" if args.seed is not None else ""))) from None
    except yaml.YAMLError as e:  # PyYAML's own text spans several lines, with a copy of the offending one
        raise BadInput(f"{args.config}: not valid YAML: {yaml_error_text(e)}") from None
    except (OSError, ValueError) as e:
        raise BadInput(f"{args.config}: {e}") from None
    return job, section


def cmd_eval(args: argparse.Namespace) -> int:
    from presto_ray.cli.grade import out_replaces_input
    from presto_ray.eval_methods import METHODS
    from presto_ray.eval_plot import plot_report
    from presto_ray.evaluate import run_eval
    from presto_ray.tasks.arithmetic import build_task, gsm8k_rows
    from presto_ray.output import write_json_atomic
    from presto_ray.tasks import DatasetError, load_dataset

    if args.n is not None and args.n < 1:
        return fail("--n must be at least 1")
    if args.seeds is not None and args.seeds < 1:
        return fail("--seeds must be at least 1")
    if clash := out_replaces_input(args.out, dataset=args.dataset):
        return fail(clash)
    if args.export_gsm8k:  # the generated problems as a GSM8K file; no model is started
        if args.dataset:
            return fail("--export-gsm8k writes the generated arithmetic problems: leave out --dataset")
        generated = build_task("arithmetic", args.n or 30, args.task_seed)
        target = Path(args.export_gsm8k)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("".join(json.dumps(row) + "\n" for row in gsm8k_rows(generated)))
        print(f"wrote {len(generated)} arithmetic problems (task seed {args.task_seed}) as GSM8K rows to {target}")
        return OK
    try:
        config, eval_config = load_eval_configs(args)
    except BadInput as e:
        return fail(str(e))
    methods = args.methods.split(",") if args.methods else list(METHODS)
    if unknown := set(methods) - set(METHODS):
        return fail(f"--methods: unknown {sorted(unknown)}; known: {','.join(METHODS)}")
    if args.dataset:
        if args.task == "arithmetic":
            return fail("--task arithmetic is the generated task: leave out --dataset (or give math, gsm8k, humaneval, mcq)")
        try:
            dataset = load_dataset(args.dataset, args.task, args.n)
        except DatasetError as e:
            return fail(str(e))
        task, problems, about = dataset.task, dataset.problems, f"{args.dataset}"
    else:
        task = args.task or "arithmetic"
        if task != "arithmetic":
            return fail(f"--task {task} needs --dataset FILE (the benchmark's rows); without it the task is arithmetic")
        problems = build_task(task, args.n or 30, args.task_seed)
        about = f"task seed {args.task_seed}"
    png = eval_png_path(args.out, args.png)
    if args.work and not args.ray:
        return fail("--work needs --ray (the in-process eval keeps no rows)")

    def finish(report: EvalReport) -> int:
        write_json_atomic({**report.to_json(), **provenance(config)}, args.out)
        per = f", {eval_config.samples} answers per problem" if eval_config.samples > 1 else ""
        per += f", seeds {report.seeds[0]}..{report.seeds[-1]} (greedy: the first)" if len(report.seeds) > 1 else ""
        print(f"{task}: {len(problems)} problems ({about}), answers up to {config.sampler.horizon} tokens{per}")
        print(report.table())
        resumed = sum(m.get("resumed_rows", 0) for m in report.methods)
        if resumed:
            print(f"resumed {resumed} rows an earlier run had finished (engine and wall figures count this run only)")
        wrote = [args.out]
        if png:
            Path(png).parent.mkdir(parents=True, exist_ok=True)
            plot_report(report, png)
            wrote.append(png)
        print("wrote " + " and ".join(wrote))
        return OK

    run: dict[str, Any] = dict(
        eval_config=eval_config, task=task, seed=config.sampler.seed, methods=methods, dataset=args.dataset,
        progress=progress, show_progress=not args.quiet,
    )  # fmt: skip
    if args.ray:
        return _eval_on_ray(args, config, problems, run, finish)

    def work(backend: Backend) -> int:
        return finish(run_eval(backend, problems, config.sampler, **run))

    return run_with_backend(args, config, work)


def _eval_on_ray(
    args: argparse.Namespace, config: JobConfig, problems: list, run: dict[str, Any], finish: Callable[[EvalReport], int]
) -> int:
    """eval --ray: each method a resumable Ray Data job in the work folder (deployments/eval_job.py)."""
    try:
        from deployments.eval_job import BadPromptRow, JobFailed, RayDataEvalRunner, default_work_folder
    except ImportError as e:
        return fail(f"--ray needs Ray Data: pip install 'presto-ray[ray]' ({e})")
    from presto_ray.evaluate import run_eval
    from presto_ray.models import ModelProvisionError

    work = args.work or default_work_folder(args.out)
    if Path(work).is_file():
        return fail(f"--work {work}: is a file; eval --ray keeps a folder of rows there")
    runner = None
    try:
        runner = RayDataEvalRunner(config, work, address=args.address, progress=not args.quiet, say=progress)
        report = run_eval(runner, problems, config.sampler, **run)
    except (ModelProvisionError, BadPromptRow, ValueError) as e:  # a refused work folder, a prompt too long, ...
        return fail(str(e))
    except JobFailed as e:  # not the user's input: exit 1, one line; the finished rows stay for a rerun
        print(f"presto-ray: job failed: {e}", file=sys.stderr)
        return FAILED
    finally:
        if runner is not None:
            runner.close()
    return finish(report)


def add_eval(sub: Subparsers) -> None:
    e = sub.add_parser(
        "eval",
        help="accuracy and cost on a verifiable task or a benchmark file: greedy, temperature 1, tau = 1/alpha, "
        "best-of-n, power sampling",
    )  # fmt: skip
    e.add_argument("--config", default=None, help="YAML job config (engine, sampler: alpha, steps, horizon; eval: prompts, best_of_n, samples)")
    e.add_argument("--dataset", default=None, help="benchmark rows (JSONL or Parquet, a path or a URI pyarrow reads); default: the generated arithmetic task")
    e.add_argument("--task", default=None, choices=("arithmetic", "math", "gsm8k", "humaneval", "mcq"),
                   help="with --dataset: default inferred from the columns; without it: arithmetic (generated word problems, levels 1-3)")
    e.add_argument("--n", type=int, default=None, help="the first N problems (default: all of --dataset; 30 generated)")
    e.add_argument("--task-seed", type=int, default=0, help="seed of the generated problems")
    e.add_argument("--seed", type=int, default=None, help="seed of the sampling methods (overrides the config)")
    e.add_argument("--samples", type=int, default=None, help="answers per problem of the sampling methods (overrides eval.samples; pass@k)")
    e.add_argument("--best-of", type=int, default=None, help="best_of_n's candidates (overrides eval.best_of_n)")
    e.add_argument("--seeds", type=int, default=None,
                   help="run every method with S seeds (seed .. seed + S - 1; overrides eval.seeds): pass@1 as the mean "
                   "over seeds with its spread, pass@k from all answers, paired tests against power")
    e.add_argument("--quick", action="store_true",
                   help="scale a GPU-sized config to this machine by its eval.quick section (engine, horizon, steps, problems)")
    e.add_argument("--methods", default=None,
                   help="comma-separated subset of greedy,temperature_1,low_temperature,best_of_n,power,best_of_n_matched "
                   "(best_of_n_matched runs power too: its budget)")
    e.add_argument("--out", default="out/eval.json", help="JSON report (key `methods`); missing folders are created")
    e.add_argument("--png", default=None, help="plot of accuracy against tokens per problem (default: --out with .png; '' for none)")
    e.add_argument("--export-gsm8k", default=None, metavar="FILE",
                   help="write the generated arithmetic problems (--n, --task-seed) as GSM8K JSONL rows and exit")
    e.add_argument("--quiet", action="store_true", help="no progress bar")
    e.add_argument("--work", default=None, metavar="DIR",
                   help="with --ray: the folder of each method's rows, kept for a rerun to resume (a path or URI every "
                   "node reaches; default: --out with the suffix .work)")
    add_ray_options(e, "run the sampling as a resumable Ray Data job per method (replicas and the batching coordinator)")
    e.set_defaults(func=cmd_eval)


COMMANDS = {"validate": add_validate, "eval": add_eval}

"""`presto-ray eval`'s own settings: the `eval:` section of a job's YAML (read by `presto-ray eval`
only; the other commands' JobConfig does not know it).

    eval:
      best_of_n: 4          # candidates per best_of_n answer
      samples: 1            # answers per problem and seed of the sampling methods (pass@k up to seeds x samples)
      seeds: 1              # eval seeds: every method runs with each (seed, seed + 1, ...); --seeds
      prompts:              # one template per task; `{question}` is the problem's text
        math:
          template: "{question}\\n\\nPlease reason step by step, and put your final answer within \\\\boxed{}."
        humaneval:
          template: "{question}"
          chat: false       # the code is continued as it is, not wrapped in the chat template

The default templates are the tasks' own instructions (presto_ray/tasks/), so a default eval
asks what `Problem.prompt` says. A GPU-sized config (configs/eval_math500.yaml, the field's
reference budget) may carry `quick:`, what `presto-ray eval --quick` changes to run it on a small
machine (`QuickScale`): the engine section, sampler fields, top-level job fields, the problems.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from presto_ray.tasks import arithmetic as arithmetic_task
from presto_ray.tasks import gsm8k as gsm8k_task
from presto_ray.tasks import math as math_task
from presto_ray.tasks import mcq as mcq_task

QUESTION = "{question}"
# tasks whose default is the raw text, not the chat template: HumanEval's prompt is code to continue
RAW_BY_DEFAULT = frozenset({"humaneval"})


class EvalPrompt(BaseModel):
    """How one task's problem becomes the model's prompt."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    template: str = Field(
        description="The prompt; every `{question}` is replaced by the problem's text (MATH: `problem`; GSM8K: "
        "`question`; multiple choice: the question with its lettered options; HumanEval: the code `prompt`; "
        "arithmetic: the word problem). Other braces are kept as written (`\\boxed{}`).",
    )
    chat: bool | None = Field(
        None,
        description="Wrap the prompt in the model's chat template (where engine.chat_template_for_prompts is on) "
        "or give it raw; None: the task's default (humaneval raw, the others through the chat template).",
    )

    @field_validator("template")
    @classmethod
    def _has_question(cls, template: str) -> str:
        if QUESTION not in template:
            raise ValueError(f"a template must contain {QUESTION} (where the problem goes)")
        return template

    def render(self, question: str) -> str:
        return self.template.replace(QUESTION, question)


class EvalPrompts(BaseModel):
    """One template per task; a task left out keeps its default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    arithmetic: EvalPrompt = Field(
        EvalPrompt(template=f"{QUESTION} {arithmetic_task.INSTRUCTION}"), description="The built-in generated task."
    )
    math: EvalPrompt = Field(EvalPrompt(template=f"{QUESTION}\n\n{math_task.INSTRUCTION}"), description="MATH / MATH500.")
    gsm8k: EvalPrompt = Field(EvalPrompt(template=f"{QUESTION}\n{gsm8k_task.INSTRUCTION}"), description="GSM8K.")
    humaneval: EvalPrompt = Field(EvalPrompt(template=QUESTION), description="HumanEval: the code is continued.")
    mcq: EvalPrompt = Field(EvalPrompt(template=f"{QUESTION}\n\n{mcq_task.INSTRUCTION}"), description="Multiple choice.")

    def for_task(self, task: str) -> EvalPrompt:
        prompt: EvalPrompt = getattr(self, task)
        return prompt


class QuickScale(BaseModel):
    """`presto-ray eval --quick`: the config scaled to a small machine. Each field replaces what it
    names; what it leaves out (alpha, the method list, the templates ...) stays as configured."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: dict[str, Any] | None = Field(None, description="The whole engine section that replaces the config's (e.g. vLLM on the CPU with the embedded model).")
    sampler: dict[str, Any] = Field(default_factory=dict, description="Sampler fields replaced (block_size, num_blocks, mh_steps, prefetch_budget ...).")
    job: dict[str, Any] = Field(default_factory=dict, description="Top-level job fields replaced (max_active_chains ...).")
    n: int | None = Field(None, ge=1, description="The first n problems of --dataset (an explicit --n wins).")
    best_of_n: int | None = Field(None, ge=1, le=1024, description="best_of_n's candidates.")
    samples: int | None = Field(None, ge=1, le=1024, description="Answers per problem and seed.")
    seeds: int | None = Field(None, ge=1, le=1024, description="Eval seeds (an explicit --seeds wins).")

    @field_validator("sampler", "job")
    @classmethod
    def _no_sections(cls, fields: dict[str, Any]) -> dict[str, Any]:
        if "eval" in fields or "engine" in fields or "sampler" in fields:
            raise ValueError("names fields of its own section only (engine, sampler and eval fields go in their own keys)")
        return fields


class EvalConfig(BaseModel):
    """`presto-ray eval`: the prompts, best_of_n's candidates, the answers per problem, the grader's limits."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    prompts: EvalPrompts = Field(EvalPrompts(), description="The prompt template of each task.")
    best_of_n: int = Field(
        4, ge=1, le=1024,
        description="best_of_n: candidates sampled at the proposal temperature tau per answer; the one with the "
        "highest mean log p0 per token is the answer.",
    )
    samples: int = Field(
        1, ge=1, le=1024,
        description="Answers per problem and seed of temperature_1, low_temperature, best_of_n, power and "
        "best_of_n_matched (pass@k for k up to seeds x samples); greedy is deterministic and answers once.",
    )
    seeds: int = Field(
        1, ge=1, le=1024,
        description="Eval seeds: every method runs with seed, seed + 1, ..., seed + seeds - 1 (each seed's answers "
        "are a one-seed run's with that seed); pass@1 is the mean over seeds, with its spread; greedy answers once.",
    )
    batch_size: int = Field(
        64, ge=1, le=100_000,
        description="Plain generations (greedy, temperature_1, low_temperature, best_of_n) per engine call; the "
        "progress bar moves once per call.",
    )
    grade_timeout_s: float = Field(5.0, gt=0.0, le=3600.0, description="humaneval: seconds per sample's tests.")
    grade_memory_mb: int = Field(1024, ge=64, le=1_048_576, description="humaneval: address space per sample.")
    quick: QuickScale | None = Field(None, description="What `presto-ray eval --quick` changes to run a GPU-sized config on a small machine.")

    def prompt(self, task: str, question: str) -> tuple[str, bool]:
        """The prompt text for `question` of `task`, and whether it goes through the chat template."""
        spec = self.prompts.for_task(task)
        chat = spec.chat if spec.chat is not None else task not in RAW_BY_DEFAULT
        return spec.render(question), chat

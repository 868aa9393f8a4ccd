"""`presto-ray eval`'s own settings: the `eval:` section of a job's YAML (read by `presto-ray eval`
only; the other commands' JobConfig does not know it).

    eval:
      best_of_n: 4          # candidates per best_of_n answer
      samples: 1            # answers per problem of the sampling methods (pass@k up to this)
      prompts:              # one template per task; `{question}` is the problem's text
        math:
          template: "{question}\\n\\nPlease reason step by step, and put your final answer within \\\\boxed{}."
        humaneval:
          template: "{question}"
          chat: false       # the code is continued as it is, not wrapped in the chat template

The default templates are the tasks' own instructions (presto_ray/tasks/), so a default eval
asks what `Problem.prompt` says.
"""

from __future__ import annotations

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
        description="Answers per problem of temperature_1, low_temperature, best_of_n and power (pass@k for k up "
        "to this); greedy is deterministic and answers once.",
    )
    batch_size: int = Field(
        64, ge=1, le=100_000,
        description="Plain generations (greedy, temperature_1, low_temperature, best_of_n) per engine call; the "
        "progress bar moves once per call.",
    )
    grade_timeout_s: float = Field(5.0, gt=0.0, le=3600.0, description="humaneval: seconds per sample's tests.")
    grade_memory_mb: int = Field(1024, ge=64, le=1_048_576, description="humaneval: address space per sample.")

    def prompt(self, task: str, question: str) -> tuple[str, bool]:
        """The prompt text for `question` of `task`, and whether it goes through the chat template."""
        spec = self.prompts.for_task(task)
        chat = spec.chat if spec.chat is not None else task not in RAW_BY_DEFAULT
        return spec.render(question), chat

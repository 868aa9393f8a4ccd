"""A bounded HTTP load for the multi-node service tests: `clients` threads, each sending one
completion (half of them streamed, half with n = 2) over real HTTP, each answer sorted as a
whole completion, an error in OpenAI's shape, or a failure (a hang past the timeout, a cut
stream, a body of another shape). Nothing retries: every request is answered once or fails."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

REQUEST_TIMEOUT_S = 60.0


def body(i: int, stream: bool) -> dict:
    return {
        "model": "toy", "prompt": f"Question {i % 8}: name a prime", "max_tokens": 16, "block_size": 8,
        "mh_steps": 4, "prefetch_budget": 4, "n": 1 + i % 2, "seed": 1000 + i, "stream": stream,
    }  # fmt: skip


@dataclass
class Answer:
    index: int
    stream: bool
    status: int | None = None
    texts: list[str] | None = None  # a whole completion's choices
    error: dict | None = None  # OpenAI's error object
    failure: str | None = None  # neither: what went wrong
    seconds: float = 0.0


@dataclass
class LoadResult:
    answers: list[Answer] = field(default_factory=list)

    @property
    def completed(self) -> list[Answer]:
        return [a for a in self.answers if a.texts is not None]

    @property
    def errors(self) -> list[Answer]:
        return [a for a in self.answers if a.error is not None]

    @property
    def failures(self) -> list[Answer]:
        return [a for a in self.answers if a.failure is not None]

    def counts(self) -> dict:
        statuses: dict[str, int] = {}
        for a in self.errors:
            statuses[str(a.status)] = statuses.get(str(a.status), 0) + 1
        return {"requests": len(self.answers), "completed": len(self.completed), "errors": statuses,
                "failures": [f"{a.index}: {a.failure}" for a in self.failures],
                "slowest_s": round(max((a.seconds for a in self.answers), default=0.0), 2)}  # fmt: skip


def _error_object(response: httpx.Response, text: str) -> dict | None:
    try:
        error = json.loads(text).get("error")
    except (ValueError, AttributeError):
        return None
    if isinstance(error, dict) and isinstance(error.get("message"), str) and "type" in error:
        return error
    return None


def send(url: str, i: int, stream: bool) -> Answer:
    answer = Answer(i, stream)
    started = time.monotonic()
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body(i, stream), timeout=REQUEST_TIMEOUT_S) as r:
            answer.status = r.status_code
            if r.status_code != 200:
                text = r.read().decode("utf-8", "replace")
                answer.error = _error_object(r, text)
                if answer.error is None:
                    answer.failure = f"status {r.status_code} outside OpenAI's shape: {text[:200]!r}"
            elif not stream:
                answer.texts = [c["text"] for c in json.loads(r.read())["choices"]]
            else:
                texts: dict[int, str] = {}
                done = False
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: "):
                        event = json.loads(line[6:])
                        if "error" in event:
                            answer.error = event["error"]
                        for choice in event.get("choices", ()):
                            texts[choice["index"]] = texts.get(choice["index"], "") + choice.get("text", "")
                if answer.error is None:
                    if done:
                        answer.texts = [texts[k] for k in sorted(texts)]
                    else:
                        answer.failure = "the stream ended without [DONE]"
    except httpx.TimeoutException:
        answer.failure = f"no answer within {REQUEST_TIMEOUT_S:g} s"
    except httpx.HTTPError as e:
        answer.failure = f"{type(e).__name__}: {e}"
    answer.seconds = time.monotonic() - started
    return answer


def run_load(url: str, clients: int = 32, first: int = 0) -> LoadResult:
    """`clients` requests at once (request i streams when i is odd); returns when all are answered."""
    with ThreadPoolExecutor(clients) as pool:
        answers = list(pool.map(lambda i: send(url, i, stream=i % 2 == 1), range(first, first + clients)))
    return LoadResult(answers)

"""The load test's and the soak's HTTP clients (bench/load_test.py): what they send, how each
answer is checked, and the one loop every client runs.

A request is a GoodRequest (a kind of MIX: plain and `n = 2` completions, chat, streams, some with
`stream_options.include_usage`, and clients that leave mid-request) or a BadRequest (one the
service must refuse with a 4xx). What a client sends next is a NextRequest: the load test's
rounds (`timed_mix`: each client its own walk through MIX until a deadline) and the soak
(`soak_mix`: a fixed number shared by all clients, bad ones mixed in) differ only there.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import httpx

# one client's loop: what it asks, in order (kind, n)
MIX: list[tuple[str, int]] = [
    ("plain", 1), ("stream", 2), ("chat", 1), ("leave_stream", 2),
    ("plain", 2), ("stream_usage", 1), ("leave_whole", 1), ("chat_stream", 1),
]  # fmt: skip
LEAVE_WHOLE_AFTER_S = 0.05  # a client that gives up on a whole answer waits this long for it
REQUEST_TIMEOUT_S = 120.0


@dataclass
class Round:
    """What the clients of one round saw."""

    latencies_s: list[float] = field(default_factory=list)  # answered requests, to their last byte
    answered: int = 0
    left: int = 0  # the client left on purpose
    errors: list[str] = field(default_factory=list)
    sent: int = 0
    ids: list[str] = field(default_factory=list)  # every answer's id (duplicates are a failure)
    problems: list[str] = field(default_factory=list)  # answers that were wrong or incomplete
    refused: dict[str, int] = field(default_factory=dict)  # bad requests (the soak's) by status or error


def _body(kind: str, n: int, seed: int) -> tuple[str, dict]:
    chat = kind.startswith("chat")
    body: dict = {"max_tokens": 16, "block_size": 8, "n": n, "seed": seed}
    if chat:
        body["messages"] = [{"role": "user", "content": f"Question {seed % 7}?"}]
    else:
        body["prompt"] = f"Question {seed % 7}: name a prime"  # few prompts: their calls merge
    if kind in ("stream", "stream_usage", "chat_stream", "leave_stream"):
        body["stream"] = True
    if kind == "stream_usage":
        body["stream_options"] = {"include_usage": True}
    if kind.startswith("leave"):
        body["mh_steps"] = 50  # long enough that the client leaves well before the end
    return ("/v1/chat/completions" if chat else "/v1/completions"), body


def _check_whole(body: dict, seed: int, n: int) -> str | None:
    if body.get("power_sampling", {}).get("seed") != seed:
        return f"answer carries seed {body.get('power_sampling')} for a request with seed {seed}"
    if sorted(c["index"] for c in body["choices"]) != list(range(n)):
        return f"answer has choices {[c['index'] for c in body['choices']]} for n = {n}"
    return None


def _check_stream(events: list[dict], n: int, include_usage: bool) -> str | None:
    ids = {e.get("id") for e in events}
    if len(ids) != 1:
        return f"one stream carried ids {ids}"
    done = [e["choices"][0]["index"] for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    if sorted(done) != list(range(n)):
        return f"stream ended choices {done} for n = {n}"
    if include_usage and (events[-1]["choices"] or not events[-1].get("usage")):
        return "include_usage: the last chunk is not the usage chunk"
    return None


@dataclass(frozen=True)
class GoodRequest:
    """One request of the mix: its kind (MIX), its `n` and its seed."""

    kind: str
    n: int
    seed: int


@dataclass(frozen=True)
class BadRequest:
    """A request the service must refuse with a 4xx in OpenAI's error shape."""

    method: str
    path: str
    body: bytes
    headers: dict[str, str]


# what client `c` sends next, None once it is done: the load test's rounds and the soak differ only here
NextRequest = Callable[[int], GoodRequest | BadRequest | None]


async def _one_request(http: httpx.AsyncClient, url: str, kind: str, n: int, seed: int, result: Round) -> None:
    import httpx

    path, body = _body(kind, n, seed)
    started = time.perf_counter()
    result.sent += 1
    try:
        if kind == "leave_whole":
            try:
                await http.post(f"{url}{path}", json=body, timeout=httpx.Timeout(REQUEST_TIMEOUT_S, read=LEAVE_WHOLE_AFTER_S))
            except httpx.ReadTimeout:
                result.left += 1
                return
            result.problems.append("a request meant to be left was answered first")  # the round is too fast for this mix
            return
        if body.get("stream"):
            events, ended = [], False
            async with http.stream("POST", f"{url}{path}", json=body, timeout=REQUEST_TIMEOUT_S) as response:
                if response.status_code != 200:
                    result.errors.append(f"{response.status_code}: {(await response.aread())[:200]!r}")
                    return
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        ended = True
                        break
                    event = json.loads(line.removeprefix("data: "))
                    if "error" in event:
                        result.errors.append(f"stream error: {event['error']['message']}")
                        return
                    events.append(event)
                    if kind == "leave_stream":
                        result.left += 1
                        return  # closing the stream here is the client leaving
            problem = "a stream ended without [DONE]" if not ended else _check_stream(events, n, kind == "stream_usage")
            answer_id = events[0]["id"] if events else ""  # (no events: _check_stream named the problem)
        else:
            response = await http.post(f"{url}{path}", json=body, timeout=REQUEST_TIMEOUT_S)
            if response.status_code != 200:
                result.errors.append(f"{response.status_code}: {response.text[:200]}")
                return
            whole = response.json()
            problem, answer_id = _check_whole(whole, seed, n), whole["id"]
    except httpx.HTTPError as e:
        result.errors.append(f"{type(e).__name__}: {e}")
        return
    if problem:
        result.problems.append(problem)
        return
    result.answered += 1
    result.ids.append(answer_id)
    result.latencies_s.append(time.perf_counter() - started)


async def _one_bad_request(http: httpx.AsyncClient, url: str, request: BadRequest, result: Round) -> None:
    """A bad request: refused with a 4xx and an error body is right (counted by status in
    `result.refused`); anything else is a problem."""
    import httpx

    method, path = request.method, request.path
    try:
        r = await http.request(method, f"{url}{path}", content=request.body or None, headers=request.headers, timeout=REQUEST_TIMEOUT_S)
        key = str(r.status_code)
        if r.status_code >= 500 or "error" not in r.json():
            result.problems.append(f"bad request {method} {path}: {r.status_code} {r.text[:200]}")
    except (httpx.HTTPError, ValueError) as e:
        key = type(e).__name__
        result.problems.append(f"bad request {method} {path}: {key}")
    result.refused[key] = result.refused.get(key, 0) + 1


async def run_clients(url: str, clients: int, next_request: NextRequest, result: Round) -> None:
    """`clients` concurrent loops over one connection pool, client `c` sending `next_request(c)`
    until it says None (what is in flight then runs to its end)."""
    import httpx

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def client(c: int, http: httpx.AsyncClient) -> None:
        while (request := next_request(c)) is not None:
            if isinstance(request, BadRequest):
                await _one_bad_request(http, url, request, result)
            else:
                await _one_request(http, url, request.kind, request.n, request.seed, result)

    async with httpx.AsyncClient(limits=limits, trust_env=False) as http:
        await asyncio.gather(*(client(c, http) for c in range(clients)))


def timed_mix(duration_s: float, first_seed: int) -> NextRequest:
    """The load test's rounds: each client loops over MIX (client c starting at its c-th entry),
    its own seeds, until `duration_s` from now is over."""
    deadline = time.perf_counter() + duration_s
    sent: dict[int, int] = {}

    def next_request(c: int) -> GoodRequest | None:
        if time.perf_counter() >= deadline:
            return None
        i = sent[c] = sent.get(c, -1) + 1
        kind, n = MIX[(c + i) % len(MIX)]
        return GoodRequest(kind, n, first_seed + c * 100_000 + i)

    return next_request


# requests the service must refuse (4xx), mixed in with the good ones: what an attacker probe sends
BAD_REQUESTS: list[BadRequest] = [
    BadRequest("POST", "/v1/completions", b'{"prompt": "hi", ', {"content-type": "application/json"}),
    BadRequest("POST", "/v1/completions", b'{"prompt":"hi","max_tokens":-5,"max_tokens":8}', {"content-type": "application/json"}),
    BadRequest("POST", "/v1/completions", b'{"prompt":"hi","mh_step":5}', {"content-type": "application/json"}),
    BadRequest("POST", "/v1/chat/completions", b'{"messages":[{"role":"user","contnet":"hi"}]}', {"content-type": "application/json"}),
    BadRequest("POST", "/v1/completions", '{"prompt":"hi"}'.encode("utf-16"), {"content-type": "application/json"}),
    BadRequest("POST", "/v1/completions", b'{"prompt":"hi"}', {"content-type": "text/plain"}),
    BadRequest("GET", "/v1/nothing", b"", {}),
    BadRequest("GET", "/v1/completions", b"", {}),
    BadRequest("GET", "/v1/models", b"", {"x-big": "a" * 100_000}),
]  # fmt: skip
SOAK_BAD_EVERY = 3  # one request in this many is a bad one


def soak_mix(total: int) -> NextRequest:
    """The soak's requests: `total` of them shared by all clients, in order, one in SOAK_BAD_EVERY
    a bad one, the others MIX's."""
    counter = iter(range(total))

    def next_request(c: int) -> GoodRequest | BadRequest | None:
        i = next(counter, None)
        if i is None:
            return None
        if i % SOAK_BAD_EVERY == SOAK_BAD_EVERY - 1:
            return BAD_REQUESTS[(i // SOAK_BAD_EVERY) % len(BAD_REQUESTS)]
        kind, n = MIX[i % len(MIX)]
        return GoodRequest(kind, n, 1 + i)

    return next_request

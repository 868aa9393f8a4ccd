"""The OpenAI-compatible Serve application on a real local Ray cluster, called over real HTTP with
the real `openai` client (and raw HTTP for bad input): samples equal the in-process sampler's.
What needs no Ray is tested in process: tests/test_ingress_app.py (the replica's routes, token,
guard and body bounds), test_ingress_guard.py, test_header_timeout.py, test_proxy_callback.py and
test_load_test_verdicts.py."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from presto_ray.config import SamplerConfig
from presto_ray.driver import sample
from presto_ray.job import JobConfig
from presto_ray.keys import derive_seed
from presto_ray.openai import StatsResponse
from raw_sockets import PARTIAL_HEAD, raw_request, read_until_closed, silent
from waiting import wait_for

ray = pytest.importorskip("ray")
from deployments.proxy_callback import PROXY_CALLBACK, PROXY_CALLBACK_ENV  # noqa: E402

# Serve's proxy runs our proxy callback (the client's X-Request-Id checked, headers bounded in
# time) when this is set where Ray starts, as `presto-ray serve` sets it: the session's Ray
# starts after collection
os.environ.setdefault(PROXY_CALLBACK_ENV, PROXY_CALLBACK)
os.environ.setdefault("PRESTO_RAY_HEADER_TIMEOUT_S", "3")  # the proxy's bound on sending headers, read there
READ_TIMEOUT_S = 3.0

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

TOY = {
    "engine": {"kind": "toy", "vocab_size": 48, "logit_scale": 3.0, "eos_bias": -2.0, "max_model_len": 512},
    "sampler": {"block_size": 8, "mh_steps": 4, "prefetch_budget": 4, "seed": 0, "schedule": "rounds"},
    # LONG (below) is long on purpose: its bound (2 x 16,016 events x budget x 128 tokens) is over
    # the default serve.max_request_tokens at the budgets some tests give it
    "serve": {"request_read_timeout_s": READ_TIMEOUT_S, "max_request_tokens": 100_000_000},
}
KEY = "test-secret"


@pytest.fixture(scope="module")
def toy_service(serve_base_url):
    from ray import serve

    from deployments.serve_app import app_for

    # two ingress replicas over one engine pool: every toy test goes through either
    config = JobConfig.model_validate({**TOY, "serve": {**TOY["serve"], "ingress_replicas": 2}})
    # and Serve autoscaling of the ingress (between one and two replicas)
    autoscaled = {"ingress_autoscaling": {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 8}}
    secured = JobConfig.model_validate({**TOY, "serve": {**TOY["serve"], "api_key": KEY, **autoscaled}})
    serve.run(app_for(config), name="toy", route_prefix="/toy")
    serve.run(app_for(secured), name="secured", route_prefix="/secured")
    yield f"{serve_base_url}/toy", config
    serve.delete("toy")
    serve.delete("secured")


def client(url: str, key: str = "none") -> "openai.OpenAI":
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)


def expected_texts(config: JobConfig, prompt_ids, seed: int, n: int, **fields) -> list[str]:
    """The in-process sampler on the same toy model: choice i uses derive_seed(seed, i)."""
    engine = config.engine.build()
    base = config.sampler.model_dump()
    out = []
    for i in range(n):
        sampler = SamplerConfig.model_validate({**base, **fields, "seed": derive_seed(seed, i)})
        out.append(engine.tokenizer.decode(sample(engine, prompt_ids, sampler).token_ids))
    return out


def test_health_and_models(toy_service):
    url, _ = toy_service
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    assert [m.id for m in client(url).models.list().data] == ["toy"]


def test_completion_with_extra_body_equals_the_in_process_sampler(toy_service):
    url, config = toy_service
    power = {"alpha": 3.0, "mh_steps": 5, "prefetch_budget": 6, "traversal": "bfs", "block_size": 8}
    response = client(url).completions.create(model="toy", prompt="The answer is", max_tokens=16, n=3, seed=42, extra_body=power)
    prompt_ids = config.engine.build().tokenizer.encode_raw("The answer is")
    fields = {k: v for k, v in power.items()} | {"num_blocks": 2}
    assert [c.text for c in response.choices] == expected_texts(config, prompt_ids, 42, 3, **fields)
    for choice in response.choices:
        stats = choice.model_extra["power_sampling"]
        assert stats["transitions"] == 10 and stats["seed"] == derive_seed(42, choice.index)
        assert stats["stream_batches"] == 0 and 0 < stats["rounds"] <= stats["transitions"] + 2
        assert choice.finish_reason in ("stop", "length")
    assert response.usage.prompt_tokens == len(prompt_ids)
    assert response.model_extra["power_sampling"]["seed"] == 42


def test_token_id_prompt_and_temperature_mapping(toy_service):
    url, config = toy_service
    response = client(url).completions.create(model="toy", prompt=[5, 6, 7], max_tokens=8, seed=3, temperature=0.5)
    assert [c.text for c in response.choices] == expected_texts(config, [5, 6, 7], 3, 1, alpha=2.0)


def test_chat_completion_equals_the_in_process_sampler(toy_service):
    url, config = toy_service
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    response = client(url).chat.completions.create(model="toy", messages=messages, max_tokens=8, n=2, seed=9)
    prompt_ids = config.engine.build().tokenizer.apply_chat_template(messages)
    assert [c.message.content for c in response.choices] == expected_texts(config, prompt_ids, 9, 2)
    assert response.object == "chat.completion" and response.choices[0].message.role == "assistant"


def test_streaming_sends_progress_then_the_same_text(toy_service):
    url, _ = toy_service
    c = client(url)
    args = {"model": "toy", "prompt": "Stream me", "max_tokens": 16, "n": 2, "seed": 5, "extra_body": {"block_size": 8}}
    whole = c.completions.create(**args)
    texts, progress = {0: "", 1: ""}, 0
    for chunk in c.completions.create(stream=True, **args):
        event = chunk.model_extra["power_sampling"]
        progress += event["event"] == "progress"
        texts[chunk.choices[0].index] += chunk.choices[0].text
    assert progress >= 2
    assert [texts[0], texts[1]] == [ch.text for ch in whole.choices]

    chat = {"model": "toy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "seed": 1}
    whole = c.chat.completions.create(**chat)
    streamed = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(stream=True, **chat))
    assert streamed == whole.choices[0].message.content


def test_a_streaming_schedule_service_answers_with_the_serial_samples(serve_base_url):
    """`sampler.schedule: streaming` in the service's config: chains stream through the coordinator."""
    from ray import serve

    from deployments.serve_app import app_for

    config = JobConfig.model_validate({**TOY, "sampler": {**TOY["sampler"], "schedule": "streaming", "prefetch_budget": 6}})
    serve.run(app_for(config), name="streaming", route_prefix="/streaming")
    try:
        c = client(f"{serve_base_url}/streaming")
        args = {"model": "toy", "prompt": "The answer is", "max_tokens": 16, "n": 2, "seed": 9}
        whole = c.completions.create(**args)
        prompt_ids = config.engine.build().tokenizer.encode_raw("The answer is")
        serial = expected_texts(config, prompt_ids, 9, 2, traversal="serial", schedule="rounds", num_blocks=2)
        assert [ch.text for ch in whole.choices] == serial
        assert all(ch.model_extra["power_sampling"]["transitions"] > 0 for ch in whole.choices)
        texts, progress = {0: "", 1: ""}, 0
        for chunk in c.completions.create(stream=True, **args):
            progress += chunk.model_extra["power_sampling"]["event"] == "progress"
            texts[chunk.choices[0].index] += chunk.choices[0].text
        assert progress >= 2 and [texts[0], texts[1]] == serial
        # a client that leaves: its chains stop and the coordinator aborts their running requests
        check_a_disconnect_stops_its_chains(f"{serve_base_url}/streaming")
    finally:
        serve.delete("streaming")


GOOD = {"model": "toy", "prompt": "hello", "max_tokens": 8, "seed": 1}
# Every rule is tested as a pure function in test_openai_api.py; these few show the HTTP path
# carries status, param and message for each kind of error.
BAD_INPUTS = [
    ({"alpha": 0.5}, 400, "alpha"),  # a power-sampling field the sampler config rejects
    ({"n": "two"}, 400, "n"),  # a type error
    ({"stop": ["\n"]}, 400, "stop"),  # a field power sampling cannot honour
    ({"prompt": "x" * 600}, 400, "prompt"),  # over the 512-token context
    ({"model": "gpt-4"}, 404, "model"),
]


@pytest.mark.parametrize("change,status,param", BAD_INPUTS, ids=[p for _, _, p in BAD_INPUTS])
def test_bad_completion_fields_get_a_4xx_naming_the_field(toy_service, change, status, param):
    url, _ = toy_service
    response = httpx.post(f"{url}/v1/completions", json={**GOOD, **change}, timeout=60)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and param in error["message"] and error["type"]


def test_bad_bodies_then_a_good_request(toy_service):
    url, _ = toy_service
    post = lambda path, **kw: httpx.post(f"{url}{path}", timeout=60, **kw)  # noqa: E731
    headers = {"content-type": "application/json"}
    r = post("/v1/completions", content=b'{"prompt": "hi", ', headers=headers)
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]["message"]
    r = post("/v1/completions", content=json.dumps({**GOOD, "prompt": "y" * 2_000_000}).encode(), headers=headers)
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]
    r = post("/v1/chat/completions", json={"model": "toy", "messages": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    good = post("/v1/completions", json=GOOD)
    assert good.status_code == 200 and good.json()["choices"][0]["text"]


def test_bearer_token(toy_service, serve_base_url):
    secured = f"{serve_base_url}/secured"
    assert httpx.get(f"{secured}/health").status_code == 200  # probes need no key
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": KEY}):
        r = httpx.post(f"{secured}/v1/completions", json=GOOD, headers=headers, timeout=60)
        assert r.status_code == 401 and r.json()["error"]["type"] == "invalid_api_key"
    assert httpx.get(f"{secured}/v1/models").status_code == 401
    with pytest.raises(openai.AuthenticationError):
        client(secured, "wrong").completions.create(**GOOD)
    assert client(secured, KEY).completions.create(**GOOD).choices[0].text


def test_concurrent_requests_share_merged_calls(toy_service):
    """Through both ingress replicas, into one coordinator: every request's proposals are counted
    there, and they merge into shared calls."""
    from ray._private.state import actors  # the GCS's actor table: the state API needs the dashboard

    url, config = toy_service
    before = httpx.get(f"{url}/v1/stats").json()
    c = client(url)

    def ask(seed: int):
        raw = c.completions.with_raw_response.create(
            model="toy", prompt=f"question {seed % 4}", max_tokens=16, seed=seed, extra_body={"block_size": 8}
        )
        return raw.headers["x-presto-ingress-replica"], raw.parse()

    with ThreadPoolExecutor(16) as pool:
        answered = list(pool.map(ask, range(16)))
    after = httpx.get(f"{url}/v1/stats").json()
    assert StatsResponse.model_validate(after).model_dump(mode="json") == after  # the typed body, nothing else
    replicas, responses = {tag for tag, _ in answered}, [r for _, r in answered]
    assert len(replicas) == 2, "Serve spreads concurrent requests over both ingress replicas"
    alive = [a["ActorClassName"] for a in actors().values() if a["State"] == "ALIVE"]
    assert alive.count("ServeReplica:toy:SamplingPool") == 1 and alive.count("ServeReplica:toy:PrestoIngress") == 2
    requests = sum(r.choices[0].model_extra["power_sampling"]["requests"] for r in responses)
    assert after["submitted_requests"] - before["submitted_requests"] == requests, "one coordinator saw them all"
    assert len({r.id for r in responses}) == 16
    tokenizer = config.engine.build().tokenizer
    for seed, response in enumerate(responses):
        (choice,) = response.choices
        assert choice.text == expected_texts(config, tokenizer.encode_raw(f"question {seed % 4}"), seed, 1, num_blocks=2)[0]
    chain_rounds = sum(r.choices[0].model_extra["power_sampling"]["rounds"] for r in responses)
    calls = after["calls"] - before["calls"]
    assert calls < 0.5 * chain_rounds, (calls, chain_rounds)


@pytest.mark.ray  # the command starts its own local Ray
def test_presto_ray_serve_command_serves_until_interrupted(tmp_path):
    """`presto-ray serve` on its own local Ray: it answers, then Ctrl-C stops it cleanly."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import threading

    import yaml

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "toy.yaml"
    config.write_text(yaml.safe_dump(TOY))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    command = [sys.executable, "-m", "presto_ray.cli", "serve", "--config", str(config), "--port", str(port)]
    server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []

    def read_output() -> None:
        for line in server.stdout:
            lines.append(line)

    reader = threading.Thread(target=read_output, daemon=True)
    reader.start()
    announced = f"serving toy at http://127.0.0.1:{port}/v1"

    def serving() -> bool:
        # the line, not /health: the ingress answers /health seconds before serve.run returns
        assert server.poll() is None, "".join(lines)
        return any(announced in line for line in lines)

    try:
        wait_for(serving, 180, "presto-ray serve to say where it serves", interval_s=0.5)
        response = client(f"http://127.0.0.1:{port}").completions.create(**GOOD)
        assert response.choices[0].text
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=120)
        reader.join(timeout=10)
    output = "".join(lines)
    assert "presto-ray: stopping the service" in output, output
    assert server.returncode == 0, output


# --- hardening (issue 15): through the real HTTP server ---------------------------------------
def test_a_500_carries_an_error_id_and_no_internals(serve_base_url):
    """A failure that is not the client's (here the service's coordinator died and may not
    restart) answers a generic message with an error id; the details stay in the server log."""
    import ray
    from ray import serve

    from deployments.serve_app import app_for

    broken = JobConfig.model_validate({**TOY, "ray": {"coordinator_max_restarts": 0}})
    serve.run(app_for(broken), name="broken", route_prefix="/broken")
    try:
        # this application's own coordinator (asked of its pool, so no other test's is touched)
        pool = serve.get_deployment_handle("SamplingPool", app_name="broken")
        (coordinator,) = pool.coordinators.remote().result(timeout_s=120).handles
        ray.kill(coordinator, no_restart=True)
        url = f"{serve_base_url}/broken"
        r = httpx.post(f"{url}/v1/completions", json=GOOD, timeout=60)
        assert r.status_code == 500, r.text
        error = r.json()["error"]
        assert error["type"] == "server_error" and error["message"].split()[-1].startswith("err-")
        for internal in ("Traceback", "File ", "Coordinator", "Actor", "\x1b[", "pid=", "ip="):
            assert internal not in r.text, internal
        with pytest.raises(openai.InternalServerError):
            client(url).completions.create(**GOOD)
        streamed = httpx.post(f"{url}/v1/completions", json={**GOOD, "stream": True}, timeout=60).text
        assert '"server_error"' in streamed and "err-" in streamed and "Coordinator" not in streamed
    finally:
        serve.delete("broken")


def test_bad_numbers_unknown_fields_and_surrogates_are_400s_through_the_client(toy_service):
    url, _ = toy_service
    c = client(url)
    cases = [
        ({"extra_body": {"alpha": 1e308}}, "alpha"),  # the client cannot send Infinity: the raw test does
        ({"temperature": 1e-320}, "temperature"),
        ({"extra_body": {"top_k": 40}}, "top_k"),
        ({"extra_body": {"mh_step": 5}}, "mh_step"),
        ({"max_tokens": 512, "extra_body": {"block_size": 1}}, "block_size"),
        ({"max_tokens": 256, "extra_body": {"block_size": 1, "mh_steps": 1000}}, "mh_steps"),
    ]
    for change, param in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            c.completions.create(**{**GOOD, **change})
        assert caught.value.body["param"] == param, (change, caught.value.body)
    # neutral values of unsupported fields pass
    assert c.completions.create(**GOOD, best_of=1, extra_body={"tools": [], "logprobs": 0}).choices[0].text


def test_raw_bodies_that_used_to_be_500s(toy_service):
    url, _ = toy_service
    headers = {"content-type": "application/json"}
    for raw, words in [
        (b'{"prompt":"abc","max_tokens":16,"alpha":1e400}', "alpha"),
        (b'{"prompt":"abc","alpha":Infinity}', "alpha"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"prompt":"abc\\ud800","max_tokens":8}', "surrogate"),  # the openai client cannot send one
    ]:
        r = httpx.post(f"{url}/v1/completions", content=raw, headers=headers, timeout=60)
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    chat = b'{"messages":[{"role":"user","content":"\\udfff"}],"max_tokens":8}'
    r = httpx.post(f"{url}/v1/chat/completions", content=chat, headers=headers, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text


def test_non_json_content_types_are_refused(toy_service):
    url, _ = toy_service
    body = json.dumps(GOOD).encode()
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"content-type": content_type} if content_type else {}
        r = httpx.post(f"{url}/v1/completions", content=body, headers=headers, timeout=60)
        assert r.status_code == 415 and "application/json" in r.json()["error"]["message"], (content_type, r.text)


def test_auth_guards_the_docs_and_challenges(toy_service, serve_base_url):
    secured = f"{serve_base_url}/secured"
    for path in ("/docs", "/redoc", "/openapi.json", "/v1/models", "/v1/stats"):
        r = httpx.get(f"{secured}{path}", timeout=60)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer"), path
    for scheme in ("Bearer", "bearer", "BEARER"):
        r = httpx.get(f"{secured}/openapi.json", headers={"authorization": f"{scheme} {KEY}"}, timeout=60)
        assert r.status_code == 200 and "/v1/completions" in r.json()["paths"], scheme
    assert httpx.get(f"{secured}/docs", headers={"authorization": f"Bearer {KEY}"}, timeout=60).status_code == 200
    url, _ = toy_service  # no key set: the docs are open
    assert httpx.get(f"{url}/docs", timeout=60).status_code == 200


FUZZ = {**TOY, "serve": {"max_tokens_limit": 16, "max_n": 2, "max_mh_steps": 4, "max_prefetch_budget": 4, "max_request_work": 2000}}
FIELDS = ("model", "prompt", "messages", "max_tokens", "n", "seed", "temperature", "top_p", "stream", "alpha",
          "mh_steps", "block_size", "prefetch_budget", "traversal", "sampler", "logprobs", "stop", "best_of", "top_k")  # fmt: skip


def _fuzz_bodies():
    scalars = st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats() | st.text(max_size=12)
    json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
    plausible = {
        "prompt": st.text(max_size=20) | st.lists(st.integers(-2, 60), max_size=4),
        "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "wizard"]), "content": st.text(max_size=12)}), max_size=2),
        "max_tokens": st.integers(-1, 20), "n": st.integers(-1, 3), "alpha": st.floats(), "temperature": st.floats(),
        "mh_steps": st.integers(-1, 6), "block_size": st.integers(-1, 9), "prefetch_budget": st.integers(-1, 5),
    }  # fmt: skip
    field_value = st.sampled_from(FIELDS).flatmap(lambda name: st.tuples(st.just(name), plausible.get(name, json_values) | json_values))
    # a valid request with a few fields changed (most of them stay cheap to run), or anything at all
    valid = st.fixed_dictionaries({"prompt": st.text("abcdefgh ", min_size=1, max_size=12), "max_tokens": st.sampled_from([4, 8])})
    changed = st.tuples(valid, st.lists(field_value, max_size=2).map(dict)).map(lambda pair: {**pair[0], **pair[1]})
    return changed | st.lists(field_value, max_size=6).map(dict) | json_values


def test_fuzzed_bodies_never_get_a_5xx(serve_base_url):
    """Hypothesis against the request schema, over real HTTP (bounded: 60 bodies, cheap limits)."""
    from hypothesis import HealthCheck, given, settings
    from ray import serve

    from deployments.serve_app import app_for

    serve.run(app_for(JobConfig.model_validate(FUZZ)), name="fuzz", route_prefix="/fuzz")
    statuses = []

    @settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(body=_fuzz_bodies(), chat=st.booleans())
    def post(body, chat):
        path = "/v1/chat/completions" if chat else "/v1/completions"
        raw = json.dumps(body, allow_nan=True).encode()
        r = httpx.post(f"{serve_base_url}/fuzz{path}", content=raw, headers={"content-type": "application/json"}, timeout=60)
        statuses.append(r.status_code)
        assert r.status_code < 500, (body, r.text)
        assert r.headers["content-type"].startswith(("application/json", "text/event-stream")), r.text

    try:
        post()
    finally:
        serve.delete("fuzz")
    assert 200 in statuses and 400 in statuses


# --- OpenAI conformance (issue 12): usage, stream_options, logprobs, the schema, disconnects ---
def toy_log_p0(config: JobConfig, prompt_ids, token_ids) -> list[float]:
    """log p0 of each token given the prompt and the tokens before it, straight from the toy
    model's next-token distribution (not from the chain that sampled them)."""
    engine = config.engine.build()
    return [float(engine.next_token_logprobs(list(prompt_ids) + list(token_ids[:i]))[t]) for i, t in enumerate(token_ids)]


def in_process_tokens(config: JobConfig, prompt_ids, seed: int, n: int, **fields) -> list[tuple[int, ...]]:
    engine = config.engine.build()
    base = config.sampler.model_dump()
    configs = [SamplerConfig.model_validate({**base, **fields, "seed": derive_seed(seed, i)}) for i in range(n)]
    return [sample(engine, prompt_ids, c).token_ids for c in configs]


POWER_SAMPLING_USAGE = {"rounds", "stream_batches", "requests", "generated_tokens", "prefill_tokens", "cached_prefill_tokens",
                        "transitions", "accepted", "aborted_requests", "early_stopped_requests", "early_stop_tokens_left"}  # fmt: skip


def check_usage(usage, prompt_tokens: int, returned: list[int]) -> dict:
    assert (usage.prompt_tokens, usage.completion_tokens) == (prompt_tokens, sum(returned))
    assert usage.total_tokens == prompt_tokens + sum(returned)
    cost = usage.model_extra["power_sampling"]
    assert set(cost) == POWER_SAMPLING_USAGE
    # every proposal counts, rejected and speculative ones too: far more than what is returned
    assert cost["generated_tokens"] > usage.completion_tokens and cost["requests"] > len(returned)
    assert 0 < cost["rounds"] + cost["stream_batches"] <= cost["requests"] and cost["transitions"] > 0
    return cost


def test_usage_and_logprobs_through_the_openai_client(toy_service):
    url, config = toy_service
    c = client(url)
    args = {"model": "toy", "prompt": "Tell me", "max_tokens": 16, "n": 2, "seed": 11, "extra_body": {"block_size": 8}}
    whole = c.completions.create(logprobs=0, **args)
    prompt_ids = config.engine.build().tokenizer.encode_raw("Tell me")
    tokens = in_process_tokens(config, prompt_ids, 11, 2, num_blocks=2)
    cost = check_usage(whole.usage, len(prompt_ids), [len(t) for t in tokens])
    for choice, token_ids in zip(whole.choices, tokens):
        lp = choice.logprobs
        assert lp.token_logprobs == pytest.approx(toy_log_p0(config, prompt_ids, token_ids), abs=1e-9)
        assert len(set(lp.token_logprobs)) > 1 and max(lp.token_logprobs) < 0
        assert "".join(lp.tokens) == choice.text and lp.text_offset[0] == 0
    assert c.completions.create(**args).choices[0].logprobs is None  # not asked: none

    # streamed, with include_usage: the same texts and log-probabilities, usage only in a last chunk
    chunks = list(c.completions.create(stream=True, logprobs=0, stream_options={"include_usage": True}, **args))
    *events, last = chunks
    assert last.choices == [] and all(chunk.usage is None for chunk in events)
    streamed = check_usage(last.usage, len(prompt_ids), [len(t) for t in tokens])
    for key in ("requests", "generated_tokens", "transitions", "accepted"):  # the chains' own counts: seeded
        assert streamed[key] == cost[key], key
    done = {ch.choices[0].index: ch.choices[0] for ch in events if ch.choices[0].finish_reason}
    assert [done[i].logprobs.token_logprobs for i in (0, 1)] == [ch.logprobs.token_logprobs for ch in whole.choices]
    # without include_usage no chunk says anything about usage (raw bytes: the client fills in None)
    raw = httpx.post(f"{url}/v1/completions", json={**GOOD, "stream": True}, timeout=60).text
    assert raw.rstrip().endswith("data: [DONE]") and '"usage"' not in raw


def test_chat_logprobs_and_include_usage_through_the_openai_client(toy_service):
    url, config = toy_service
    c = client(url)
    messages = [{"role": "user", "content": "Name a colour."}]
    args = {"model": "toy", "messages": messages, "max_tokens": 8, "seed": 4, "logprobs": True, "top_logprobs": 0}
    whole = c.chat.completions.create(**args)
    prompt_ids = config.engine.build().tokenizer.apply_chat_template(messages)
    (token_ids,) = in_process_tokens(config, prompt_ids, 4, 1)
    content = whole.choices[0].logprobs.content
    assert [t.logprob for t in content] == pytest.approx(toy_log_p0(config, prompt_ids, token_ids), abs=1e-9)
    assert all(t.top_logprobs == [] for t in content)
    check_usage(whole.usage, len(prompt_ids), [len(token_ids)])
    chunks = list(c.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    (done,) = [ch.choices[0] for ch in chunks[:-1] if ch.choices[0].finish_reason]
    assert [t.logprob for t in done.logprobs.content] == [t.logprob for t in content]
    for bad, param in [({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": 0}, "logprobs")]:
        with pytest.raises(openai.BadRequestError) as caught:
            c.chat.completions.create(**{**args, **bad})
        assert caught.value.body["param"] == param
    with pytest.raises(openai.BadRequestError) as caught:
        c.completions.create(**GOOD, logprobs=1)
    assert caught.value.body["param"] == "logprobs"


def test_the_openapi_schema_lists_the_power_sampling_fields_with_their_limits(toy_service):
    url, _ = toy_service
    schema = httpx.get(f"{url}/openapi.json", timeout=60).json()
    for path, prompt in (("/v1/completions", "prompt"), ("/v1/chat/completions", "messages")):
        operation = schema["paths"][path]["post"]
        body = operation["requestBody"]["content"]["application/json"]["schema"]
        fields = body["properties"]
        limits = {name: next(a for a in fields[name]["anyOf"] if a.get("type") != "null") for name in ("alpha", "mh_steps", "prefetch_budget", "block_size")}
        assert (limits["alpha"]["minimum"], limits["alpha"]["maximum"]) == (1.0, 1000.0)
        assert (limits["prefetch_budget"]["minimum"], limits["prefetch_budget"]["maximum"]) == (1, 4096)
        assert limits["mh_steps"]["minimum"] == 0 and limits["block_size"]["minimum"] == 1
        assert {"traversal", "sampler", "n", "seed", "stream_options", "logprobs", prompt} <= set(fields)
        assert prompt in body["required"] and "400" in operation["responses"]
        response = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].split("/")[-1]
        assert "usage" in schema["components"]["schemas"][response]["properties"]
    docs = httpx.get(f"{url}/docs", timeout=60)
    assert docs.status_code == 200 and "openapi.json" in docs.text


def service_stats(url: str) -> dict:
    return httpx.get(f"{url}/v1/stats", timeout=10).json()


def wait_for_idle(url: str, chains_finished: int, timeout: float = 30.0) -> dict:
    """The coordinator's stats once every chain is over and nothing is queued, in flight or running."""
    last: dict = {}

    def idle() -> dict | None:
        last.update(stats := service_stats(url))
        quiet = stats["chains_active"] == 0 and stats["queue_depth"] == 0 and stats["streams_running"] == 0
        return stats if quiet and not any(stats["inflight_calls_per_replica"]) and stats["chains_finished"] >= chains_finished else None

    try:
        return wait_for(idle, timeout, f"no chain active, nothing queued or running, {chains_finished} chains finished")
    except AssertionError as e:
        raise AssertionError(f"{e}: {last}") from None


def wait_for_disconnects(url: str, disconnects: int, timeout: float = 30.0) -> dict:
    """The stats once the pool has counted `disconnects` clients that left: an ingress counts a
    disconnect once the request's chain tasks are over, so nothing of that request is submitted after."""
    return wait_for(lambda: (s := service_stats(url))["client_disconnects"] >= disconnects and s, timeout, f"{disconnects} disconnects counted")


# long enough that no chain can end before its client leaves: each chain runs at least one block of
# 1,000 MH steps (about 40 s on the toy here), each step consuming at least one proposal, so whole
# runs ask for at least this many requests
LONG = {"model": "toy", "prompt": "a long one", "max_tokens": 128, "n": 2, "seed": 2, "block_size": 8, "mh_steps": 1000}
LONG_RUN_REQUESTS = 2 * 1000


def check_a_disconnect_stops_its_chains(url: str) -> None:
    before = service_stats(url)
    with httpx.stream("POST", f"{url}/v1/completions", json={**LONG, "stream": True}, timeout=60) as response:
        lines = response.iter_lines()
        assert '"progress"' in next(line for line in lines if line.startswith("data:"))
    # the stream is closed after one progress event: both chains stop, their engine work with them
    first = wait_for_idle(url, before["chains_finished"] + 2)
    assert 0 < first["submitted_requests"] - before["submitted_requests"] < LONG_RUN_REQUESTS  # stopped early
    # and stay stopped: once their tasks are over (the ingress counts the disconnect then), nothing
    # more was submitted or called since they went idle
    later = wait_for_disconnects(url, before["client_disconnects"] + 1)
    assert later["submitted_requests"] == first["submitted_requests"] and later["calls"] == first["calls"]
    # a client that gives up on a whole (non-streamed) answer: the same
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/completions", json=LONG, timeout=httpx.Timeout(60, read=1.0))
    second = wait_for_idle(url, first["chains_finished"] + 2)
    assert 0 < second["submitted_requests"] - first["submitted_requests"] < LONG_RUN_REQUESTS
    later = wait_for_disconnects(url, later["client_disconnects"] + 1)
    assert later["submitted_requests"] == second["submitted_requests"] and later["calls"] == second["calls"]


def test_a_client_that_disconnects_stops_its_chains_and_engine_work(toy_service):
    url, _ = toy_service
    check_a_disconnect_stops_its_chains(url)


def test_the_load_test_script_on_the_toy_service(toy_service):
    """bench/load_test.py's rounds, small (4 clients, 2 s, two passes): the checks it makes hold
    on a real service, the memory one included (each fails where it should:
    tests/test_load_test_verdicts.py)."""
    from bench.load_test import memory_verdict, run_rounds, verdict
    from bench.service_watch import service_rss_mb

    url, _ = toy_service
    rows = run_rounds(url, [4], 2.0, passes=2, progress=lambda _: None)
    assert [row["pass"] for row in rows] == [1, 2]
    for row in rows:
        assert row["answered"] > 0 and row["left"] > 0, row  # the mix includes clients that leave
        assert row["errors"] == 0 and row["lost_or_duplicated"] == 0, row["error_samples"]
        assert row["chains_finished"] >= row["answered"]
        # a client that left ended its chains at once (cancelled calls), not by the silence timeout
        assert row["went_idle"] and row["chains_expired"] == 0 and row["idle_after_s"] < 20, row
        assert {"ingress", "Coordinator", "EngineReplica"} <= set(row["rss_mb_by_process"]) == set(service_rss_mb())
        assert row["service_rss_mb"] > 0, row
        assert sum(mb for _, mb in row["processes"].values()) == pytest.approx(row["service_rss_mb"], abs=64)
    # the second pass (same load, the first pass's warm-up behind it) ends within the allowed
    # growth of the first: the RSS of the same processes (all alive before the first pass),
    # measured after each pass, none started in between
    checks = verdict(rows)
    assert checks["no_errors"] and checks["nothing_lost_or_duplicated"] and checks["work_cancelled"], checks
    memory = checks["memory"]
    assert memory["flat"] and memory["growth_mb"] <= memory["allowed_growth_mb"] and not memory["started"], memory
    # and the verdict is a comparison that fails on a leak: the same passes, one process of the
    # second ending just past the allowance, are not flat
    pid, (kind, mb) = next(iter(rows[0]["processes"].items()))
    leaked = {**rows[0]["processes"], pid: [kind, mb + memory["allowed_growth_mb"] + 1]}
    assert not memory_verdict([rows[0], {**rows[0], "pass": 2, "processes": leaked}])["flat"]


# --- attacker probe (issue "Nothing lost, nothing twice, no traceback"): over the real proxy ----
def openai_error(response, status: int) -> dict:
    """The answer is `status` with OpenAI's error body (never Starlette's {"detail": ...})."""
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error"} and body["error"]["message"] and body["error"]["type"], body
    return body["error"]


def test_bodies_the_docs_refuse_are_refused_over_http(toy_service):
    url, _ = toy_service
    headers = {"content-type": "application/json"}
    post = lambda path, raw, h=headers: httpx.post(f"{url}{path}", content=raw, headers=h, timeout=60)  # noqa: E731
    for key in ("contnet", "name", "tool_calls"):
        chat = json.dumps({"messages": [{"role": "user", "content": "hi", key: "x"}], "max_tokens": 8}).encode()
        assert f"messages.0.{key}" in openai_error(post("/v1/chat/completions", chat), 400)["message"]
    error = openai_error(post("/v1/completions", b'{"prompt":"hi","max_tokens":-5,"max_tokens":8}'), 400)
    assert "more than once" in error["message"]
    utf16 = json.dumps(GOOD).encode("utf-16")
    assert "UTF-8" in openai_error(post("/v1/completions", utf16), 400)["message"]
    latin = {"content-type": "application/json; charset=latin-1"}
    assert "UTF-8" in openai_error(post("/v1/completions", json.dumps(GOOD).encode(), latin), 415)["message"]
    error = openai_error(httpx.post(f"{url}/v1/completions", json={**GOOD, "mh_steps": 10**6}, timeout=60), 400)
    assert "at most 1000" in error["message"] and "serve.max_mh_steps" in error["message"]
    assert httpx.post(f"{url}/v1/completions", json=GOOD, timeout=60).status_code == 200  # and the service serves on


def test_header_bounds_and_a_second_authorization(toy_service, serve_base_url):
    url, _ = toy_service
    assert "limit" in openai_error(httpx.get(f"{url}/v1/models", headers={"x-big": "a" * 1_000_000}, timeout=60), 431)["message"]
    many = [(f"x-h{i}", "v") for i in range(2000)]
    assert "headers" in openai_error(httpx.get(f"{url}/v1/models", headers=many, timeout=60), 431)["message"]
    secured = f"{serve_base_url}/secured"
    for pair in ([f"Bearer {KEY}", "Bearer wrong"], ["Bearer wrong", f"Bearer {KEY}"]):
        r = httpx.get(f"{secured}/v1/models", headers=[("authorization", v) for v in pair], timeout=60)
        assert "authorization" in openai_error(r, 400)["message"]
    assert httpx.get(f"{secured}/v1/models", headers={"authorization": f"Bearer {KEY}"}, timeout=60).status_code == 200


def test_routing_errors_have_the_openai_shape_and_no_redirect(toy_service):
    url, _ = toy_service
    assert openai_error(httpx.get(f"{url}/v1/nothing-here", timeout=60), 404)["type"] == "not_found_error"
    r = httpx.get(f"{url}/v1/completions", timeout=60)
    openai_error(r, 405)
    assert r.headers["allow"] == "POST"
    r = httpx.post(f"{url}/v1/completions/", json=GOOD, headers={"host": "evil.example"}, timeout=60, follow_redirects=False)
    openai_error(r, 404)
    assert "location" not in r.headers


def test_only_safe_client_request_ids_are_echoed(toy_service):
    import re

    url, _ = toy_service
    r = httpx.get(f"{url}/health", headers={"x-request-id": "client-id_1.2"}, timeout=60)
    assert r.headers["x-request-id"] == "client-id_1.2"
    for unsafe in ("<script>alert(1)</script>", "a" * 65, "has space", "{\"json\":1}"):
        r = httpx.get(f"{url}/health", headers={"x-request-id": unsafe}, timeout=60)
        assert r.status_code == 200 and r.headers["x-request-id"] != unsafe, unsafe
        assert re.fullmatch(r"[A-Za-z0-9._-]{1,64}", r.headers["x-request-id"]), r.headers["x-request-id"]


def test_stalled_bodies_get_a_408_and_do_not_keep_good_requests_out(toy_service):
    """N connections send their headers (Content-Length: 100) and no body: a good request is
    answered at once meanwhile, and each stalled one gets 408 and is closed within the bound."""
    from urllib.parse import urlparse

    url, _ = toy_service
    head = (
        f"POST {urlparse(url).path}/v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 100\r\n\r\n"
    ).encode()
    _stalled_get_408s_while_a_good_request_is_answered(url, [head] * 32, READ_TIMEOUT_S, slack_s=10, settle_s=0.5)


def _stalled_get_408s_while_a_good_request_is_answered(
    url: str, heads: list[bytes], bound_s: float, slack_s: float, settle_s: float = 0.0
) -> None:
    """One raw connection per head, each sending it and stalling; for `settle_s` none of them is
    answered or closed, then a good request is answered within `bound_s`, and every stalled one
    gets a 408 `timeout_error` and is closed within `bound_s + slack_s` (one bound for all)."""
    import time
    from urllib.parse import urlparse

    parsed = urlparse(url)
    stalled = [raw_request(parsed.hostname, parsed.port, head, 30) for head in heads]
    started = time.monotonic()
    try:
        if settle_s:
            assert read_until_closed(stalled[0], started + settle_s) == b""
            assert all(silent(s) for s in stalled), "a stalled connection was answered before its bound"
        good = httpx.post(f"{url}/v1/completions", json=GOOD, timeout=60)
        assert good.status_code == 200 and time.monotonic() - started < bound_s, time.monotonic() - started
        answers = [read_until_closed(s, started + bound_s + slack_s) for s in stalled]
        took = time.monotonic() - started
    finally:
        for s in stalled:
            s.close()
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 408") and b'"timeout_error"' in answer and answer.endswith(b"<closed>"), answer[:300]
    assert took < bound_s + slack_s, took


def _ingress_logs(app: str) -> dict[str, str]:
    """The stderr and stdout of `app`'s ingress replicas (Ray's worker logs, where the replica's
    presto_ray.serve log goes), by file."""
    import glob

    from ray._private import worker
    from ray._private.state import actors

    logs_dir = worker._global_node.get_logs_dir_path()  # this session's (session_latest may be another Ray's)

    pids = [a["Pid"] for a in actors().values() if a["State"] == "ALIVE" and a["ActorClassName"] == f"ServeReplica:{app}:PrestoIngress"]
    logs = {}
    paths = glob.glob(f"{logs_dir}/serve/replica_{app}_PrestoIngress_*.log")
    for pid in pids:
        paths += glob.glob(f"{logs_dir}/worker-*-{pid}.*")
    for path in paths:
        with open(path, errors="replace") as f:
            logs[path] = f.read()
    return logs


def test_a_client_that_disconnects_is_logged_and_counted_without_a_traceback(toy_service):
    url, _ = toy_service
    before_logs, before = _ingress_logs("toy"), service_stats(url)
    check_a_disconnect_stops_its_chains(url)  # a stream closed, then a whole answer given up on

    def new_logs() -> str:
        return "".join(text[len(before_logs.get(path, "")):] for path, text in _ingress_logs("toy").items())

    new = wait_for(lambda: (text := new_logs()).count("client disconnected") >= 2 and text, 30, "two disconnect lines in the ingress logs")
    assert "Traceback" not in new and "err-" not in new, new[-3000:]
    after = service_stats(url)
    assert after["client_disconnects"] - before["client_disconnects"] >= 2, (before["client_disconnects"], after["client_disconnects"])


# --- stalled headers: the proxy's uvicorn bounds the time to send them ---------------------------
HEADER_TIMEOUT_S = float(os.environ["PRESTO_RAY_HEADER_TIMEOUT_S"])


def test_stalled_headers_are_closed_by_the_proxy_and_do_not_keep_good_requests_out(toy_service):
    """Over Serve's proxy (its uvicorn bounded by the proxy callback, deployments/proxy_callback.py;
    in process, on both of uvicorn's parsers: tests/test_header_timeout.py): N
    connections that send part of their headers and stall, and N that send nothing; a good
    request is answered at once meanwhile, and each stalled one gets 408 and is closed within
    the bound (PRESTO_RAY_HEADER_TIMEOUT_S, set for the session's Ray above)."""
    url, _ = toy_service
    _stalled_get_408s_while_a_good_request_is_answered(url, [PARTIAL_HEAD] * 32 + [b""] * 32, HEADER_TIMEOUT_S, slack_s=5)


# --- a client that leaves while a chain's chain_finished is in flight ----------------------------
IN_FLIGHT_S = 5.0


@ray.remote(num_cpus=0)
class _Heard:
    """Stands in for the coordinator: what it was told, each call in flight for a while."""

    def __init__(self) -> None:
        self.heard: list[str] = []

    async def chain_finished(self, chain_id: str) -> None:
        import asyncio

        # the client leaves meanwhile (after 0.3 s); long enough for its request's cancellation to
        # reach this call on a loaded machine (1 s was not, at a load average of 12-25 on 2 cores)
        await asyncio.sleep(IN_FLIGHT_S)
        self.heard.append(chain_id)

    async def said_once_told(self, chain_id: str, timeout_s: float) -> list[str]:
        """What it was told, once it was told `chain_id` (or `timeout_s` passed): one call that
        waits here, rather than calls polling the actor while a cancellation is on its way to it."""
        import asyncio

        waited = 0.0
        while chain_id not in self.heard and waited < timeout_s:
            await asyncio.sleep(0.05)
            waited += 0.05
        return self.heard


def test_calls_outside_the_request_outlive_its_cancellation(serve_base_url):
    """Why the ingress says chain_finished again after a disconnect: Ray cancels the calls of a
    Serve request cancelled by its client's leaving, so a chain_finished in flight then never
    reaches the coordinator (the chain expired, the flake of the load test); the same call made
    in `outside_the_request`'s context does."""
    import asyncio

    from fastapi import FastAPI
    from ray import serve

    from deployments.client_disconnects import outside_the_request

    app = FastAPI()

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    @serve.ingress(app)
    class Leaves:
        def __init__(self, heard) -> None:
            self.heard = heard

        @app.post("/")
        async def finish(self, chain_id: str) -> str:
            if chain_id.startswith("outside"):
                task = asyncio.get_running_loop().create_task(self._say(chain_id), context=outside_the_request())
                await asyncio.shield(task)
            else:
                await self._say(chain_id)
            return "said"

        async def _say(self, chain_id: str) -> None:
            await self.heard.chain_finished.remote(chain_id)

    heard = _Heard.remote()
    serve.run(Leaves.bind(heard), name="leaves", route_prefix="/leaves")
    try:
        for chain_id in ("inside", "outside"):
            with pytest.raises(httpx.ReadTimeout):  # the client leaves with the call in flight
                httpx.post(f"{serve_base_url}/leaves/", params={"chain_id": chain_id}, timeout=httpx.Timeout(30, read=0.3))
        # "inside" was sent first: had its call survived, it would have been heard before "outside"
        assert ray.get(heard.said_once_told.remote("outside", 30.0)) == ["outside"]
    finally:
        serve.delete("leaves")


# --- issue 34: what the parser refuses, codings, long integers, the token bound, disconnects ------
def _raw_answer(url: str, head: bytes, timeout_s: float = 10.0) -> bytes:
    import time
    from urllib.parse import urlparse

    parsed = urlparse(url)
    s = raw_request(parsed.hostname, parsed.port, head, timeout_s)
    try:
        return read_until_closed(s, time.monotonic() + timeout_s)
    finally:
        s.close()


def _openai_error_answer(answer: bytes, status: int) -> dict:
    head, _, body = answer.removesuffix(b"<closed>").partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), answer[:300]
    if b"transfer-encoding: chunked" in head.lower():
        size, _, rest = body.partition(b"\r\n")
        body = rest[: int(size, 16)]
    parsed = json.loads(body)
    assert set(parsed) == {"error"} and parsed["error"]["message"] and parsed["error"]["type"], parsed
    return parsed["error"]


def test_requests_the_proxys_parser_refuses_get_the_openai_error_shape(toy_service, serve_base_url):
    """Over Serve's proxy (its uvicorn's protocol set by the proxy callback): these got a
    plain-text 400 "Invalid HTTP request received." (in process, on both parsers:
    tests/test_header_timeout.py); and Serve's proxy's own answer to a path no application
    serves was plain text too (deployments/proxy_errors.py)."""
    url, _ = toy_service
    r = httpx.get(f"{serve_base_url}/no-application-here", timeout=60)
    assert openai_error(r, 404)["type"] == "not_found_error" and r.headers["content-type"] == "application/json"
    post = b"POST /toy/v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    for head, status in [
        (post + b"Content-Length: abc\r\n\r\n{}", 400),
        (post + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 400),
        (post + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", 400),
        (b"GET /toy/v1/models HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", 400),
        (b"FOO /toy/v1/models HTTP/1.1\r\nHost: x\r\n\r\n", 501),
        (b"GET /toy/v1/models?" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    ]:
        answer = _raw_answer(url, head)
        assert answer.endswith(b"<closed>"), answer[:300]
        error = _openai_error_answer(answer, status)
        assert "Invalid HTTP request received" not in error["message"], error
    # a transfer coding llhttp passes on undecoded reaches the ingress, which refuses it
    answer = _raw_answer(url, post + b"Transfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
    assert "Transfer-Encoding gzip" in _openai_error_answer(answer, 501)["message"]
    assert httpx.post(f"{url}/v1/completions", json=GOOD, timeout=60).status_code == 200


def test_codings_long_integers_and_the_token_bound_over_http(toy_service):
    import gzip
    import time

    url, config = toy_service
    plain = json.dumps(GOOD).encode()
    for body in (plain, gzip.compress(plain)):  # a plain body labelled gzip was sampled; a gzip one was a 400 about UTF-8
        r = httpx.post(f"{url}/v1/completions", content=body, headers={"content-type": "application/json", "content-encoding": "gzip"}, timeout=60)
        assert "Content-Encoding gzip" in openai_error(r, 415)["message"] and r.headers["accept-encoding"] == "identity"
    for field in ("max_tokens", "seed"):  # a 500 (json.loads' ValueError past Python's int-string limit)
        raw = json.dumps({k: v for k, v in GOOD.items() if k != field})[:-1] + f', "{field}": {"9" * 5000}}}'
        r = httpx.post(f"{url}/v1/completions", content=raw.encode(), headers={"content-type": "application/json"}, timeout=60)
        error = openai_error(r, 400)
        assert error["param"] == field and "5,000 digits" in error["message"], error
    # n 16 x 1,000 steps x 2,048 tokens: within every per-field limit, refused at once by its bound
    started = time.monotonic()
    with pytest.raises(openai.BadRequestError) as caught:
        client(url).completions.create(model="toy", prompt="hi", n=16, max_tokens=2048, extra_body={"mh_steps": 1000})
    assert time.monotonic() - started < 30 and caught.value.body["param"] == "mh_steps"
    assert "serve.max_request_tokens" in caught.value.body["message"] and "100,000,000" in caught.value.body["message"]
    # chat's max_completion_tokens is its horizon, as max_tokens is
    messages = [{"role": "user", "content": "Name a colour."}]
    c = client(url)
    named = c.chat.completions.create(model="toy", messages=messages, max_completion_tokens=8, seed=9)
    assert named.choices[0].message.content == c.chat.completions.create(model="toy", messages=messages, max_tokens=8, seed=9).choices[0].message.content
    with pytest.raises(openai.BadRequestError) as caught:
        c.chat.completions.create(model="toy", messages=messages, max_completion_tokens=8, max_tokens=16)
    assert caught.value.body["param"] == "max_completion_tokens"


def _session_worker_logs() -> dict[str, str]:
    """Every worker's and Serve replica's log of this Ray session (the coordinator, the engine
    replicas, the ingress and pool replicas, ...), by file."""
    import glob

    from ray._private import worker

    logs_dir = worker._global_node.get_logs_dir_path()
    logs = {}
    for path in glob.glob(f"{logs_dir}/worker-*") + glob.glob(f"{logs_dir}/serve/*.log"):
        with open(path, errors="replace") as f:
            logs[path] = f.read()
    return logs


def test_disconnects_under_streaming_log_no_task_exception_anywhere(serve_base_url):
    """Clients that leave mid-request on a streaming service: the coordinator logged "Task
    exception was never retrieved / TaskCancelledError" (its fire-and-forget aborts, wakes and
    bounds were cancelled with the chain call that sent them: 16 for 32 disconnects). No
    process of the session logs a traceback for them now."""
    from ray import serve

    from deployments.serve_app import app_for

    config = JobConfig.model_validate({**TOY, "sampler": {**TOY["sampler"], "schedule": "streaming", "prefetch_budget": 16}})
    serve.run(app_for(config), name="leaving", route_prefix="/leaving")
    url = f"{serve_base_url}/leaving"
    try:
        assert httpx.post(f"{url}/v1/completions", json=GOOD, timeout=120).status_code == 200
        before_logs, before = _session_worker_logs(), service_stats(url)
        leaving = 8
        for i in range(leaving):
            body = {**LONG, "seed": 100 + i}
            if i % 2 == 0:
                with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=60) as response:
                    next(line for line in response.iter_lines() if line.startswith("data:"))
            else:
                with pytest.raises(httpx.ReadTimeout):
                    httpx.post(f"{url}/v1/completions", json=body, timeout=httpx.Timeout(60, read=1.0))
        wait_for_disconnects(url, before["client_disconnects"] + leaving, timeout=60)
        wait_for_idle(url, before["chains_finished"] + 2 * leaving, timeout=60)

        def new_logs() -> str:
            return "".join(text[len(before_logs.get(path, "")):] for path, text in _session_worker_logs().items())

        new = wait_for(lambda: (text := new_logs()).count("client disconnected") >= leaving and text, 30, "the disconnect lines")
        for word in ("Task exception was never retrieved", "TaskCancelledError", "Traceback"):
            assert word not in new, new[max(0, new.find(word) - 1500):][:4000]
        assert service_stats(url)["chains_expired"] == before["chains_expired"]
    finally:
        serve.delete("leaving")

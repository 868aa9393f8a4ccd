"""The OpenAI-compatible Serve application on a real local Ray cluster, called over real HTTP with
the real `openai` client (and raw HTTP for bad input): samples equal the in-process sampler's."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from presto_ray.config import SamplerConfig
from presto_ray.driver import sample
from presto_ray.job import JobConfig
from presto_ray.keys import derive_seed

ray = pytest.importorskip("ray")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

TOY = {
    "engine": {"kind": "toy", "vocab_size": 48, "logit_scale": 3.0, "eos_bias": -2.0, "max_model_len": 512},
    "sampler": {"block_size": 8, "mh_steps": 4, "prefetch_budget": 4, "seed": 0, "schedule": "rounds"},
    "serve": {},
}
KEY = "test-secret"


@pytest.fixture(scope="module")
def toy_service(serve_base_url):
    from ray import serve

    from deployments.serve_app import app_for

    config = JobConfig.model_validate(TOY)
    secured = JobConfig.model_validate({**TOY, "serve": {**TOY["serve"], "api_key": KEY}})
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
        assert 0 < stats["model_calls"] <= stats["transitions"] + 2
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
    url, config = toy_service
    before = httpx.get(f"{url}/v1/stats").json()
    c = client(url)

    def ask(seed: int):
        return c.completions.create(model="toy", prompt=f"question {seed % 4}", max_tokens=16, seed=seed, extra_body={"block_size": 8})

    with ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(ask, range(16)))
    after = httpx.get(f"{url}/v1/stats").json()
    assert len({r.id for r in responses}) == 16
    tokenizer = config.engine.build().tokenizer
    for seed, response in enumerate(responses):
        (choice,) = response.choices
        assert choice.text == expected_texts(config, tokenizer.encode_raw(f"question {seed % 4}"), seed, 1, num_blocks=2)[0]
    chain_rounds = sum(r.choices[0].model_extra["power_sampling"]["model_calls"] for r in responses)
    calls = after["calls"] - before["calls"]
    assert calls < 0.5 * chain_rounds, (calls, chain_rounds)


def test_presto_ray_serve_command_serves_until_interrupted(tmp_path):
    """`presto-ray serve` on its own local Ray: it answers, then Ctrl-C stops it cleanly."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    import yaml

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "toy.yaml"
    config.write_text(yaml.safe_dump(TOY))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    command = [sys.executable, "-m", "presto_ray.cli", "serve", "--config", str(config), "--port", str(port)]
    server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert server.poll() is None, server.stdout.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        response = client(f"http://127.0.0.1:{port}").completions.create(**GOOD)
        assert response.choices[0].text
    finally:
        server.send_signal(signal.SIGINT)
        output, _ = server.communicate(timeout=120)
    assert f"serving toy at http://127.0.0.1:{port}/v1" in output
    assert server.returncode == 0, output

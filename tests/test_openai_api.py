"""The HTTP contract as pure functions (no Ray, no HTTP): every bad input gets its status and a
message naming the field; good requests become the chains the in-process sampler would run; the
bodies built from their results are what the `openai` package's own types accept."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from presto_ray.config import SamplerConfig
from presto_ray.engines import ToyEngineSpec
from presto_ray.keys import derive_seed
from presto_ray.openai_api import (
    ApiError,
    Prepared,
    choice_from_result,
    completion_response,
    done_chunk,
    error_event,
    models_body,
    prepare,
    progress_chunk,
    stats_body,
)
from presto_ray.results import SampleResult, SampleStats
from presto_ray.serve_config import ServeSettings

openai = pytest.importorskip("openai")

TOKENIZER = ToyEngineSpec(vocab_size=48, max_model_len=512).build_tokenizer()
BASE = SamplerConfig(block_size=8, mh_steps=4, prefetch_budget=4, seed=0)
SETTINGS = ServeSettings()
GOOD = {"model": "toy", "prompt": "hello", "max_tokens": 8, "seed": 1}
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]


def prepare_body(body, chat: bool = False) -> Prepared:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return prepare(
        raw, chat, tokenizer=TOKENIZER, model_name="toy", context_length=512, base_sampler=BASE, settings=SETTINGS
    )


def api_error(body, chat: bool = False) -> ApiError:
    with pytest.raises(ApiError) as caught:
        prepare_body(body, chat)
    return caught.value


# --- bad input -------------------------------------------------------------------------------
BAD_INPUTS = [
    ({"alpha": 0.5}, 400, "alpha"),
    ({"prefetch_budget": 0}, 400, "prefetch_budget"),
    ({"prefetch_budget": 100_000}, 400, "prefetch_budget"),
    ({"mh_steps": 1_000_000}, 400, "mh_steps"),
    ({"traversal": "sideways"}, 400, "traversal"),
    ({"sampler": "gibbs"}, 400, "sampler"),
    ({"n": "two"}, 400, "n"),
    ({"n": 0}, 400, "n"),
    ({"n": 1000}, 400, "n"),
    ({"max_tokens": "8"}, 400, "max_tokens"),
    ({"max_tokens": 0}, 400, "max_tokens"),
    ({"max_tokens": 10**9}, 400, "max_tokens"),
    ({"block_size": 3}, 400, "block_size"),
    ({"alpha": "high"}, 400, "alpha"),
    ({"seed": -1}, 400, "seed"),
    ({"stream": "yes"}, 400, "stream"),
    ({"temperature": 0}, 400, "temperature"),
    ({"temperature": 1.5}, 400, "temperature"),
    ({"temperature": 0.5, "alpha": 3.0}, 400, "temperature"),
    ({"top_p": 0.5}, 400, "top_p"),
    ({"logprobs": 2}, 400, "logprobs"),
    ({"stop": ["\n"]}, 400, "stop"),
    ({"prompt": ""}, 400, "prompt"),
    ({"prompt": []}, 400, "prompt"),
    ({"prompt": ["a", "b"]}, 400, "prompt"),
    ({"prompt": [1, -2]}, 400, "prompt"),
    ({"prompt": [1, 48]}, 400, "prompt"),  # past the vocabulary
    ({"prompt": 12}, 400, "prompt"),
    ({"prompt": "x" * 600}, 400, "prompt"),  # over the 512-token context
    ({"model": "gpt-4"}, 404, "model"),
]


@pytest.mark.parametrize("change,status,param", BAD_INPUTS, ids=[f"{p}-{i}" for i, (_, _, p) in enumerate(BAD_INPUTS)])
def test_bad_completion_fields_get_a_4xx_naming_the_field(change, status, param):
    error = api_error({**GOOD, **change})
    assert (error.status, error.param) == (status, param)
    body = error.body()["error"]
    assert body["param"] == param and param in body["message"] and body["type"]


def test_unknown_model_is_not_found():
    assert api_error({**GOOD, "model": "gpt-4"}).body()["error"]["type"] == "not_found_error"


@pytest.mark.parametrize(
    "raw,status,words",
    [
        (b'{"prompt": "hi", ', 400, "malformed JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (json.dumps({**GOOD, "prompt": "y" * 2_000_000}).encode(), 413, "limit"),
    ],
    ids=["malformed", "not-an-object", "too-large"],
)
def test_bad_bodies(raw, status, words):
    error = api_error(raw)
    assert error.status == status and words in error.message


def test_a_missing_prompt_is_named():
    error = api_error({"model": "toy", "max_tokens": 8})
    assert (error.status, error.param) == (400, "prompt")


@pytest.mark.parametrize(
    "messages,where",
    [([], "messages"), ([{"role": "robot", "content": "hi"}], "messages.0.role"), ("hi", "messages")],
    ids=["empty", "bad-role", "not-a-list"],
)
def test_bad_chat_messages(messages, where):
    error = api_error({"model": "toy", "messages": messages}, chat=True)
    assert (error.status, error.param) == (400, "messages") and error.message.startswith(where)


# --- good requests ---------------------------------------------------------------------------
def test_a_text_prompt_is_encoded_as_it_is():
    prepared = prepare_body(GOOD)
    assert prepared.prompt_ids == TOKENIZER.encode_raw("hello")
    assert prepare_body({**GOOD, "prompt": ["hello"]}).prompt_ids == prepared.prompt_ids
    assert prepared.id.startswith("cmpl-") and not prepared.chat and not prepared.stream and prepared.model == "toy"


def test_a_token_id_prompt_is_kept():
    assert prepare_body({**GOOD, "prompt": [5, 6, 7]}).prompt_ids == [5, 6, 7]


def test_chat_messages_go_through_the_chat_template():
    prepared = prepare_body({"model": "toy", "messages": MESSAGES, "max_tokens": 8, "stream": True}, chat=True)
    assert prepared.prompt_ids == TOKENIZER.apply_chat_template(MESSAGES)
    assert prepared.id.startswith("chatcmpl-") and prepared.chat and prepared.stream


def test_model_may_be_left_out():
    assert prepare_body({k: v for k, v in GOOD.items() if k != "model"}).model == "toy"


def test_temperature_sets_alpha():
    (config,) = prepare_body({**GOOD, "temperature": 0.5}).configs
    assert config.alpha == 2.0
    (config,) = prepare_body({**GOOD, "temperature": 0.25, "alpha": 4.0}).configs
    assert config.alpha == 4.0


def test_max_tokens_is_the_horizon_in_blocks_of_block_size():
    (config,) = prepare_body({**GOOD, "max_tokens": 16, "block_size": 8}).configs
    assert (config.block_size, config.num_blocks) == (8, 2)
    (config,) = prepare_body({**GOOD, "max_tokens": 16}).configs
    assert (config.block_size, config.num_blocks) == (16, 1)
    (config,) = prepare_body({k: v for k, v in GOOD.items() if k != "max_tokens"}).configs
    assert config.block_size * config.num_blocks == SETTINGS.default_max_tokens


def test_power_sampling_fields_reach_the_chain_and_the_rest_keeps_the_base():
    power = {"alpha": 3.0, "mh_steps": 5, "prefetch_budget": 6, "traversal": "bfs", "sampler": "entropy_cut"}
    (config,) = prepare_body({**GOOD, **power}).configs
    assert config.model_dump(include=set(power)) == power
    assert config.num_tries == BASE.num_tries and config.fixed_length == BASE.fixed_length


def test_choice_i_uses_derive_seed_of_the_request_seed():
    prepared = prepare_body({**GOOD, "n": 3, "seed": 42})
    assert prepared.seed == 42
    assert [c.seed for c in prepared.configs] == [derive_seed(42, i) for i in range(3)]


def test_a_request_without_seed_gets_a_drawn_one():
    body = {k: v for k, v in GOOD.items() if k != "seed"}
    prepared = prepare_body({**body, "n": 2})
    assert 0 <= prepared.seed < 2**31
    assert [c.seed for c in prepared.configs] == [derive_seed(prepared.seed, i) for i in range(2)]


# --- response bodies -------------------------------------------------------------------------
EOS = TOKENIZER.eos_token_id
STATS = SampleStats(model_calls=4, transitions=10, accepted=5, requests=12)
RESULTS = [SampleResult((5, 6, EOS), STATS), SampleResult((7, 8, 9, 10), STATS)]  # one stopped at EOS, one did not


def sampled(prepared: Prepared):
    return [choice_from_result(i, r, c.seed, TOKENIZER) for i, (r, c) in enumerate(zip(RESULTS, prepared.configs))]


def expected_stats(seed: int) -> dict:
    return {
        "seed": seed, "model_calls": 4, "transitions": 10, "accepted": 5,
        "acceptance_rate": 0.5, "transitions_per_call": 2.5, "requests": 12,
    }  # fmt: skip


def test_completion_body():
    prepared = prepare_body({**GOOD, "n": 2, "seed": 42})
    body = completion_response(prepared, sampled(prepared)).model_dump(mode="json")
    assert isinstance(body.pop("created"), int)
    prompt_tokens = len(prepared.prompt_ids)
    assert body == {
        "id": prepared.id,
        "object": "text_completion",
        "model": "toy",
        "choices": [
            {"index": 0, "text": TOKENIZER.decode([5, 6]), "finish_reason": "stop",
             "power_sampling": expected_stats(derive_seed(42, 0)), "logprobs": None},
            {"index": 1, "text": TOKENIZER.decode([7, 8, 9, 10]), "finish_reason": "length",
             "power_sampling": expected_stats(derive_seed(42, 1)), "logprobs": None},
        ],  # fmt: skip
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 7, "total_tokens": prompt_tokens + 7},
        "power_sampling": {"seed": 42},
    }
    parsed = openai.types.Completion.model_validate({**body, "created": 0})
    assert [c.finish_reason for c in parsed.choices] == ["stop", "length"]


def test_chat_body():
    prepared = prepare_body({"model": "toy", "messages": MESSAGES, "max_tokens": 8, "n": 2, "seed": 9}, chat=True)
    body = completion_response(prepared, sampled(prepared)).model_dump(mode="json")
    parsed = openai.types.chat.ChatCompletion.model_validate(body)
    assert parsed.object == "chat.completion" and parsed.id.startswith("chatcmpl-")
    assert [c.message.content for c in parsed.choices] == [TOKENIZER.decode([5, 6]), TOKENIZER.decode([7, 8, 9, 10])]
    assert {c.message.role for c in parsed.choices} == {"assistant"}
    assert parsed.choices[1].model_extra["power_sampling"] == expected_stats(derive_seed(9, 1))
    assert parsed.usage.completion_tokens == 7 and parsed.model_extra["power_sampling"] == {"seed": 9}


def test_stream_chunks():
    prepared = prepare_body({**GOOD, "n": 2, "seed": 42, "stream": True})
    choice = sampled(prepared)[1]
    progress = progress_chunk(prepared, 1, STATS, 3, 8).model_dump(mode="json")
    assert progress["object"] == "text_completion" and progress["id"] == prepared.id
    assert progress["choices"] == [{"index": 1, "text": "", "finish_reason": None, "logprobs": None}]
    assert progress["power_sampling"] == {
        "event": "progress", "transitions": 10, "model_calls": 4, "events_done": 3, "events_total": 8,
    }  # fmt: skip
    done = done_chunk(prepared, choice).model_dump(mode="json")
    assert done["choices"] == [{"index": 1, "text": choice.text, "finish_reason": "length", "logprobs": None}]
    assert done["power_sampling"] == {"event": "done", **expected_stats(derive_seed(42, 1)), "completion_tokens": 4}
    assert openai.types.Completion.model_validate(done).choices[0].text == choice.text


def test_chat_stream_chunks():
    prepared = replace(prepare_body({**GOOD, "seed": 42, "stream": True}), chat=True)
    progress = progress_chunk(prepared, 0, STATS, 1, 8).model_dump(mode="json")
    assert progress["object"] == "chat.completion.chunk"
    assert progress["choices"] == [{"index": 0, "delta": {}, "finish_reason": None}]
    choice = sampled(prepared)[0]
    done = openai.types.chat.ChatCompletionChunk.model_validate(done_chunk(prepared, choice).model_dump(mode="json"))
    assert (done.choices[0].delta.role, done.choices[0].delta.content) == ("assistant", choice.text)
    assert done.choices[0].finish_reason == "stop" and done.model_extra["power_sampling"]["event"] == "done"


def test_error_event_models_and_stats_bodies():
    assert error_event(RuntimeError("engine died")).model_dump() == {
        "error": {"message": "sampling failed: engine died", "type": "server_error", "param": None, "code": None}
    }
    models = openai.types.Model.model_validate(models_body("toy").model_dump()["data"][0])
    assert (models.id, models.object, models.owned_by) == ("toy", "model", "presto-ray")
    from actors.coordinator_stats import CoordinatorCounters, CoordinatorSnapshot
    from presto_ray.engines import CallAccounting

    snapshot = CoordinatorSnapshot(
        CoordinatorCounters(submitted_requests=9, deduplicated=2),
        CallAccounting(calls=3, num_requests=7, prompt_tokens=40, cached_prompt_tokens=30),
        calls_per_replica=[2, 1], inflight_calls_per_replica=[0, 1], healthy=[True, True], queue_depth=4,
    )  # fmt: skip
    body = stats_body(snapshot)
    assert json.loads(json.dumps(body)) == body  # plain JSON, one level
    assert (body["calls"], body["num_requests"], body["submitted_requests"], body["deduplicated"]) == (3, 7, 9, 2)
    assert body["requests_per_call"] == pytest.approx(7 / 3) and body["cached_token_share"] == 0.75
    assert body["calls_per_replica"] == [2, 1] and body["queue_depth"] == 4

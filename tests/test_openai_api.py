"""The HTTP contract as pure functions (no Ray, no HTTP): every bad input gets its status and a
message naming the field; good requests become the chains the in-process sampler would run; the
bodies built from their results are what the `openai` package's own types accept."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from presto_ray.config import SamplerConfig
from presto_ray.engines import ToyEngineConfig
from presto_ray.keys import derive_seed
from presto_ray.openai import (
    HTTP_FIGURES,
    ApiError,
    Prepared,
    check_api_key,
    check_content_type,
    choice_from_result,
    completion_response,
    done_chunk,
    error_event,
    internal_error,
    models_body,
    openapi_route,
    prepare,
    progress_chunk,
    sse_event,
    stream_end,
)
from presto_ray.results import SampleResult, SampleStats
from presto_ray.serve_config import ServeConfig

openai = pytest.importorskip("openai")

TOKENIZER = ToyEngineConfig(vocab_size=48, max_model_len=512).build_tokenizer()
BASE = SamplerConfig(block_size=8, mh_steps=4, prefetch_budget=4, seed=0)
SETTINGS = ServeConfig()
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
    # non-finite or absurd numbers (issue 15 item 3): 400 naming the field, never a 500 or a greedy 200
    ({"alpha": float("inf")}, 400, "alpha"),
    ({"alpha": float("nan")}, 400, "alpha"),
    ({"alpha": 1e308}, 400, "alpha"),
    ({"alpha": 1001.0}, 400, "alpha"),
    ({"temperature": 1e-320}, 400, "temperature"),
    ({"temperature": float("nan")}, 400, "temperature"),
    # unknown and unsupported fields (item 8)
    ({"top_k": 40}, 400, "top_k"),
    ({"min_p": 0.1}, 400, "min_p"),
    ({"repetition_penalty": 1.2}, 400, "repetition_penalty"),
    ({"mh_step": 5}, 400, "mh_step"),
    ({"best_of": 2}, 400, "best_of"),
    ({"logprobs": True}, 400, "logprobs"),  # completions: an int (0 returns log p0)
    ({"logprobs": 1}, 400, "logprobs"),  # no per-token top alternatives exist
    ({"top_logprobs": 2}, 400, "top_logprobs"),
    ({"stream_options": {"include_usage": True}}, 400, "stream_options"),  # without stream
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, 400, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": True, "surprise": 1}}, 400, "stream_options"),
    ({"tools": [{"type": "function"}]}, 400, "tools"),
    # work bounds (item 5)
    ({"max_tokens": 512, "block_size": 1}, 400, "block_size"),
    ({"n": 16, "max_tokens": 2048, "block_size": 8, "mh_steps": 1000}, 400, "mh_steps"),
    # a lone surrogate cannot be tokenized (item 6)
    ({"prompt": "abc\ud800"}, 400, "prompt"),
    ({"prompt": ["\udfff"]}, 400, "prompt"),
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
STATS = SampleStats(
    rounds=4, stream_batches=2, transitions=10, accepted=5, requests=12, generated_tokens=90, prompt_tokens=300,
    cached_prompt_tokens=200, aborted_requests=1, early_stopped_requests=3, early_stop_tokens_left=40,
)  # fmt: skip
LOGP0 = [(-0.5, -1.25, -0.125), (-2.0, -0.25, -0.75, -1.5)]
RESULTS = [SampleResult((5, 6, EOS), STATS, LOGP0[0]), SampleResult((7, 8, 9, 10), STATS, LOGP0[1])]  # one stopped at EOS, one did not
USAGE_POWER_SAMPLING = {  # both chains' STATS summed
    "rounds": 8, "stream_batches": 4, "requests": 24, "generated_tokens": 180, "prefill_tokens": 600, "cached_prefill_tokens": 400,
    "transitions": 20, "accepted": 10, "aborted_requests": 2, "early_stopped_requests": 6, "early_stop_tokens_left": 80,
}  # fmt: skip


def sampled(prepared: Prepared):
    return [
        choice_from_result(i, r, c.seed, TOKENIZER, prepared.logprobs)
        for i, (r, c) in enumerate(zip(RESULTS, prepared.configs))
    ]


def expected_stats(seed: int) -> dict:
    return {
        "seed": seed, "rounds": 4, "stream_batches": 2, "transitions": 10, "accepted": 5,
        "acceptance_rate": 0.5, "transitions_per_round": 2.5, "transitions_per_stream_batch": 5.0, "requests": 12,
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
        "usage": {
            "prompt_tokens": prompt_tokens, "completion_tokens": 7, "total_tokens": prompt_tokens + 7,
            "power_sampling": USAGE_POWER_SAMPLING,
        },  # fmt: skip
        "power_sampling": {"seed": 42},
    }
    parsed = openai.types.Completion.model_validate({**body, "created": 0})
    assert [c.finish_reason for c in parsed.choices] == ["stop", "length"]
    assert parsed.usage.total_tokens == prompt_tokens + 7
    assert parsed.usage.model_extra["power_sampling"]["generated_tokens"] == 180


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
        "event": "progress", "transitions": 10, "rounds": 4, "stream_batches": 2, "events_done": 3, "events_total": 8,
    }  # fmt: skip
    done = done_chunk(prepared, choice).model_dump(mode="json")
    assert done["choices"] == [{"index": 1, "text": choice.text, "finish_reason": "length", "logprobs": None}]
    assert done["power_sampling"] == {"event": "done", **expected_stats(derive_seed(42, 1)), "completion_tokens": 4}
    assert openai.types.Completion.model_validate(done).choices[0].text == choice.text


def test_chat_stream_chunks():
    prepared = replace(prepare_body({**GOOD, "seed": 42, "stream": True}), chat=True)
    progress = progress_chunk(prepared, 0, STATS, 1, 8).model_dump(mode="json")
    assert progress["object"] == "chat.completion.chunk"
    assert progress["choices"] == [{"index": 0, "delta": {}, "finish_reason": None, "logprobs": None}]
    choice = sampled(prepared)[0]
    done = openai.types.chat.ChatCompletionChunk.model_validate(done_chunk(prepared, choice).model_dump(mode="json"))
    assert (done.choices[0].delta.role, done.choices[0].delta.content) == ("assistant", choice.text)
    assert done.choices[0].finish_reason == "stop" and done.model_extra["power_sampling"]["event"] == "done"


def test_error_event_models_and_stats_bodies():
    error = error_event(RuntimeError("engine died at /secret/path"), "cmpl-1").model_dump()["error"]
    assert (error["type"], error["param"], error["code"]) == ("server_error", None, None)
    assert "err-" in error["message"] and "secret" not in error["message"]
    models = openai.types.Model.model_validate(models_body("toy").model_dump()["data"][0])
    assert (models.id, models.object, models.owned_by) == ("toy", "model", "presto-ray")
    body = stats_body(SNAPSHOT)
    assert json.loads(json.dumps(body)) == body  # plain JSON, one level
    assert (body["calls"], body["num_requests"], body["submitted_requests"], body["deduplicated"]) == (3, 7, 9, 2)
    assert body["requests_per_call"] == pytest.approx(7 / 3) and body["cached_token_share"] == 0.75
    assert body["calls_per_replica"] == [2, 1] and body["queue_depth"] == 4


def stats_body(snapshot) -> dict:
    """GET /v1/stats as clients read it: the typed body the deployment builds, as JSON."""
    from deployments.serve_stats import stats_response

    return json.loads(stats_response(snapshot).model_dump_json())


def _snapshot():
    from actors.coordinator_stats import CoordinatorCounters, CoordinatorSnapshot
    from presto_ray.engines import CallAccounting

    return CoordinatorSnapshot(
        CoordinatorCounters(submitted_requests=9, deduplicated=2, chains_finished=5, stream_aborts=1),
        CallAccounting(calls=3, num_requests=7, prompt_tokens=40, cached_prompt_tokens=30, wall_time_s=2.5),
        calls_per_replica=[2, 1], inflight_calls_per_replica=[0, 1], inflight_requests_per_replica=[0, 3],
        healthy=[True, True], queue_depth=4, streams_running=2, active_replicas=2,
    )  # fmt: skip


SNAPSHOT = _snapshot()
# the /v1/stats keys as clients have read them (bench/load_test.py and tests/test_serve.py among them), in order
STATS_KEYS = [
    "submitted_requests", "deduplicated", "chains_finished", "chains_abandoned", "chains_expired", "replica_failures",
    "resent_requests", "max_queue_depth", "max_requests_per_call", "affinity_misses", "streamed_requests",
    "stream_aborts", "calls", "num_requests", "prompt_tokens", "cached_prompt_tokens", "generated_tokens",
    "scoring_tokens", "scoring_time_s", "wall_time_s", "requests_per_call", "cached_token_share", "calls_per_replica",
    "inflight_calls_per_replica", "inflight_requests_per_replica", "healthy", "active_replicas", "ongoing_requests",
    "queue_depth", "chains_active", "coordinator_shards", "streams_running", "client_disconnects", "pending_replicas",
]  # fmt: skip


def test_the_stats_body_keeps_its_keys_and_reads_the_snapshot():
    from presto_ray.openai import StatsResponse

    body = stats_body(SNAPSHOT)
    assert list(body) == STATS_KEYS
    assert StatsResponse.model_validate(body).model_dump(mode="json") == body  # the typed body, round trip
    assert (body["chains_finished"], body["stream_aborts"], body["wall_time_s"]) == (5, 1, 2.5)
    assert body["ongoing_requests"] == SNAPSHOT.ongoing_requests == 4 + 3 + 2
    assert (body["streams_running"], body["active_replicas"], body["coordinator_shards"]) == (2, 2, 1)
    assert body["inflight_requests_per_replica"] == [0, 3] and body["healthy"] == [True, True]
    # two shards: the body is the combined snapshot's
    from actors.coordinator_stats import CoordinatorSnapshot

    both = stats_body(CoordinatorSnapshot.combine([SNAPSHOT, _snapshot()]))
    assert (both["submitted_requests"], both["calls"], both["coordinator_shards"]) == (18, 6, 2)
    assert both["calls_per_replica"] == [4, 2] and both["requests_per_call"] == pytest.approx(7 / 3)


# --- the chains' figures: one mapping from SampleStats to HTTP names -----------------------------
# every field distinct, so a figure read from the wrong field shows
DISTINCT = SampleStats(
    rounds=3, stream_batches=5, transitions=7, accepted=2, extensions=11, requests=13, requests_used=17,
    aborted_requests=19, forked_requests=23, generated_tokens=29, certain_edges=31, prompt_tokens=37,
    cached_prompt_tokens=41, wall_time_s=43.0, early_stopped_requests=47, early_stop_tokens_left=53,
    early_rejected_steps=59, early_stop_rerequests=61,
)  # fmt: skip


def test_every_http_figure_is_read_from_its_sample_stats_field():
    from presto_ray.openai import PowerSamplingStats, PowerSamplingUsage, ProgressEvent
    from presto_ray.openai.figures import choice_figures, progress_event, usage_figures

    assert all(hasattr(DISTINCT, field) for field in HTTP_FIGURES.values())
    assert {k: v for k, v in HTTP_FIGURES.items() if k != v} == {
        "prefill_tokens": "prompt_tokens", "cached_prefill_tokens": "cached_prompt_tokens"
    }  # fmt: skip
    non_figures = {"seed", "event", "events_done", "events_total"}
    shapes = [
        (PowerSamplingStats, choice_figures(DISTINCT, seed=1).model_dump()),
        (PowerSamplingUsage, usage_figures([DISTINCT]).model_dump()),
        (ProgressEvent, progress_event(DISTINCT, 1, 2).model_dump()),
    ]
    for shape, body in shapes:
        figures = set(shape.model_fields) - non_figures
        assert figures <= set(HTTP_FIGURES), shape  # no figure of its own, outside the mapping
        assert {name: body[name] for name in figures} == {name: getattr(DISTINCT, HTTP_FIGURES[name]) for name in figures}
    # usage sums the chains before mapping; the rates of a choice are the chain's own
    summed = usage_figures([DISTINCT, DISTINCT]).model_dump()
    assert summed["prefill_tokens"] == 2 * 37 and summed["aborted_requests"] == 2 * 19
    assert choice_figures(DISTINCT, 1).acceptance_rate == pytest.approx(2 / 7)


def test_the_power_sampling_fields_have_the_samplers_types():
    """Their bounds are copied from SamplerConfig; their types are written out (for the type
    checker): they must stay the sampler's, made optional."""
    from presto_ray.openai import ChatRequest, CompletionRequest
    from presto_ray.openai.protocol import POWER_FIELDS

    for model in (CompletionRequest, ChatRequest):
        for name in POWER_FIELDS:
            field, sampler = model.model_fields[name], SamplerConfig.model_fields[name]
            assert field.annotation == sampler.annotation | None, name
            assert field.metadata == sampler.metadata and field.default is None, name


# --- hardening (issue 15) --------------------------------------------------------------------
@pytest.mark.parametrize(
    "neutral",
    [{"best_of": 1}, {"tools": []}, {"logprobs": None}, {"top_logprobs": 0}, {"echo": False},
     {"top_k": -1}, {"min_p": 0.0}, {"repetition_penalty": 1.0}, {"stop": None}, {"user": "me"}],
    ids=lambda change: next(iter(change.items())).__repr__(),
)  # fmt: skip
def test_neutral_values_of_unsupported_fields_pass(neutral):
    assert prepare_body({**GOOD, **neutral}).configs


def test_unknown_fields_are_named_with_a_hint():
    error = api_error({**GOOD, "mh_step": 5})
    assert error.param == "mh_step" and "unknown field 'mh_step'" in error.message
    error = api_error({"model": "toy", "messages": MESSAGES, "top_k": 3}, chat=True)
    assert error.param == "top_k" and "not supported" in error.message


def test_model_level_config_errors_name_the_field():
    """A cross-field rule of SamplerConfig: the error names prefetch_budget, not `None: Value error`."""
    error = api_error({**GOOD, "sampler": "multi_try", "prefetch_budget": 2})
    assert error.param == "prefetch_budget" and error.message.startswith("prefetch_budget: ")
    assert "None" not in error.message and "Value error" not in error.message


def test_the_smallest_temperature_is_alpha_at_its_limit():
    from presto_ray.config import MAX_ALPHA

    (config,) = prepare_body({**GOOD, "temperature": 1 / MAX_ALPHA}).configs
    assert config.alpha == pytest.approx(MAX_ALPHA)


def test_work_limits_name_the_serve_key_to_raise():
    blocks = api_error({**GOOD, "max_tokens": 512, "block_size": 1})
    assert "serve.max_num_blocks" in blocks.message
    work = api_error({**GOOD, "n": 16, "max_tokens": 2048, "block_size": 8, "mh_steps": 1000})
    assert "serve.max_request_work" in work.message and "token-steps" in work.message
    # the same request passes where the service allows more
    raw = json.dumps({**GOOD, "n": 2, "max_tokens": 256, "block_size": 2, "mh_steps": 1000}).encode()
    roomy = ServeConfig(max_request_work=10**12, max_request_tokens=10**12)
    kwargs = dict(tokenizer=TOKENIZER, model_name="toy", context_length=512, base_sampler=BASE)
    assert len(prepare(raw, False, settings=roomy, **kwargs).configs) == 2
    with pytest.raises(ApiError):
        prepare(raw, False, settings=SETTINGS, **kwargs)


def test_deeply_nested_json_is_a_400():
    for raw in (b"[" * 100_000 + b"]" * 100_000, b'{"prompt": "hi", "stream_options": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"):
        error = api_error(raw)
        assert error.status == 400 and "nested too deeply" in error.message


def test_a_lone_surrogate_in_a_chat_message_names_it():
    messages = [{"role": "user", "content": "fine"}, {"role": "user", "content": "bad \ud800"}]
    error = api_error({"model": "toy", "messages": messages}, chat=True)
    assert error.param == "messages" and error.message.startswith("messages.1.content: ") and "surrogate" in error.message


def test_internal_errors_are_logged_with_an_id_and_answered_without_internals(caplog):
    try:
        raise RuntimeError("actor 1234abcd on node 10.0.0.7 died: /home/me/.venv/lib/python3.11/x.py")
    except RuntimeError as e:
        error = internal_error(e, "cmpl-xyz")
    body = error.body()["error"]
    assert error.status == 500 and body["type"] == "server_error"
    error_id = body["message"].split()[-1]
    assert error_id.startswith("err-") and "10.0.0.7" not in body["message"] and ".venv" not in body["message"]
    (record,) = [r for r in caplog.records if error_id in r.getMessage()]
    assert "cmpl-xyz" in record.getMessage() and record.exc_info and "10.0.0.7" in str(record.exc_info[1])


@pytest.mark.parametrize("header", ["Bearer k3y", "bearer k3y", "BEARER   k3y", " Bearer k3y "])
def test_the_bearer_scheme_is_case_insensitive(header):
    check_api_key(header, "k3y")
    check_api_key(None, None)  # no key set: everything passes


@pytest.mark.parametrize("header", [None, "", "k3y", "Basic k3y", "Bearer k3", "Bearer k3y4", "Bearerk3y"])
def test_a_missing_or_wrong_key_is_a_401_with_a_challenge(header):
    with pytest.raises(ApiError) as caught:
        check_api_key(header, "k3y")
    assert caught.value.status == 401 and caught.value.headers["WWW-Authenticate"].startswith("Bearer")


def test_the_key_is_compared_in_constant_time(monkeypatch):
    import hmac

    calls = []
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: calls.append((a, b)) or a == b)
    check_api_key("Bearer k3y", "k3y")
    assert calls == [(b"k3y", b"k3y")]


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8", "Application/JSON"])
def test_json_content_types_pass(content_type):
    check_content_type(content_type)


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"])
def test_other_content_types_are_a_415(content_type):
    with pytest.raises(ApiError) as caught:
        check_content_type(content_type)
    assert caught.value.status == 415 and "application/json" in caught.value.message


def test_fuzzed_bodies_get_a_result_or_an_api_error():
    """Hypothesis over the request schema: prepare() returns chains or raises ApiError (a 4xx),
    never anything else (which the service would answer with a 500)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12)
    values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
    names = st.sampled_from(
        ["model", "prompt", "messages", "max_tokens", "n", "seed", "temperature", "top_p", "frequency_penalty", "stream",
         "stream_options", "alpha", "mh_steps", "block_size", "prefetch_budget", "traversal", "sampler", "logprobs",
         "stop", "best_of", "tools", "top_k", "min_p", "user"]
    ) | st.text(max_size=8)  # fmt: skip
    messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "wizard"]), "content": st.text(max_size=8)}), max_size=2)
    bodies = st.dictionaries(names, values | messages | st.integers(1, 64), max_size=8) | values

    @settings(max_examples=200, deadline=None, derandomize=True)
    @given(body=bodies, chat=st.booleans())
    def check(body, chat):
        try:
            prepare_body(json.dumps(body, allow_nan=True).encode(), chat)
        except ApiError as e:
            assert 400 <= e.status < 500 and e.message

    check()


def test_the_vllm_context_leaves_room_for_the_scoring_pass():
    """prompt + max_tokens == max_model_len passed before, then vLLM refused the scoring pass
    (prompt + completion + 1 tokens): a 500. With a scoring pass the spec's context is one token
    less, so it is a 400; with log p0 from the sampler it is max_model_len."""
    from presto_ray.engines.specs import VLLMEngineConfig

    assert VLLMEngineConfig(max_model_len=64).context_length == 64
    context = VLLMEngineConfig(max_model_len=64, logp0_from="scoring_pass").context_length
    assert context == 63
    kwargs = dict(tokenizer=TOKENIZER, model_name="toy", context_length=context, base_sampler=BASE, settings=SETTINGS)
    prompt = list(range(1, 9))  # 8 tokens
    assert prepare(json.dumps({"prompt": prompt, "max_tokens": 55}).encode(), False, **kwargs).prompt_ids == prompt
    with pytest.raises(ApiError) as caught:
        prepare(json.dumps({"prompt": prompt, "max_tokens": 56}).encode(), False, **kwargs)
    assert caught.value.param == "prompt" and "context of 63 tokens" in caught.value.message


# --- usage, logprobs, stream_options, OpenAPI (issue 12) ---------------------------------------
def test_completion_logprobs_are_the_chains_log_p0_in_openais_shape():
    prepared = prepare_body({**GOOD, "n": 2, "seed": 42, "logprobs": 0})
    assert prepared.logprobs and not prepare_body(GOOD).logprobs
    body = completion_response(prepared, sampled(prepared)).model_dump(mode="json")
    parsed = openai.types.Completion.model_validate(body)
    for choice, tokens, logp0 in zip(parsed.choices, [(5, 6, EOS), (7, 8, 9, 10)], LOGP0):
        lp = choice.logprobs
        assert lp.token_logprobs == list(logp0)  # every returned token, EOS included
        assert lp.tokens == [TOKENIZER.decode([t]) for t in tokens]
        assert lp.top_logprobs == [{token: value} for token, value in zip(lp.tokens, logp0)]
        assert "".join(lp.tokens) == choice.text
        assert [choice.text[o:] for o in lp.text_offset] == ["".join(lp.tokens[i:]) for i in range(len(tokens))]


def test_chat_logprobs_and_the_streamed_done_chunk_carry_them():
    body = {"model": "toy", "messages": MESSAGES, "max_tokens": 8, "n": 2, "seed": 9, "logprobs": True, "top_logprobs": 0}
    prepared = prepare_body(body, chat=True)
    parsed = openai.types.chat.ChatCompletion.model_validate(completion_response(prepared, sampled(prepared)).model_dump(mode="json"))
    content = parsed.choices[1].logprobs.content
    assert [t.logprob for t in content] == list(LOGP0[1]) and all(t.top_logprobs == [] for t in content)
    assert [t.token for t in content] == [TOKENIZER.decode([t]) for t in (7, 8, 9, 10)]
    assert content[0].bytes == list(content[0].token.encode())
    assert prepare_body({**body, "logprobs": False}, chat=True).logprobs is False
    assert api_error({**body, "logprobs": 0}, chat=True).param == "logprobs"  # chat's is a bool
    assert api_error({**body, "top_logprobs": 1}, chat=True).param == "top_logprobs"
    streamed = replace(prepared, stream=True)
    done = done_chunk(streamed, sampled(streamed)[0]).model_dump(mode="json")
    chunk = openai.types.chat.ChatCompletionChunk.model_validate(done)
    assert [t.logprob for t in chunk.choices[0].logprobs.content] == list(LOGP0[0])


def test_a_result_without_its_log_p0_is_never_answered_with_made_up_values():
    prepared = prepare_body({**GOOD, "logprobs": 0})
    with pytest.raises(RuntimeError, match="log p0"):
        choice_from_result(0, SampleResult((5, 6), STATS), 1, TOKENIZER, logprobs=True)
    assert choice_from_result(0, SampleResult((5, 6), STATS), 1, TOKENIZER).logprobs is None
    assert prepared.logprobs


def test_include_usage_sends_a_last_chunk_and_usage_nowhere_else_without_it():
    plain = prepare_body({**GOOD, "n": 2, "seed": 42, "stream": True})
    assert not plain.include_usage
    choices = sampled(plain)
    plain_events = [sse_event(plain, progress_chunk(plain, 0, STATS, 1, 8)), sse_event(plain, done_chunk(plain, choices[0]))]
    assert all('"usage"' not in e for e in plain_events)
    assert stream_end(plain, choices) == ["data: [DONE]\n\n"]

    asked = prepare_body({**GOOD, "n": 2, "seed": 42, "stream": True, "stream_options": {"include_usage": True}})
    assert asked.include_usage
    chunk = json.loads(sse_event(asked, done_chunk(asked, choices[1])).removeprefix("data: "))
    assert chunk["usage"] is None  # OpenAI: every other chunk says usage: null
    last, done = stream_end(asked, list(reversed(choices)))
    assert done == "data: [DONE]\n\n"
    usage_chunk = openai.types.Completion.model_validate(json.loads(last.removeprefix("data: ")))
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == 7
    assert usage_chunk.usage.prompt_tokens == len(asked.prompt_ids)
    assert usage_chunk.usage.model_extra["power_sampling"] == USAGE_POWER_SAMPLING
    assert usage_chunk.model_extra["power_sampling"] == {"seed": 42, "event": "usage"}
    # a chain that failed has no cost to report: no usage chunk, still [DONE]
    assert stream_end(asked, choices[:1]) == ["data: [DONE]\n\n"]
    chat = replace(asked, chat=True)
    parsed = openai.types.chat.ChatCompletionChunk.model_validate(json.loads(stream_end(chat, choices)[0].removeprefix("data: ")))
    assert parsed.choices == [] and parsed.usage.total_tokens == len(asked.prompt_ids) + 7


def test_the_route_schema_lists_every_field_with_the_samplers_limits():
    from presto_ray.config import MAX_ALPHA, MAX_PREFETCH_BUDGET

    for chat in (False, True):
        route = openapi_route(chat)
        schema = route["openapi_extra"]["requestBody"]["content"]["application/json"]["schema"]
        fields = schema["properties"]
        assert "$defs" not in json.dumps(schema)  # inlined: an operation cannot hold its own $defs
        bounds = {name: next(a for a in fields[name]["anyOf"] if a["type"] != "null") for name in ("alpha", "mh_steps", "prefetch_budget", "block_size")}
        assert (bounds["alpha"]["minimum"], bounds["alpha"]["maximum"]) == (1.0, MAX_ALPHA)
        assert bounds["prefetch_budget"]["maximum"] == MAX_PREFETCH_BUDGET and bounds["mh_steps"]["minimum"] == 0
        assert bounds["block_size"]["minimum"] == 1
        assert next(a for a in fields["traversal"]["anyOf"] if a["type"] != "null")["enum"] == ["serial", "bfs", "predictive"]
        assert {"n", "seed", "max_tokens", "temperature", "stream", "stream_options", "logprobs"} <= set(fields)
        assert fields["logprobs"]["description"] and ("messages" if chat else "prompt") in schema["required"]
        assert set(route["responses"]) == {200, 400, 401, 404, 413, 415, 500}


# --- attacker probe (issue "Nothing lost, nothing twice, no traceback") ------------------------
@pytest.mark.parametrize("key", ["contnet", "name", "tool_calls"])
def test_unknown_keys_inside_chat_messages_are_a_400_naming_them(key):
    messages = [{"role": "user", "content": "hi", key: "x"}]
    error = api_error({"model": "toy", "messages": messages}, chat=True)
    assert (error.status, error.param) == (400, "messages") and error.message.startswith(f"messages.0.{key}: "), error.message


@pytest.mark.parametrize(
    "raw,key",
    [
        (b'{"prompt":"hi","max_tokens":-5,"max_tokens":8}', "max_tokens"),
        (b'{"prompt":"hi","max_tokens":8,"stream":true,"stream_options":{"include_usage":true,"include_usage":false}}', "include_usage"),
    ],
    ids=["top-level", "nested"],
)
def test_duplicate_json_keys_are_refused(raw, key):
    error = api_error(raw)
    assert error.status == 400 and "more than once" in error.message and key in error.message


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32", "latin-1", "utf-8-sig"])
def test_only_utf8_json_bodies_are_read(encoding):
    raw = json.dumps({**GOOD, "prompt": "caf\u00e9"}, ensure_ascii=False).encode(encoding)
    error = api_error(raw)
    assert error.status == 400 and "UTF-8" in error.message, error.message


@pytest.mark.parametrize("content_type", ["application/json; charset=latin-1", "application/json;charset=utf-16"])
def test_a_charset_other_than_utf8_is_a_415(content_type):
    with pytest.raises(ApiError) as caught:
        check_content_type(content_type)
    assert caught.value.status == 415 and "UTF-8" in caught.value.message
    check_content_type("application/json; charset=UTF-8")


@pytest.mark.parametrize(
    "body,chat,param",
    [
        ({**GOOD, "stream": True, "stream_options": "yes"}, False, "stream_options"),
        ({"model": "toy", "messages": ["hi"]}, True, "messages"),
        ({"model": "toy", "messages": [["user", "hi"]]}, True, "messages"),
        ({**GOOD, "prompt": {"text": "hi"}}, False, "prompt"),
    ],
    ids=["stream-options", "message-string", "message-list", "prompt-object"],
)
def test_400_messages_name_the_field_path_not_pydantic_classes(body, chat, param):
    error = api_error(body, chat)
    assert error.param == param and error.message.startswith(param)
    for internal in ("StreamOptions", "ChatMessage", "CompletionRequest", "ChatRequest", "_Request", "instance of"):
        assert internal not in error.message, error.message


@pytest.mark.parametrize(
    "field,value,limit",
    [("mh_steps", 1_000_000, 1000), ("mh_steps", 5000, 1000), ("prefetch_budget", 100_000, 256), ("prefetch_budget", 300, 256)],
)
def test_over_limit_steps_and_budgets_cite_the_services_limit(field, value, limit):
    error = api_error({**GOOD, field: value})
    assert error.param == field and f"at most {limit} " in error.message and f"serve.max_{field}" in error.message, error.message


def test_a_one_token_prompt_is_one_token():
    error = api_error({**GOOD, "prompt": [5], "max_tokens": 512})
    assert "prompt (1 token) + max_tokens (512)" in error.message, error.message
    assert "prompt (2 tokens)" in api_error({**GOOD, "prompt": [5, 6], "max_tokens": 511}).message


def test_routing_errors_have_the_openai_shape():
    from presto_ray.openai import http_error

    for status, kind in ((404, "not_found_error"), (405, "invalid_request_error")):
        body = http_error(status, "Not Found").body()
        assert set(body) == {"error"} and body["error"]["type"] == kind and body["error"]["message"]
    assert http_error(405, headers={"Allow": "POST"}).headers == {"Allow": "POST"}


@pytest.mark.parametrize(
    "value,safe",
    [("abc-123_X.y", True), ("a" * 64, True), ("a" * 65, False), ("", False), (None, False), ("<script>", False),
     ("id with space", False), ("id\r\nSet-Cookie: x", False), ("caf\u00e9", False)],
)  # fmt: skip
def test_only_safe_client_request_ids_are_kept(value, safe):
    from presto_ray.openai import safe_request_id

    assert safe_request_id(value) == (value if safe else None)


def test_header_bounds_and_single_headers():
    from presto_ray.openai import check_headers

    fine = [(b"host", b"x"), (b"authorization", b"Bearer k"), (b"content-type", b"application/json")]
    check_headers(fine, max_count=100, max_bytes=16384)
    for headers, status in [
        ([(b"x-big", b"a" * 1_000_000)], 431),
        ([(f"x-h{i}".encode(), b"v") for i in range(2000)], 431),
        ([(b"authorization", b"Bearer k"), (b"Authorization", b"Bearer x")], 400),
        ([(b"content-length", b"8"), (b"content-length", b"9")], 400),
    ]:
        with pytest.raises(ApiError) as caught:
            check_headers(headers, max_count=100, max_bytes=16384)
        assert caught.value.status == status


def test_a_client_that_disconnects_is_one_log_line_without_a_traceback(caplog):
    import logging

    from presto_ray.openai import client_disconnected

    with caplog.at_level(logging.INFO, logger="presto_ray.serve"):
        client_disconnected("cmpl-abc", "before its answer")
    (record,) = caplog.records
    assert record.levelno < logging.WARNING and record.exc_info is None
    assert "cmpl-abc" in record.getMessage() and "err-" not in record.getMessage()


# --- issue 34: integers past Python's limit, max_completion_tokens, codings, the token bound ----
LONG = "9" * 5000


@pytest.mark.parametrize(
    "raw,where,param",
    [
        (f'{{"prompt":"hi","max_tokens":{LONG}}}', "max_tokens", "max_tokens"),
        (f'{{"prompt":"hi","seed":{LONG}}}', "seed", "seed"),
        (f'{{"prompt":"hi","n":-{LONG}}}', "n", "n"),
        (f'{{"prompt":[5,{LONG}]}}', "prompt.1", "prompt"),
        (f'{{"prompt":"hi","stream":true,"stream_options":{{"include_usage":{LONG}}}}}', "stream_options.include_usage", "stream_options"),
        (LONG, "body", None),
    ],
    ids=["max_tokens", "seed", "negative-n", "token-id", "nested", "bare"],
)
def test_an_integer_past_pythons_digit_limit_is_a_400_naming_it(raw, where, param):
    """json.loads raised a ValueError (Python's int-string limit): a 500."""
    error = api_error(raw.encode())
    assert (error.status, error.param) == (400, param), error.message
    assert error.message.startswith(f"{where}: ") and "5,000 digits" in error.message and "4,300" in error.message, error.message


def test_integers_up_to_the_digit_limit_are_read_and_checked_as_numbers():
    longest = "9" * 4300
    error = api_error(f'{{"prompt":"hi","seed":{longest}}}'.encode())
    assert error.param == "seed" and "digits" not in error.message  # read, then over seed's bound
    error = api_error(f'{{"prompt":"hi","max_tokens":-{longest}}}'.encode())
    assert error.param == "max_tokens" and "digits" not in error.message
    assert api_error(f'{{"prompt":[5,{longest}],"max_tokens":8}}'.encode()).message.startswith("prompt token ids must be in")


def test_chat_accepts_max_completion_tokens_as_its_horizon():
    chat = {"model": "toy", "messages": MESSAGES}
    (config,) = prepare_body({**chat, "max_completion_tokens": 16}, chat=True).configs
    assert config.horizon == 16
    (config,) = prepare_body({**chat, "max_completion_tokens": 16, "max_tokens": 16}, chat=True).configs
    assert config.horizon == 16
    error = api_error({**chat, "max_completion_tokens": 16, "max_tokens": 8}, chat=True)
    assert error.param == "max_completion_tokens" and "(16)" in error.message and "max_tokens (8)" in error.message
    # refusals about the horizon name the field the request used
    error = api_error({**chat, "max_completion_tokens": 4096}, chat=True)
    assert error.param == "max_completion_tokens" and error.message.startswith("max_completion_tokens must be at most")
    assert api_error({**chat, "max_completion_tokens": 0}, chat=True).param == "max_completion_tokens"
    error = api_error({**chat, "max_completion_tokens": 500}, chat=True)
    assert error.param == "prompt" and "+ max_completion_tokens (500)" in error.message, error.message
    # the completions API (OpenAI's legacy one) has no such field
    assert api_error({**GOOD, "max_completion_tokens": 8}).param == "max_completion_tokens"


def test_a_content_or_transfer_coding_the_service_does_not_decode_is_refused():
    from presto_ray.openai import check_content_encoding, check_transfer_encoding

    for values in ([], [""], ["identity"], ["Identity"]):
        check_content_encoding(values)
    for values, named in ((["gzip"], "gzip"), (["br"], "br"), (["identity, gzip"], "gzip"), (["identity", "deflate"], "deflate")):
        with pytest.raises(ApiError) as caught:
            check_content_encoding(values)
        error = caught.value
        assert error.status == 415 and named in error.message and error.headers == {"Accept-Encoding": "identity"}
        assert error.body()["error"]["type"] == "invalid_request_error"
    check_transfer_encoding([])
    check_transfer_encoding(["chunked"])
    with pytest.raises(ApiError) as caught:
        check_transfer_encoding(["gzip, chunked"])
    assert caught.value.status == 501 and "gzip" in caught.value.message


HOSTILE_WORK = {**GOOD, "n": 16, "mh_steps": 1000, "max_tokens": 2048}


@pytest.mark.parametrize("budget", [None, 1, 256])
def test_a_request_whose_token_bound_is_over_the_limit_is_refused_before_it_runs(budget):
    """n=16, mh_steps=1000, max_tokens=2048 passes every per-field limit and the token-step one
    (32.8M < 50M): it generated 1.4M tokens in 100 s and would have gone on for hours."""
    from presto_ray.openai.work_bounds import request_token_bound

    body = HOSTILE_WORK if budget is None else {**HOSTILE_WORK, "prefetch_budget": budget}
    error = api_error(body)
    per_event = BASE.prefetch_budget if budget is None else budget
    bound = 16 * (1000 + 1) * per_event * 2048
    assert error.status == 400 and error.param == "mh_steps"
    assert f"up to {bound:,} tokens" in error.message and "the limit is 20,000,000" in error.message, error.message
    assert "serve.max_request_tokens" in error.message and "usage.power_sampling.generated_tokens" in error.message
    config = SamplerConfig.model_validate({**BASE.model_dump(), "mh_steps": 1000, "block_size": 2048, "prefetch_budget": per_event})
    assert request_token_bound(config, 16) == bound


def test_the_token_bound_counts_blocks_steps_budget_and_serial_tries():
    from presto_ray.openai.work_bounds import request_token_bound, requests_per_event

    config = SamplerConfig(block_size=8, num_blocks=3, mh_steps=10, prefetch_budget=6)
    assert requests_per_event(config) == 6 and request_token_bound(config, 2) == 2 * 3 * 11 * 6 * 24
    serial = config.model_copy(update={"traversal": "serial"})
    assert requests_per_event(serial) == 1 and request_token_bound(serial, 1) == 3 * 11 * 24
    tries = SamplerConfig(sampler="multi_try", traversal="serial", num_tries=5, prefetch_budget=2)
    assert requests_per_event(tries) == 5
    assert request_token_bound(SamplerConfig(mh_steps=0, block_size=4), 1) == 1 * 16 * 4  # extensions only
    # a service that allows more serves it
    roomy = ServeConfig(max_request_tokens=10**12)
    raw = json.dumps(HOSTILE_WORK).encode()
    kwargs = dict(tokenizer=TOKENIZER, model_name="toy", context_length=4096, base_sampler=BASE)
    assert len(prepare(raw, False, settings=roomy, **kwargs).configs) == 16


def test_the_shipped_configs_normal_requests_pass_the_token_bound():
    """Every shipped job config: chains_per_prompt choices with its sampler's steps and budget,
    at its own horizon and at serve.max_tokens_limit, one block, are within the default limit."""
    import glob
    import os

    from presto_ray.job import JobConfig
    from presto_ray.openai.work_bounds import request_token_bound

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    checked = 0
    for path in sorted(glob.glob(os.path.join(root, "configs", "*.yaml"))):
        job = JobConfig.from_yaml(path)
        for max_tokens in {job.sampler.horizon, job.serve.max_tokens_limit}:
            config = job.sampler.model_copy(update={"block_size": max_tokens, "num_blocks": 1})
            bound = request_token_bound(config, job.chains_per_prompt)
            assert bound <= ServeConfig().max_request_tokens, (path, max_tokens, f"{bound:,}")
        checked += 1
    assert checked >= 5

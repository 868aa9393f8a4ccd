"""The ingress replica's HTTP application in this process, without Ray: the real PrestoIngress
(toy tokenizer) and the app its replica serves (deployments/ingress_api.py), through Starlette's
test client. Everything a request meets before the sampling pool: the guard, routing errors, the
bearer token on every route, the body's bounds. Over Serve's proxy: tests/test_serve.py."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("ray")  # imported for its types and exceptions: no Ray is started
from starlette.testclient import TestClient  # noqa: E402

from deployments.ingress import PrestoIngress  # noqa: E402
from presto_ray.job import JobConfig  # noqa: E402

KEY = "test-secret"
TOY = {"engine": {"kind": "toy", "vocab_size": 48, "max_model_len": 512}, "sampler": {"block_size": 8, "mh_steps": 4}}
GUARDED_GETS = ("/docs", "/redoc", "/openapi.json", "/v1/models", "/v1/stats")
POSTS = ("/v1/completions", "/v1/chat/completions")
GOOD = {"model": "toy", "prompt": "hello", "max_tokens": 8, "seed": 1}


def ingress(serve: dict | None = None) -> PrestoIngress:
    # no pool: every answer these tests get comes before the ingress asks the pool for anything
    config = JobConfig.model_validate({**TOY, "serve": serve or {}})
    return PrestoIngress(config.model_dump(mode="json"), pool=None)


def client(serve: dict | None = None) -> TestClient:
    return TestClient(ingress(serve).asgi_app("replica-1"), raise_server_exceptions=True)


@pytest.fixture(autouse=True)
def no_key_from_the_environment(monkeypatch):
    monkeypatch.delenv("PRESTO_RAY_API_KEY", raising=False)


def error_of(response, status: int) -> dict:
    """`status` with OpenAI's error body (never Starlette's {"detail": ...}), tagged with the replica."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["x-presto-ingress-replica"] == "replica-1"
    body = response.json()
    assert set(body) == {"error"} and body["error"]["message"] and body["error"]["type"], body
    return body["error"]


def test_every_route_but_health_is_behind_the_key():
    http = client({"api_key": KEY})
    assert http.get("/health").json() == {"status": "ok"}
    for path in GUARDED_GETS:
        r = http.get(path)
        assert error_of(r, 401)["type"] == "invalid_api_key" and r.headers["www-authenticate"].startswith("Bearer"), path
    for path in POSTS:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": KEY}):
            assert error_of(http.post(path, json=GOOD, headers=headers), 401)["type"] == "invalid_api_key", (path, headers)
    for scheme in ("Bearer", "bearer", "BEARER"):
        r = http.get("/openapi.json", headers={"authorization": f"{scheme} {KEY}"})
        assert r.status_code == 200 and set(POSTS) <= set(r.json()["paths"]), scheme
    ok = {"authorization": f"Bearer {KEY}"}
    assert [m["id"] for m in http.get("/v1/models", headers=ok).json()["data"]] == ["toy"]
    assert http.get("/docs", headers=ok).status_code == 200 and http.get("/redoc", headers=ok).status_code == 200
    # past the token, the route's own checks: a form body is a 415, not a 401
    r = http.post("/v1/completions", content=json.dumps(GOOD), headers={**ok, "content-type": "text/plain"})
    assert "application/json" in error_of(r, 415)["message"]


def test_without_a_key_the_routes_are_open():
    http = client()
    assert http.get("/v1/models").status_code == 200 and http.get("/docs").status_code == 200
    assert "/v1/completions" in http.get("/openapi.json").json()["paths"]


def test_the_key_from_the_environment_wins(monkeypatch):
    monkeypatch.setenv("PRESTO_RAY_API_KEY", "from-env")
    http = client({"api_key": KEY})
    assert http.get("/v1/models", headers={"authorization": f"Bearer {KEY}"}).status_code == 401
    assert http.get("/v1/models", headers={"authorization": "Bearer from-env"}).status_code == 200


def test_the_schema_names_every_route_once():
    schema = client().get("/openapi.json").json()
    operations = {(path, method): op["operationId"] for path, item in schema["paths"].items() for method, op in item.items()}
    assert operations == {
        ("/health", "get"): "health_health_get",
        ("/v1/models", "get"): "models_v1_models_get",
        ("/v1/stats", "get"): "stats_v1_stats_get",
        ("/openapi.json", "get"): "openapi_openapi_json_get",
        ("/docs", "get"): "docs_docs_get",
        ("/redoc", "get"): "redoc_redoc_get",
        ("/v1/completions", "post"): "completions_v1_completions_post",
        ("/v1/chat/completions", "post"): "chat_completions_v1_chat_completions_post",
    }  # and no parameters from the token's dependency
    assert all("parameters" not in op for item in schema["paths"].values() for op in item.values())


def test_routing_errors_have_the_openai_shape_and_no_redirect():
    http = client()
    assert error_of(http.get("/v1/nothing-here"), 404)["type"] == "not_found_error"
    r = http.get("/v1/completions")
    error_of(r, 405)
    assert r.headers["allow"] == "POST"
    r = http.post("/v1/completions/", json=GOOD, headers={"host": "evil.example"}, follow_redirects=False)
    error_of(r, 404)
    assert "location" not in r.headers


def test_the_guard_bounds_headers_by_the_services_settings():
    """serve.max_headers and serve.max_header_bytes as configured (not the defaults), and a second
    Authorization is a 400."""
    http = client({"max_headers": 12, "max_header_bytes": 2048})
    few = [(f"x-h{i}", "v") for i in range(4)]
    assert http.get("/health", headers=few).status_code == 200
    assert "12" in error_of(http.get("/health", headers=[(f"x-h{i}", "v") for i in range(20)]), 431)["message"]
    assert "2048" in error_of(http.get("/health", headers={"x-big": "a" * 3000}), 431)["message"]
    assert error_of(client().get("/health", headers={"x-big": "a" * 20_000}), 431)  # the default: 16 KiB
    r = http.get("/v1/models", headers=[("authorization", "Bearer a"), ("authorization", "Bearer b")])
    assert "authorization" in error_of(r, 400)["message"]
    assert http.get("/health").headers["x-presto-ingress-replica"] == "replica-1"


def test_bodies_are_bounded_and_read_as_the_docs_say():
    http = client()
    headers = {"content-type": "application/json"}
    assert "limit" in error_of(http.post("/v1/completions", content=b"x" * 1_000_001, headers=headers), 413)["message"]
    assert "malformed JSON" in error_of(http.post("/v1/completions", content=b'{"prompt": "hi", ', headers=headers), 400)["message"]
    error = error_of(http.post("/v1/completions", content=b'{"prompt":"hi","max_tokens":-5,"max_tokens":8}', headers=headers), 400)
    assert "more than once" in error["message"]
    assert error_of(http.post("/v1/completions", json={**GOOD, "model": "gpt-4"}), 404)["param"] == "model"


def test_a_body_that_does_not_arrive_gets_a_408_and_closes_the_connection():
    """Content-Length: 100 and nothing sent: after serve.request_read_timeout_s, 408 with
    Connection: close (raw ASGI: a test client sends whole bodies)."""
    app = ingress({"request_read_timeout_s": 0.2}).asgi_app("replica-1")
    sent: list[dict] = []

    async def never() -> dict:
        await asyncio.Event().wait()
        return {}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/v1/completions", "raw_path": b"/v1/completions", "root_path": "", "query_string": b"",
        "headers": [(b"host", b"x"), (b"content-type", b"application/json"), (b"content-length", b"100")],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
    }  # fmt: skip
    asyncio.run(asyncio.wait_for(app(scope, never, send), 10))
    start, body = sent[0], b"".join(m.get("body", b"") for m in sent[1:])
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    assert start["status"] == 408 and headers["connection"] == "close" and headers["x-presto-ingress-replica"] == "replica-1"
    assert json.loads(body)["error"]["type"] == "timeout_error"


def test_a_coded_body_or_a_long_integer_is_refused_before_any_work():
    """Content-Encoding gzip on a plain JSON body was read (and sampled) as if it said nothing;
    a transfer coding llhttp passes on undecoded is a 501; a 5,000-digit integer was a 500."""
    import gzip

    http = client()
    plain = json.dumps(GOOD).encode()
    for coding, body in (("gzip", plain), ("gzip", gzip.compress(plain)), ("br", plain), ("identity, deflate", plain)):
        r = http.post("/v1/completions", content=body, headers={"content-type": "application/json", "content-encoding": coding})
        assert "Content-Encoding" in error_of(r, 415)["message"] and r.headers["accept-encoding"] == "identity", coding
    r = http.post("/v1/completions", content=plain, headers={"content-type": "application/json", "transfer-encoding": "gzip, chunked"})
    assert "Transfer-Encoding gzip" in error_of(r, 501)["message"]
    r = http.post("/v1/completions", content=b'{"prompt":"hi","max_tokens":' + b"9" * 5000 + b"}", headers={"content-type": "application/json"})
    assert error_of(r, 400)["param"] == "max_tokens"

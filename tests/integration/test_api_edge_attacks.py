"""Bodies and headers made to slip between the HTTP edge (``control.api.edge``, orjson) and the
framework's route (FastAPI, Python's ``json``), against a real API server and Redis of the test's
own (``_own_api``). Each is sent both ways (the edge's exact ``Content-Type``, and one with a
charset, which the framework's route answers) and must get the same answer:

- an integer beyond 64 bits keeps its value or is refused (orjson read it as a float: the edge
  stored a changed value while the framework's route failed with a 500);
- a body the stored JSON cannot hold (an integer beyond 64 bits, nesting over 254 levels, a lone
  surrogate) is refused with a 400 saying why, as are JSON's missing ``NaN``/``Infinity`` and a
  number beyond a double (both stored as ``null``), and nesting beyond the parser (a bare 400
  before the token check);
- each of them meets the token's check first (401, 429) and charges its rate once;
- an empty or repeated ``Idempotency-Key`` is refused (an empty one turned de-duplication off).
"""

from __future__ import annotations

import httpx
import redis

from control.client import ControlPlane
from control.errors import Refused
from tests.integration.test_api_fast_paths import FRAMEWORK, _agent, _answer, _own_api

EDGE = {"content-type": "application/json"}


def _body(agent: str, tail: bytes) -> bytes:
    """A turn request's JSON for ``agent`` whose last fields are ``tail`` (raw JSON, after a comma)."""
    return b'{"agent_id": "' + agent.encode() + b'", "input": "hello", ' + tail + b"}"


def _nested(depth: int) -> bytes:
    return _body_tail(b"[" * depth + b"]" * depth)


def _body_tail(value: bytes) -> bytes:
    return b'"metadata": {"n": ' + value + b"}"


# The bodies no turn may be stored from: (name, tail, what the 400's message says).
UNSTORABLE = [
    ("2**64", _body_tail(b"18446744073709551616"), "beyond 64 bits"),
    ("-2**63-1", _body_tail(b"-9223372036854775809"), "beyond 64 bits"),
    ("30 digits", _body_tail(b"123456789012345678901234567890"), "beyond 64 bits"),
    ("300 levels", _nested(300), "nested more than 254 levels"),
    ("3000 levels", _nested(3000), "not valid JSON: nested too deeply"),
    ("lone surrogate", b'"instructions": "x \\ud800 y"', "lone surrogate"),
    ("NaN", _body_tail(b"NaN"), "not valid JSON: NaN is not a JSON number"),
    ("-Infinity", _body_tail(b"-Infinity"), "not valid JSON: -Infinity is not a JSON number"),
    ("1e400", _body_tail(b"[1.5, 1e400]"), "not valid JSON: 1e400 is beyond a double's range"),
    ("empty key", b'"idempotency_key": ""', "idempotency key is empty"),
]


def _post(c: httpx.Client, body: bytes, headers: dict[str, str], **extra: str) -> httpx.Response:
    return c.post("/v1/turns", content=body, headers={**headers, **extra})


def test_integers_keep_their_value_both_ways_or_are_refused_alike():
    with _own_api() as (emb, srv):
        cp = ControlPlane(emb.control_url)
        agent = _agent()
        c = srv.client(srv.token([agent], rate=1000, burst=1000))
        assert c.post("/v1/turns", json={"agent_id": agent, "input": "hello"}).status_code == 201  # known now
        # The ends of the 64-bit range (orjson reads them exactly) and 19 digits in a string: stored as sent.
        for tail, field, value in (
            (_body_tail(b"18446744073709551615"), "metadata", {"n": 2**64 - 1}),
            (_body_tail(b"-9223372036854775808"), "metadata", {"n": -(2**63)}),
            (b'"instructions": "call 1234567890123456789"', "instructions", "call 1234567890123456789"),
        ):
            for how in (EDGE, FRAMEWORK):
                resp = _post(c, _body(agent, tail), how)
                assert resp.status_code == 201, resp.text
                stored = cp.stored_request(resp.json()["turn_id"])
                assert stored is not None
                got = stored[field] if field == "instructions" else {"n": stored["metadata"]["n"]}
                assert got == value and type(got) is type(value), (tail, how, got)
        # Beyond them: refused, the same answer both ways, nothing stored.
        r = redis.Redis.from_url(emb.control_url)
        count = r.llen("turns")
        for name, tail, said in UNSTORABLE[:3]:
            edge, framework = _post(c, _body(agent, tail), EDGE), _post(c, _body(agent, tail), FRAMEWORK)
            assert _answer(edge) == _answer(framework), (name, edge.text, framework.text)
            assert edge.status_code == 400 and said in edge.json()["error"]["message"], (name, edge.text)
        assert r.llen("turns") == count


def test_bodies_the_store_cannot_hold_are_refused_with_a_400_saying_why():
    with _own_api() as (emb, srv):
        r = redis.Redis.from_url(emb.control_url)
        agent = _agent()
        c = srv.client(srv.token([agent], rate=1000, burst=1000))
        assert c.post("/v1/turns", json={"agent_id": agent, "input": "hello"}).status_code == 201
        count = r.llen("turns")
        for name, tail, said in UNSTORABLE:
            edge, framework = _post(c, _body(agent, tail), EDGE), _post(c, _body(agent, tail), FRAMEWORK)
            assert _answer(edge) == _answer(framework), (name, edge.text, framework.text)
            error = edge.json()["error"]
            assert edge.status_code == 400 and error["type"] == "invalid_request", (name, edge.text)
            assert said in error["message"], (name, error)
        assert r.llen("turns") == count
        assert "Traceback" not in srv.log.read_text()  # nothing answered as a fault of the API

        # The Python client refuses them as the API does.
        cp = ControlPlane(emb.control_url)
        for request in (
            {"agent_id": agent, "input": "x", "metadata": {"n": 2**64}},
            {"agent_id": agent, "input": "x \ud800"},
            {"agent_id": agent, "input": "x", "idempotency_key": ""},
        ):
            try:
                cp.create(request)
            except Refused:
                continue
            raise AssertionError(f"created: {request}")
        assert r.llen("turns") == count


def test_the_token_is_checked_first_and_charged_once_for_every_refused_body():
    with _own_api() as (emb, srv):
        agent = _agent()
        anonymous = srv.client("atr_00000000_forged")
        refused = [(name, _body(agent, tail)) for name, tail, _ in UNSTORABLE]
        refused.append(("empty header", _body(agent, b'"metadata": {}')))
        for name, body in refused:
            for how in (EDGE, FRAMEWORK):
                extra = {"Idempotency-Key": ""} if name == "empty header" else {}
                resp = _post(anonymous, body, how, **extra)
                assert resp.status_code == 401, (name, how, resp.text)
        # An authenticated token: each refused body costs one request of its rate, once.
        allowed = 2 + 2 * len(refused) + 1
        c = srv.client(srv.token([agent], rate=0.001, burst=allowed))
        good = {"agent_id": agent, "input": "hello"}
        assert c.post("/v1/turns", json=good).status_code == 201  # the first sight
        assert c.post("/v1/turns", json=good).status_code == 201  # known: the edge's own script
        for name, body in refused:
            for how in (EDGE, FRAMEWORK):
                extra = {"Idempotency-Key": ""} if name == "empty header" else {}
                resp = _post(c, body, how, **extra)
                assert resp.status_code == 400, (name, how, resp.text)
        assert c.post("/v1/turns", json=good).status_code == 201  # the last one allowed
        # Over the rate now: every one of them is a 429 before its body's complaint.
        for name, body in refused:
            for how in (EDGE, FRAMEWORK):
                extra = {"Idempotency-Key": ""} if name == "empty header" else {}
                resp = _post(c, body, how, **extra)
                assert resp.status_code == 429, (name, how, resp.text)


def test_an_empty_or_repeated_idempotency_key_is_refused():
    with _own_api() as (emb, srv):
        r = redis.Redis.from_url(emb.control_url)
        agent = _agent()
        c = srv.client(srv.token([agent], rate=1000, burst=1000))
        body = _body(agent, b'"metadata": {}')
        assert _post(c, body, EDGE).status_code == 201
        count = r.llen("turns")
        for how in (EDGE, FRAMEWORK):
            resp = _post(c, body, how, **{"Idempotency-Key": ""})
            assert resp.status_code == 400 and resp.json()["error"]["param"] == "Idempotency-Key", resp.text
            resp = _post(c, _body(agent, b'"idempotency_key": ""'), how)
            assert resp.status_code == 400 and resp.json()["error"]["param"] == "idempotency_key", resp.text
            resp = c.post(
                "/v1/turns", content=body, headers=[*how.items(), ("Idempotency-Key", "a"), ("Idempotency-Key", "b")]
            )
            assert resp.status_code == 400 and "more than once" in resp.json()["error"]["message"], resp.text
        assert r.llen("turns") == count
        # One key, given once: de-duplicated as the documentation says.
        first = _post(c, body, EDGE, **{"Idempotency-Key": "once"})
        again = _post(c, body, FRAMEWORK, **{"Idempotency-Key": "once"})
        assert (first.status_code, again.status_code) == (201, 200)
        assert first.json()["turn_id"] == again.json()["turn_id"]


def test_other_encodings_and_types_of_body_get_clear_answers():
    with _own_api() as (emb, srv):
        agent = _agent()
        c = srv.client(srv.token([agent], rate=1000, burst=1000))
        body = _body(agent, b'"metadata": {}')
        assert _post(c, body, EDGE).status_code == 201
        # Not declared JSON: a 400 that says what to send, not "got bytes".
        for headers in ({"content-type": "text/plain"}, {}):
            resp = c.post("/v1/turns", content=body, headers=headers)
            assert resp.status_code == 400 and "Content-Type: application/json" in resp.json()["error"]["message"]
        # Bytes that are not text: invalid JSON, after the token's check.
        resp = _post(c, b'{"agent_id": "\xff\xfe"}', EDGE)
        assert resp.status_code == 400 and "not valid JSON" in resp.json()["error"]["message"], resp.text
        assert _post(srv.client("atr_00000000_forged"), b'{"agent_id": "\xff"}', EDGE).status_code == 401
        # A UTF-8 byte order mark: RFC 8259 lets a parser ignore it; both ways take the body.
        for how in (EDGE, FRAMEWORK):
            assert _post(c, b"\xef\xbb\xbf" + body, how).status_code == 201

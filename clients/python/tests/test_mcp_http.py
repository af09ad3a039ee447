"""`archivist mcp --listen` spoken to as raw HTTP, the way a generic
JSON-RPC client or an attacker does: `--stateless` answering each POST on
its own (no handshake, no session id, plain JSON when accepted); the bound
on stateful sessions (a flood of `initialize` cannot grow the process
without bound), sessions that close or expire making room again."""

from __future__ import annotations

import http.client
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from support import ArchivistServer, McpHttpServer

PROTOCOL = "2025-06-18"


class Raw:
    """POSTs JSON-RPC to one MCP endpoint, a connection a request (a server
    may close one after refusing a request whose body it did not read)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.path = parts.path
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port
        self.conn = self._connect()

    def _connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=30)

    def post(
        self, message: dict[str, Any], accept: str | None = "application/json, text/event-stream",
        session: str | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        headers = {"content-type": "application/json"}
        if accept is not None:
            headers["accept"] = accept
        if session is not None:
            headers["mcp-session-id"] = session
        self.conn.close()
        self.conn = self._connect()
        self.conn.request("POST", self.path, json.dumps(message).encode(), headers)
        response = self.conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()

    def post_bytes(
        self,
        body: bytes,
        content_type: str = "application/json",
        session: str | None = None,
        extra: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        """A POST of `body` as it is, however malformed."""
        headers = {"content-type": content_type, "accept": "application/json, text/event-stream"}
        if session is not None:
            headers["mcp-session-id"] = session
        headers.update(extra or {})
        self.conn.close()
        self.conn = self._connect()
        self.conn.request("POST", self.path, body, headers)
        response = self.conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()

    def delete(self, session: str) -> int:
        self.conn.close()
        self.conn = self._connect()
        self.conn.request("DELETE", self.path, headers={"mcp-session-id": session})
        response = self.conn.getresponse()
        response.read()
        return response.status

    def close(self) -> None:
        self.conn.close()


def initialize(id: int = 1) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0", "id": id, "method": "initialize",
        "params": {
            "protocolVersion": PROTOCOL, "capabilities": {},
            "clientInfo": {"name": "raw-test", "version": "0"},
        },
    }


def messages(headers: dict[str, str], body: bytes) -> list[dict[str, Any]]:
    """The JSON-RPC messages of an answer, plain JSON or SSE."""
    if headers.get("content-type", "").startswith("application/json"):
        return [json.loads(body)]
    found = []
    for line in body.decode().splitlines():
        if line.startswith("data:") and line[5:].strip():
            found.append(json.loads(line[5:]))
    return found


@pytest.fixture
def mcp_http(archivist_bin: Path, server: ArchivistServer) -> Iterator[Any]:
    started: list[McpHttpServer] = []

    def start(*flags: str) -> McpHttpServer:
        http_server = McpHttpServer(
            archivist_bin, ["mcp", "--server", f"http://{server.address}", *flags]
        ).start()
        started.append(http_server)
        return http_server

    yield start
    for http_server in started:
        assert http_server.stop() == 0, http_server.log_text()


def open_session(raw: Raw, id: int) -> str:
    status, headers, body = raw.post(initialize(id))
    assert status == 200, (status, body)
    [answer] = messages(headers, body)
    assert answer["result"]["serverInfo"]["name"] == "archivist"
    return headers["mcp-session-id"]


def test_a_flood_of_handshakes_meets_the_session_cap(mcp_http) -> None:
    """Issue 37: 20,000 `initialize` took the process from 16 to 1,060 MiB.
    By default 256 sessions may be open; the next handshake is refused
    with 503 and a JSON-RPC error naming the flag, while the open sessions
    go on working."""
    http_server = mcp_http()
    raw = Raw(http_server.url)
    sessions = [open_session(raw, i) for i in range(256)]
    assert len(set(sessions)) == 256
    for attempt in range(3):
        status, headers, body = raw.post(initialize(1000 + attempt))
        assert status == 503, (status, body)
        assert 1 <= int(headers["retry-after"]) <= 60
        error = json.loads(body)
        assert error["id"] == 1000 + attempt and error["error"]["code"] == -32000
        assert "256 sessions (--max-sessions)" in error["error"]["message"]
        assert "mcp-session-id" not in headers
    # An open session still answers.
    status, headers, body = raw.post(
        {"jsonrpc": "2.0", "id": 7, "method": "tools/list"}, session=sessions[0]
    )
    assert status == 200, body
    [answer] = messages(headers, body)
    assert "remember" in [t["name"] for t in answer["result"]["tools"]]
    # One closed frees one place, and only one.
    assert raw.delete(sessions[0]) in (200, 202, 204)
    open_session(raw, 2000)
    assert raw.post(initialize(2001))[0] == 503
    raw.close()
    assert "every session is taken" in http_server.log_text()


def test_idle_sessions_expire_and_make_room(mcp_http) -> None:
    http_server = mcp_http("--max-sessions", "2", "--session-idle", "1s")
    raw = Raw(http_server.url)
    first = open_session(raw, 1)
    open_session(raw, 2)
    assert raw.post(initialize(3))[0] == 503
    # Both go idle; within a generous bound (the code closes them after a
    # second) a handshake is taken again, and the first session is gone.
    deadline = time.monotonic() + 60
    while raw.post(initialize(4))[0] == 503:
        assert time.monotonic() < deadline, "no idle session expired"
        time.sleep(0.1)
    status, _, _ = raw.post({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}, session=first)
    assert status == 404
    raw.close()


def test_a_session_must_be_allowed_some_idle_time(archivist_bin: Path) -> None:
    import subprocess

    done = subprocess.run(
        [str(archivist_bin), "mcp", "--listen", "127.0.0.1:0", "--session-idle", "0s"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 64, done
    assert "some idle time" in done.stderr


def call(name: str, arguments: dict[str, Any], id: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


def test_stateless_answers_a_generic_json_rpc_client(mcp_http) -> None:
    """Issue 41: a harness's generic MCP adapter POSTs JSON-RPC accepting
    only JSON and never sends `initialize`. Stateful, that is 406 and then
    400 (no session id); `--stateless` answers each POST as plain JSON,
    with no session, and a tool error is still `isError` with the Failure."""
    session = f"raw-{uuid.uuid4().hex[:12]}"
    stateful = Raw(mcp_http().url)
    remember = call("remember", {"session_id": session, "messages": [{"role": "user", "content": "raw one"}]})
    assert stateful.post(remember, accept="application/json")[0] == 406
    assert stateful.post(remember)[0] == 400
    stateful.close()

    raw = Raw(mcp_http("--stateless").url)
    status, headers, body = raw.post(remember, accept="application/json")
    assert status == 200, body
    assert headers["content-type"].startswith("application/json")
    assert "mcp-session-id" not in headers
    answer = json.loads(body)
    assert answer["id"] == 1
    assert answer["result"]["structuredContent"]["stored"][0]["seq"] == 1
    assert answer["result"].get("isError") is not True

    # No Accept at all means anything: JSON.
    status, headers, body = raw.post(
        call("context", {"session_id": session}, id=2), accept=None
    )
    assert status == 200 and headers["content-type"].startswith("application/json")
    [item] = json.loads(body)["result"]["structuredContent"]["items"]
    assert item["content"] == "raw one"

    # A client that accepts only SSE gets its answer as an SSE event.
    status, headers, body = raw.post(call("list_sessions", {}, id=3), accept="text/event-stream")
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    [answer] = messages(headers, body)
    assert session in [s["session_id"] for s in answer["result"]["structuredContent"]["sessions"]]

    # Neither: refused, saying what it answers.
    status, _, body = raw.post(call("list_sessions", {}, id=4), accept="text/html")
    assert status == 406 and b"application/json or text/event-stream" in body

    # A tool error is a result with isError and the structured error.
    status, _, body = raw.post(call("context", {"session_id": "no such session!"}, id=5), accept="application/json")
    result = json.loads(body)["result"]
    assert status == 200 and result["isError"] is True
    assert result["structuredContent"]["error"]["code"] == "INVALID_ARGUMENT"

    # The handshake still works for clients that send it, and changes nothing.
    status, headers, body = raw.post(initialize(6), accept="application/json")
    assert status == 200 and "mcp-session-id" not in headers
    assert json.loads(body)["result"]["serverInfo"]["name"] == "archivist"
    raw.close()


@pytest.mark.parametrize("stateless", [True, False])
def test_a_body_that_is_no_json_rpc_message_is_answered_as_json_rpc_says(mcp_http, stateless: bool) -> None:
    """Issue 40: a malformed body was 415 Unsupported Media Type (the SDK's
    answer to any body it cannot read), though its Content-Type was
    right. JSON-RPC says -32700 for what is not JSON and -32600 for JSON
    that is no request, which MCP's HTTP transport sends as 400 with the
    error and no id; stateful and stateless alike, with a session too."""
    raw = Raw(mcp_http(*(["--stateless"] if stateless else [])).url)
    session = None if stateless else open_session(raw, 1)
    for sent in [None, session]:
        status, headers, body = raw.post_bytes(b'{"jsonrpc": "2.0", "id": 1, "method":', session=sent)
        assert status == 400 and headers["content-type"].startswith("application/json"), body
        answer = json.loads(body)
        assert (answer["jsonrpc"], answer["id"], answer["error"]["code"]) == ("2.0", None, -32700)
        assert answer["error"]["message"].startswith("Parse error")
        for not_a_request in [b'{"hello": "world"}', b"[]", b"42"]:
            status, _, body = raw.post_bytes(not_a_request, session=sent)
            assert status == 400, (not_a_request, body)
            assert json.loads(body)["error"]["code"] == -32600, body
        # What the SDK answers rightly stays its answer: a body declared
        # as something else, and a method no one has.
        assert raw.post_bytes(b"{}", content_type="text/plain", session=sent)[0] == 415
        # The guard against DNS rebinding answers first, whatever the body.
        for body in [b"{}", b"not json"]:
            status, _, answer = raw.post_bytes(body, session=sent, extra={"host": "evil.example"})
            assert status == 403, answer
    status, headers, body = raw.post_bytes(
        b'{"jsonrpc": "2.0", "id": 9, "method": "no/such"}', session=session
    )
    assert status == 200, body
    [answer] = messages(headers, body)
    assert (answer["id"], answer["error"]["code"]) == (9, -32601)
    # A well-formed call still works after all that.
    status, headers, body = raw.post(call("list_sessions", {}, id=10), session=session)
    assert status == 200, body
    [answer] = messages(headers, body)
    assert "sessions" in answer["result"]["structuredContent"]
    raw.close()


@pytest.mark.parametrize("stateless", [True, False])
def test_a_body_over_the_cap_is_answered_as_json_rpc(mcp_http, stateless: bool) -> None:
    """Issue 40's leftovers: a body over the 4 MiB cap was 413 with a
    plain-text body, where every other refusal of this layer is a
    JSON-RPC error a client can parse. Still 413, now with the error (no
    id: the body was never read) naming the cap; with a session too."""
    raw = Raw(mcp_http(*(["--stateless"] if stateless else [])).url)
    session = None if stateless else open_session(raw, 1)
    cap = 4 * 1024 * 1024
    # JSON to the last byte, one byte past the cap.
    padding = cap + 1 - len(b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": ""}}')
    big = b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": "' + b"x" * padding + b'"}}'
    assert len(big) == cap + 1
    for sent in [None, session]:
        status, headers, body = raw.post_bytes(big, session=sent)
        assert status == 413, body[:200]
        assert headers["content-type"].startswith("application/json"), headers
        answer = json.loads(body)
        assert (answer["jsonrpc"], answer["id"], answer["error"]["code"]) == ("2.0", None, -32600)
        assert f"{cap} bytes (4 MiB)" in answer["error"]["message"], answer
    # At the cap, the body is read (and this one is a fine ping).
    fits = big[:100] + big[101:]
    assert len(fits) == cap
    status, headers, body = raw.post_bytes(fits, session=session)
    assert status == 200, body[:200]
    [answer] = messages(headers, body)
    assert answer["id"] == 1 and "result" in answer
    raw.close()


RESPONSES = [
    {"jsonrpc": "2.0", "id": 3, "result": {}},
    {"jsonrpc": "2.0", "id": "sampling-4", "error": {"code": -1, "message": "declined"}},
]
NOTIFICATIONS = [
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 5}},
]


@pytest.mark.parametrize("stateless", [True, False])
def test_a_response_or_notification_is_accepted_with_no_body(mcp_http, stateless: bool) -> None:
    """MCP's streamable HTTP: a POST of a JSON-RPC response or notification
    the server accepts is 202 Accepted with no body. Stateful (in a
    session) did so; `--stateless` answered a response 400 with an error
    that had no id. Both now agree, whatever the client accepts."""
    raw = Raw(mcp_http(*(["--stateless"] if stateless else [])).url)
    session = None if stateless else open_session(raw, 1)
    for message in [*RESPONSES, *NOTIFICATIONS]:
        status, headers, body = raw.post(message, session=session)
        assert (status, body) == (202, b""), (message, status, body)
        if stateless:
            # A generic JSON-RPC client accepting only JSON, or naming nothing.
            for accept in ["application/json", None]:
                status, _, body = raw.post(message, accept=accept)
                assert (status, body) == (202, b""), (message, accept, status, body)
    # A protocol version the server does not know is refused alike.
    for message in [*RESPONSES, *NOTIFICATIONS]:
        body = json.dumps(message).encode()
        status, _, answer = raw.post_bytes(
            body, session=session, extra={"mcp-protocol-version": "1999-01-01"}
        )
        assert (status, answer) == (400, b"Bad Request: Unsupported MCP-Protocol-Version: 1999-01-01")
        status, _, answer = raw.post_bytes(
            body, session=session, extra={"mcp-protocol-version": PROTOCOL}
        )
        assert (status, answer) == (202, b""), (message, answer)
    # The server still answers its own requests afterwards.
    status, headers, body = raw.post(call("list_sessions", {}, id=10), session=session)
    assert status == 200, body
    [answer] = messages(headers, body)
    assert answer["id"] == 10 and "sessions" in answer["result"]["structuredContent"]
    raw.close()

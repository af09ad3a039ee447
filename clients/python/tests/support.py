"""Test helpers: the real archivist binary in a subprocess, a fake
OpenAI-compatible provider, and a bounded poll."""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# The NAME of the variable holding the fake provider's key. Not ARCHIVIST_*:
# the server refuses ARCHIVIST_ variables that name no configuration key.
KEY_ENV = "FAKE_PROVIDER_KEY"
SECRET_KEY = "sk-archivist-test-key-0123456789abcdef"


class _Child:
    """A binary of ours in a subprocess: its stderr read to the end (so it
    never blocks on a full pipe) and kept as its log, and what its start-up
    line reports (where it serves) handed back."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.process: subprocess.Popen[str] | None = None

    def _spawn(
        self,
        argv: list[str],
        env: dict[str, str],
        reported: Callable[[str], str | None],
        what: str,
        startup_timeout: float,
    ) -> str:
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        found: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._drain, args=(found, reported), daemon=True).start()
        try:
            value = found.get(timeout=startup_timeout)
        except queue.Empty:
            value = None
        if value is None:
            self.stop()
            raise RuntimeError(f"{what}; its log:\n" + "\n".join(self.log[-40:]))
        return value

    def _drain(self, found: queue.Queue[str | None], reported: Callable[[str], str | None]) -> None:
        assert self.process is not None and self.process.stderr is not None
        done = False
        for line in self.process.stderr:
            self.log.append(line.rstrip("\n"))
            if not done:
                value = reported(line)
                if value is not None:
                    found.put(value)
                    done = True
        if not done:
            found.put(None)

    def stop(self) -> int | None:
        """Ends the process (SIGTERM, then SIGKILL after 20 s) and says how
        it exited; None when it never started."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        return self.process.returncode

    def log_text(self) -> str:
        return "\n".join(self.log)


class ArchivistServer(_Child):
    """`archivist serve` on 127.0.0.1 and a port of its own choosing (read
    back from its start-up line), with a fresh data directory."""

    def __init__(
        self,
        binary: Path,
        workdir: Path,
        config: str = "",
        env: dict[str, str] | None = None,
        listen: str = "127.0.0.1:0",
    ) -> None:
        super().__init__()
        self.binary = binary
        self.workdir = workdir
        self.config = config
        self.extra_env = env or {}
        # Port 0 lets the server choose; a fixed one lets a test restart it
        # where its clients already point.
        self.listen = listen
        self.address = ""

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def start(self, startup_timeout: float = 30.0) -> ArchivistServer:
        data_dir = self.workdir / "data"
        data_dir.mkdir(parents=True, exist_ok=True)
        config_file = self.workdir / "archivist.toml"
        config_file.write_text(self.config, encoding="utf-8")
        # Only what this test says: no ARCHIVIST_* from the caller's shell.
        env = clean_env({"RUST_LOG": "info", **self.extra_env})
        argv = [
            str(self.binary),
            "serve",
            "--listen",
            self.listen,
            "--data-dir",
            str(data_dir),
            "--config",
            str(config_file),
        ]

        def address(line: str) -> str | None:
            if "archivist is serving" in line and "listen=" in line:
                return line.split("listen=", 1)[1].split()[0]
            return None

        self.address = self._spawn(
            argv, env, address, "archivist did not report its listen address", startup_timeout
        )
        self._wait_for_port(startup_timeout)
        return self

    def _wait_for_port(self, limit: float) -> None:
        host, port = self.address.rsplit(":", 1)
        end = time.monotonic() + limit
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > end:
                    raise RuntimeError(f"archivist is not accepting on {self.address}")
                time.sleep(0.02)


def free_port() -> int:
    """A port nothing listens on now (the OS's choice, released at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any ARCHIVIST_* from the caller's
    shell, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARCHIVIST_")}
    env.update(extra or {})
    return env


class McpHttpServer(_Child):
    """`archivist mcp --listen 127.0.0.1:0` in a subprocess: the URL of its
    streamable HTTP endpoint, read back from its start-up line."""

    def __init__(self, binary: Path, args: list[str], env: dict[str, str] | None = None) -> None:
        super().__init__()
        self.binary = binary
        self.args = args
        self.env = env or {}
        self.url = ""

    def start(self, startup_timeout: float = 30.0) -> McpHttpServer:
        def url(line: str) -> str | None:
            if "archivist mcp is serving at " in line:
                return line.split("serving at ", 1)[1].strip()
            return None

        self.url = self._spawn(
            [str(self.binary), *self.args, "--listen", "127.0.0.1:0"],
            clean_env(self.env),
            url,
            "archivist mcp did not report its URL",
            startup_timeout,
        )
        return self


Reply = tuple[int, dict[str, str], bytes]


def completion(text: str = "A recap of the segment.", model: str = "fake-model") -> Reply:
    body = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5},
    }
    return 200, {"content-type": "application/json"}, json.dumps(body).encode()


def error(status: int, message: str, code: str = "") -> Reply:
    body = {"error": {"message": message, "type": "api_error", "code": code or None}}
    return status, {"content-type": "application/json"}, json.dumps(body).encode()


class FakeProvider:
    """An OpenAI-compatible chat-completions endpoint in a thread. `reply`
    decides each answer; every request is recorded (and counted)."""

    def __init__(self, reply: Callable[[], Reply] = completion) -> None:
        self.reply = reply
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                with provider._lock:
                    provider.requests.append(
                        {
                            "path": self.path,
                            "authorization": self.headers.get("authorization"),
                            "body": json.loads(raw or b"{}"),
                        }
                    )
                status, headers, body = provider.reply()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        port = self._http.server_address[1]
        return f"http://127.0.0.1:{port}/v1"

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()


class FakeEmbedder:
    """An OpenAI-compatible /v1/embeddings endpoint in a thread whose
    vectors are set by hand: each word of `axes` pulls a text along its
    axis, and every text has a small constant on the last one (so none is
    zero). `vector()` is what it answers for a text."""

    def __init__(self, axes: dict[str, int], dims: int) -> None:
        self.axes = axes
        self.dims = dims
        embedder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("content-length") or 0)
                inputs = json.loads(self.rfile.read(length) or b"{}")["input"]
                body = json.dumps(
                    {
                        "object": "list",
                        "data": [
                            {"object": "embedding", "index": i, "embedding": embedder.vector(t)}
                            for i, t in enumerate(inputs)
                        ],
                    }
                ).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()

    def vector(self, text: str) -> list[float]:
        v = [0.0] * self.dims
        v[-1] = 0.1
        word = ""
        for c in text.lower() + " ":
            if c.isalnum():
                word += c
                continue
            if word in self.axes:
                v[self.axes[word]] += 1.0
            word = ""
        return v

    def cosine(self, a: str, b: str) -> float:
        x, y = self.vector(a), self.vector(b)
        dot = sum(p * q for p, q in zip(x, y))
        return dot / (sum(p * p for p in x) ** 0.5 * sum(q * q for q in y) ** 0.5)

    def config(self) -> str:
        """Server configuration embedding through this endpoint."""
        port = self._http.server_address[1]
        return f"""
[embedding]
kind = "openai"
base_url = "http://127.0.0.1:{port}/v1"
model = "axes"

[reconciler]
interval = "100ms"
"""

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()


def openai_config(base_url: str, max_attempts: int = 3) -> str:
    """Server configuration for a provider at `base_url`, with retry waits
    and ceilings small enough for tests."""
    return f"""
[provider]
kind = "openai"
base_url = "{base_url}"
model = "fake-model"
api_key_env = "{KEY_ENV}"
# No start-up check: the tests count every request the provider gets.
check_on_start = false

[retry]
max_attempts = {max_attempts}
initial_backoff = "10ms"
max_backoff = "50ms"
attempt_timeout = "2s"
pass_ceiling = "5s"

[reconciler]
interval = "200ms"
"""


def eventually(check: Callable[[], bool], limit: float = 10.0, every: float = 0.02) -> bool:
    """Polls `check` until it holds or `limit` seconds pass (bounded)."""
    end = time.monotonic() + limit
    while True:
        if check():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(every)


async def eventually_async(
    check: Callable[[], Any], limit: float = 10.0, every: float = 0.02
) -> bool:
    """`eventually` for an async check."""
    import asyncio

    end = time.monotonic() + limit
    while True:
        if await check():
            return True
        if time.monotonic() >= end:
            return False
        await asyncio.sleep(every)


class JsonRpcClient:
    """A generic MCP client, as a benchmark harness's adapter is: each call
    one POST of JSON-RPC accepting only `application/json`, with no
    `initialize` and no session id. It answers as `mcp.Client` does (the
    SDK's own result types), so the same tool tests drive it."""

    def __init__(self, url: str) -> None:
        import httpx

        self.url = url
        self.http = httpx.AsyncClient(timeout=60)
        self.next_id = 0
        # Known only from a handshake, which this client never makes.
        self.server_info = None
        self.instructions = None

    async def __aenter__(self) -> JsonRpcClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()

    async def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        response = await self.http.post(
            self.url,
            json={"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params},
            headers={"accept": "application/json"},
        )
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("application/json")
        answer = response.json()
        assert answer["id"] == self.next_id and "error" not in answer, answer
        return dict(answer["result"])

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> Any:
        from mcp.types import CallToolResult

        result = await self._call("tools/call", {"name": name, "arguments": arguments or {}})
        return CallToolResult.model_validate(result)

    async def list_tools(self) -> Any:
        from mcp.types import ListToolsResult

        return ListToolsResult.model_validate(await self._call("tools/list", {}))

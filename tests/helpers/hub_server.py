"""A real HTTP server on 127.0.0.1 that speaks the PAW API's paths, for end-to-end hub tests.

Two instances make two origins: the API, and a "CDN" that serves redirected program archives and base
weights (with HTTP Range support). Every request is recorded; knobs inject 202s, 429s, 500s and dropped
connections.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


@dataclass
class Recorded:
    origin: str
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class HubState:
    """What the server knows and how it misbehaves."""

    programs: dict[str, bytes] = field(default_factory=dict[str, bytes])
    slugs: dict[str, str] = field(default_factory=dict[str, str])
    runtimes: dict[str, dict[str, object]] = field(default_factory=dict[str, dict[str, object]])
    files: dict[str, bytes] = field(default_factory=dict[str, bytes])
    compiled: dict[str, str] = field(default_factory=dict[str, str])
    pending_202: set[str] = field(default_factory=set[str])
    always_202: bool = False
    jobs: dict[str, str] = field(default_factory=dict[str, str])
    fail_once: dict[str, int] = field(default_factory=dict[str, int])
    drop_file_after: dict[str, int] = field(default_factory=dict[str, int])
    redirect_downloads_to: str | None = None
    requests: list[Recorded] = field(default_factory=list[Recorded])
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, pattern: str, method: str = "GET") -> int:
        """Requests whose (still percent-encoded) path matches `pattern`."""
        with self.lock:
            return sum(1 for r in self.requests if r.method == method and re.search(pattern, r.path))

    def snapshot(self) -> list[Recorded]:
        with self.lock:
            return list(self.requests)


class _Handler(BaseHTTPRequestHandler):
    body: dict[str, object]

    @property
    def hub(self) -> _Server:
        assert isinstance(self.server, _Server)
        return self.server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
        pass

    def _json(self, status: int, body: object, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> str:
        path = urlsplit(self.path).path  # still percent-encoded, as sent
        with self.hub.state.lock:
            self.hub.state.requests.append(Recorded(self.hub.name, self.command, path, {k.lower(): v for k, v in self.headers.items()}))
        return path

    def _injected_failure(self, path: str) -> bool:
        state = self.hub.state
        with state.lock:
            for prefix in list(state.fail_once):
                if path.startswith(prefix):
                    status = state.fail_once.pop(prefix)
                    break
            else:
                return False
        self._json(status, {"detail": f"injected {status}"}, {"Retry-After": "0"} if status == 429 else None)
        return True

    def do_GET(self) -> None:  # noqa: N802 - BaseHTTPRequestHandler's name
        path = self._record()
        if self._injected_failure(path):
            return
        self.hub.route(self, "GET", path)

    def do_POST(self) -> None:  # noqa: N802
        path = self._record()
        length = int(self.headers.get("Content-Length") or 0)
        loaded: dict[str, object] = json.loads(self.rfile.read(length) or b"{}")
        self.body = loaded
        if self._injected_failure(path):
            return
        self.hub.route(self, "POST", path)

    def do_DELETE(self) -> None:  # noqa: N802
        path = self._record()
        self.hub.route(self, "DELETE", path)

    def send_file(self, data: bytes, name: str) -> None:
        state = self.hub.state
        start = 0
        match = re.match(r"bytes=(\d+)-", self.headers.get("Range") or "")
        if match:
            start = int(match.group(1))
            if start >= len(data):
                self._json(416, {"detail": "range not satisfiable"})
                return
        body = data[start:]
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(body)))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        with state.lock:
            drop = state.drop_file_after.pop(name, None)
        if drop is not None:
            self.wfile.write(body[:drop])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)  # the connection dies mid-file
            return
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: HubState, name: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = state
        self.name = name

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def route(self, handler: _Handler, method: str, path: str) -> None:
        state = self.state
        api = "/api/v1/"
        hugging_face = re.fullmatch(r"/[^/]+/[^/]+/resolve/[^/]+/([^/]+)", path)  # a Hugging Face repo's file URL
        if path.startswith("/files/") or hugging_face:
            name = hugging_face.group(1) if hugging_face else path.removeprefix("/files/")
            if name in state.files:
                handler.send_file(state.files[name], name)
            else:
                handler._json(404, {"detail": "no such file"})  # pyright: ignore[reportPrivateUsage]
            return
        if not path.startswith(api):
            handler._json(404, {"detail": "not found"})  # pyright: ignore[reportPrivateUsage]
            return
        parts = [unquote(p) for p in path.removeprefix(api).split("/")]
        respond = handler._json  # pyright: ignore[reportPrivateUsage]
        if method == "POST" and parts == ["compile"]:
            spec = str(handler.body.get("spec", ""))
            if spec in state.compiled:
                slug = handler.body.get("slug")
                if isinstance(slug, str):  # published: the slug now resolves to the program, as on the hub
                    state.slugs[slug] = state.compiled[spec]
                respond(200, {"program_id": state.compiled[spec], "status": "ready", "compiler_snapshot": "tiny"})
            else:
                respond(422, {"detail": "spec is too short or unknown to this test server"})
        elif method == "POST" and parts == ["compile", "precheck"]:
            spec = str(handler.body.get("spec", ""))
            respond(200, {"cached": spec in state.compiled, "program_id": state.compiled.get(spec), "queue_length": 0})
        elif method == "POST" and parts == ["compile", "async"]:
            spec = str(handler.body.get("spec", ""))
            job = f"job-{len(state.jobs) + 1}"
            state.jobs[job] = "queued"
            respond(202, {"job_id": job, "status": "queued", "program_id": state.compiled.get(spec), "queue_position": 1})
        elif parts[:1] == ["compile"] and len(parts) == 2 and parts[1] in state.jobs:
            if method == "DELETE":
                state.jobs[parts[1]] = "cancelled"
            respond(200, {"job_id": parts[1], "status": state.jobs[parts[1]]})
        elif method == "GET" and len(parts) == 3 and parts[0] == "programs" and parts[2] == "versions":
            program_id = state.slugs.get(parts[1])
            if program_id is None:
                respond(404, {"detail": "slug not found"})
            else:
                respond(200, {"slug": parts[1], "main_version": 1, "versions": [{"version": 1, "program_id": program_id, "is_main": True}]})
        elif method == "GET" and parts == ["programs"]:
            if handler.headers.get("X-API-Key") != "secret-key":
                respond(401, {"detail": "authentication required"})
            else:
                respond(
                    200, {"programs": [{"id": i, "spec": "tiny"} for i in state.programs], "total": len(state.programs), "page": 1, "per_page": 20}
                )
        elif method == "GET" and parts[:2] == ["programs", "resolve"]:
            ref = "/".join(parts[2:])
            if ref in state.slugs:
                respond(200, {"program_id": state.slugs[ref]})
            else:
                respond(404, {"detail": f"program {ref} not found"})
        elif method == "GET" and len(parts) == 3 and parts[0] == "programs" and parts[2] == "download":
            program_id = parts[1]
            with state.lock:
                pending = program_id in state.pending_202 or state.always_202
                state.pending_202.discard(program_id)
            if pending:
                respond(202, {"status": "generating"}, {"Retry-After": "0"})
            elif program_id not in state.programs:
                respond(404, {"detail": "program not found"})
            elif state.redirect_downloads_to:
                handler.send_response(302)
                handler.send_header("Location", f"{state.redirect_downloads_to}/files/{program_id}.paw")
                handler.send_header("Content-Length", "0")
                handler.end_headers()
            else:
                handler.send_file(state.programs[program_id], f"{program_id}.paw")
        elif method == "GET" and parts[:2] == ["models", "runtimes"] and len(parts) == 3:
            if parts[2] in state.runtimes:
                respond(200, state.runtimes[parts[2]])
            else:
                respond(404, {"detail": "runtime not found"})
        elif method == "GET" and parts == ["models", "compilers"]:
            respond(200, {"compilers": [{"name": "paw-4b-qwen3-0.6b"}, {"name": "paw-4b-gpt2"}]})
        elif method == "GET" and len(parts) == 2 and parts[0] == "programs":
            program_id = state.slugs.get(parts[1], parts[1])
            if program_id in state.programs:
                respond(
                    200,
                    {
                        "id": program_id,
                        "spec": "tiny test program",
                        "interpreter": "Qwen/Qwen3-0.6B",
                        "aliases": sorted(s for s, i in state.slugs.items() if i == program_id),
                    },
                )
            else:
                respond(404, {"detail": "program not found"})
        else:
            respond(404, {"detail": "no such endpoint"})


class HubServer:
    """An API server and a CDN server sharing one state, running in background threads."""

    def __init__(self) -> None:
        self.state = HubState()
        self._api = _Server(self.state, "api")
        self._cdn = _Server(self.state, "cdn")
        self._threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (self._api, self._cdn)]
        for thread in self._threads:
            thread.start()

    def serve_runtime(self, runtime_id: str, interpreter: str, base: bytes, file_name: str) -> None:
        """A runtime manifest whose base weights (`base`, as `file_name`) the CDN serves, with their size and sha256."""
        base_model = {"provider": None, "repo": None, "file": file_name, "url": f"{self.cdn_url}/files/{file_name}", "size_bytes": len(base)}
        base_model["sha256"] = hashlib.sha256(base).hexdigest()
        self.state.runtimes[runtime_id] = {
            "runtime_id": runtime_id,
            "manifest_version": 1,
            "interpreter": interpreter,
            "adapter_format": "gguf_lora",
            "local_sdk": {"supported": True, "n_ctx": 2048, "base_model": base_model},
        }
        self.state.files[file_name] = base

    def serve_program(self, program_id: str, archive: bytes) -> None:
        """A program's `.paw` archive, by id and as a CDN file."""
        self.state.programs[program_id] = archive
        self.state.files[f"{program_id}.paw"] = archive

    @property
    def api_url(self) -> str:
        return self._api.url

    @property
    def cdn_url(self) -> str:
        return self._cdn.url

    def close(self) -> None:
        for server in (self._api, self._cdn):
            server.shutdown()
            server.server_close()

"""``rlhf-jax label RUN_DIR``: the web page where people compare clips and mark moments.

A Starlette (ASGI) app served by uvicorn over the run's label store
(:mod:`rlhf_jax.feedback.store`); it keeps no state of its own, so it can be stopped and
started again at any time, and several people can label at once.

Pages: ``/compare`` (two looping clips side by side; Christiano et al. appendix B) and
``/annotate`` (one episode on a scrubbable timeline, with progress and regress marks; the
IBT paper's appendix A.1). JSON API:

=====================================  ====================================================
``GET  /api/status?who=``              answered and waiting queries of each kind: how many
                                       are free for ``who``, and who else holds which, until when
``POST /api/next``                     ``{kind, who}``: the query to show ``who`` (or null)
``POST /api/queries/{id}/hold``        ``{who}``: the page still shows it (sent every few seconds)
``POST /api/queries/{id}/answer``      ``{choice, who, seconds}``: left, right, tie, cant_tell
``POST /api/queries/{id}/marks``       ``{marks: [{step, sign}], who, seconds}``
``GET  /clips/{name}``                 a clip (byte ranges served, so videos can seek)
=====================================  ====================================================

Errors: 404 for an unknown query or clip, 400 for a malformed answer (nothing is stored);
answering a query a second time stores nothing and returns the answer that stands. Clip
names must look like ``q12_0.mp4``, so no name can reach a file outside the run's
``clips/`` folder. :class:`Guard` decides which requests reach these at all, and
:class:`Limits` how much of the server one client can hold.
"""
from __future__ import annotations

import asyncio
import errno
import functools
import hmac
import html
import itertools
import json
import os
import re
import secrets
import socket
import sqlite3
from importlib import resources
from pathlib import Path
from typing import NamedTuple

from rlhf_jax.extras import WEB_APP_MODULES, require

# The page's server: the people extra. Without it `rlhf-jax label` stops in one line saying so.
require("the labeling web page (rlhf-jax label)", "people", *WEB_APP_MODULES)

import h11  # noqa: E402
import uvicorn  # noqa: E402
from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from uvicorn.protocols.http.h11_impl import H11Protocol

from rlhf_jax.config_base import build, read_run_config
from rlhf_jax.errors import ConfigError, RunError
from rlhf_jax.feedback.config import PeopleConfig
from rlhf_jax.feedback.labeler import CLIPS_DIR
from rlhf_jax.feedback.store import STORE_FILE, BadAnswer, Counts, LabelStore, UnknownQuery
from rlhf_jax.reward.kinds import KINDS, PREFERENCES, FeedbackKind, feedback_kind, kind_named

CLIP_NAME = re.compile(r"q\d{1,12}_\d\.mp4")
TOKEN_COOKIE = "rlhf_jax_token"
SECRET_FILE = "label_secret"  # in the run directory
SECRET_HEADER = "X-Label-Secret"
MAX_BODY = 64 * 1024  # bytes; an answer is well under 1 KiB, an episode's marks a few KiB
STATIC = resources.files("rlhf_jax.feedback") / "static"
PORTS = range(0, 65536)  # 0: any free port
LOOPBACK = ("127.0.0.1", "localhost", "::1")
WILDCARD = ("0.0.0.0", "::", "")
# On every response: no page of ours inside another site's frame, nothing run or loaded
# but our own files, no type guessed from content, no address of ours sent elsewhere.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; media-src 'self'; "
                               "img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; "
                               "frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def run_secret(run_dir: Path) -> str:
    """The run's page secret, made on first use and kept in ``run_dir`` (readable by its owner
    only, who can write ``labels.sqlite`` anyway): a restarted server keeps it, so pages left
    open go on working, as they did before there was a secret. No secret, no writes: an empty
    secret file (a write cut short) stops the server with a :class:`ConfigError`."""
    path = run_dir / SECRET_FILE
    if not path.exists():
        _make_secret(path)
    secret = path.read_text().strip()
    if not secret:
        raise ConfigError(f"{path} is empty (its write was cut short): delete it, and the server makes a new one "
                          "when it starts (then reload any label page left open)")
    return secret


def _make_secret(path: Path) -> None:
    """A new secret at ``path``, whole and on disk (its bytes, then its name, synced) before
    anyone uses it: unsynced, a power loss could leave the name with no bytes behind it."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as file:
            file.write(secrets.token_urlsafe(32))
            file.flush()
            os.fsync(file.fileno())
        try:
            os.link(partial, path)  # never replaces the secret of a server that started meanwhile
        except FileExistsError:
            return
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    finally:
        partial.unlink(missing_ok=True)


def allowed_hosts(host: str, port: int) -> frozenset[str] | None:
    """The ``Host`` headers a server bound to ``host:port`` answers to: that address, and any
    loopback name for a loopback address; ``None`` (any) for a wildcard address, whose names
    are not known here (the token, which such a server requires, keeps others out)."""
    if host in WILDCARD:
        return None
    names = ("127.0.0.1", "localhost", "[::1]") if host in LOOPBACK else (f"[{host}]" if ":" in host else host,)
    ports = (f":{port}", "") if port == 80 else (f":{port}",)  # a browser leaves out port 80
    return frozenset(name.lower() + suffix for name in names for suffix in ports)


def _counts_json(counts: Counts) -> dict:
    return {"answered": counts.answered, "waiting": counts.waiting, "for_you": counts.for_you,
            "held_by_others": [{"who": who, "expires_in_s": round(s, 1)} for who, s in counts.held_by_others]}


def _query_json(row) -> dict:
    return {"id": row.id, "kind": row.kind, "clips": [f"/clips/{name}" for name in row.clips],
            "frames": row.frames, "fps": row.fps}


def _answer_json(row) -> dict:
    return {"query_id": row.query_id, "choice": row.choice, "who": row.who, "answered_at": row.answered_at,
            "seconds": row.seconds, **kind_named(row.kind).answer_details(row.marks)}


async def _json_body(request: Request) -> dict:
    try:
        body = json.loads(await request.body())
    except RecursionError:  # the parser's own guard: "[[[[..." deeper than the interpreter's stack
        raise BadAnswer("the body is nested too deeply") from None
    except ValueError:  # not JSON, or not UTF-8 (NaN and Infinity parse: check_seconds refuses them)
        raise BadAnswer("the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise BadAnswer("the body must be a JSON object")
    return body


def _field(body: dict, name: str, kind, required: bool = True):
    value = body.get(name)
    if value is None:  # absent, or null: as the server itself returns an answer's unknown time
        if required:
            raise BadAnswer(f"missing field {name!r}")
        return None
    # bool is an int in Python: never accept true/false for a number.
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise BadAnswer(f"field {name!r} has the wrong type: {value!r}")
    return value


def _query_id(request: Request) -> int:
    """The query id in the path: digits, no more of them than a 64-bit id has (the store refuses
    ids past 64 bits; ``int()`` refuses a number of over 4,300 digits)."""
    text = request.path_params["query_id"]
    if not (text.isascii() and text.isdigit() and len(text) <= 20):
        raise UnknownQuery(text if len(text) <= 20 else f"{text[:20]}...")
    return int(text)


def create_app(run_dir: str | Path, people: PeopleConfig = PeopleConfig(), token: str | None = None,
               default_page: str = PREFERENCES.name, host: str = "127.0.0.1", port: int = 8000) -> Starlette:
    """The labeling app over ``run_dir``'s label store (created if training has not yet), for a
    server bound to ``host:port``: a page for each kind of feedback, at ``/<its name>``
    (``default_page``: where ``/`` leads)."""
    run_dir = Path(run_dir).resolve()
    store = LabelStore(run_dir / STORE_FILE, people)
    clips_dir = run_dir / CLIPS_DIR
    secret = run_secret(run_dir)

    def page(kind: FeedbackKind):
        template = (STATIC / f"{kind.name}.html").read_text()

        async def endpoint(request: Request):
            text = (template.replace("{{title}}", html.escape(kind.page_title))
                    .replace("{{instruction}}", html.escape(people.instruction_for(kind)))
                    .replace("{{secret}}", html.escape(secret))
                    .replace("{{renew_s}}", f"{people.heartbeat_timeout_s / 4:g}"))
            response = HTMLResponse(text)
            if token is not None and request.query_params.get("token") == token:
                response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
            return response

        return endpoint

    async def home(request: Request):
        query = f"?{request.url.query}" if request.url.query else ""
        return RedirectResponse(f"/{default_page}{query}")

    async def status(request: Request):
        who = request.query_params.get("who")
        return JSONResponse({kind.name: _counts_json(store.counts(kind.name, who)) for kind in KINDS})

    async def next_query(request: Request):
        body = await _json_body(request)
        kind, who = _field(body, "kind", str), _field(body, "who", str)
        row = store.next_query(kind, who)
        return JSONResponse({"query": None if row is None else _query_json(row), **_counts_json(store.counts(kind, who))})

    async def hold(request: Request):
        query_id = _query_id(request)
        store.query(query_id)  # unknown: 404 before a malformed body's 400
        body = await _json_body(request)
        return JSONResponse({"held": store.renew(query_id, _field(body, "who", str))})

    async def answer(request: Request):
        query_id = _query_id(request)
        store.query(query_id)
        body = await _json_body(request)
        stored, row = store.answer(query_id, _field(body, "choice", str), _field(body, "who", str),
                                   _field(body, "seconds", (int, float), required=False))
        return JSONResponse({"stored": stored, "answer": _answer_json(row)})

    async def marks(request: Request):
        query_id = _query_id(request)
        store.query(query_id)
        body = await _json_body(request)
        given = _field(body, "marks", list)
        if not all(isinstance(m, dict) and set(m) == {"step", "sign"} and
                   all(isinstance(m[k], int) and not isinstance(m[k], bool) for k in m) for m in given):
            raise BadAnswer("marks must be a list of {step: int, sign: +1 or -1}")
        stored, row = store.submit_marks(query_id, [(m["step"], m["sign"]) for m in given], _field(body, "who", str),
                                         _field(body, "seconds", (int, float), required=False))
        return JSONResponse({"stored": stored, "answer": _answer_json(row)})

    async def clip(request: Request):
        name = request.path_params["name"]
        # The name is checked before it touches the file system; a link out of clips/ is refused too.
        if not CLIP_NAME.fullmatch(name) or (clips_dir / name).resolve().parent != clips_dir \
                or not (clips_dir / name).is_file():
            return PlainTextResponse("no such clip", status_code=404)
        return FileResponse(clips_dir / name, media_type="video/mp4")

    async def unknown_query(request: Request, error: UnknownQuery):
        return JSONResponse({"error": f"no query {error.args[0]}"}, status_code=404)

    async def bad_answer(request: Request, error: BadAnswer):
        return JSONResponse({"error": str(error)}, status_code=400)

    routes = [
        Route("/", home),
        *(Route(f"/{kind.name}", page(kind)) for kind in KINDS),
        Route("/api/status", status),
        Route("/api/next", next_query, methods=["POST"]),
        Route("/api/queries/{query_id}/hold", hold, methods=["POST"]),
        Route("/api/queries/{query_id}/answer", answer, methods=["POST"]),
        Route("/api/queries/{query_id}/marks", marks, methods=["POST"]),
        Route("/clips/{name}", clip),
        Mount("/static", StaticFiles(directory=str(STATIC)), name="static"),
    ]
    guard = Middleware(Guard, hosts=allowed_hosts(host, port), token=token, secret=secret)
    return Starlette(routes=routes, middleware=[guard],
                     exception_handlers={UnknownQuery: unknown_query, BadAnswer: bad_answer})


class Guard:
    """Every request passes here first, in this order:

    * its ``Host`` must be the server's own address (:func:`allowed_hosts`), so a site that
      has its name resolve to this machine (DNS rebinding) cannot load the pages (403);
    * an ``Origin`` header, where the browser sends one, must name that same address: no
      other page may send us anything (403);
    * with a token, the token: ``?token=`` on the first page (which then sets a cookie), the
      cookie, or an ``X-Token`` header (401);
    * a request that may change the store (any method but GET and HEAD) must carry the run's
      secret in ``X-Label-Secret`` (the pages hold it, and a page of another origin cannot
      read them; 403), be ``application/json`` (415), and be at most :data:`MAX_BODY` bytes,
      counted as they arrive, so a longer body is refused without being read (413).

    Every response, refusals included, carries :data:`SECURITY_HEADERS`."""

    def __init__(self, app, hosts: frozenset[str] | None, token: str | None, secret: str):
        self.app, self.hosts, self.token, self.secret = app, hosts, token, secret

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
            await send(message)

        request = Request(scope)
        refusal = self.refusal(request)
        if refusal is None and request.method not in ("GET", "HEAD"):
            body = await _read_body(receive, request.headers.get("content-length"))
            if body is None:
                refusal = PlainTextResponse(f"the body is too large: at most {MAX_BODY} bytes", status_code=413)
            else:
                receive = _replay(body, receive)
        if refusal is not None:
            return await refusal(scope, receive, send_with_headers)
        return await self.app(scope, receive, send_with_headers)

    def refusal(self, request: Request) -> PlainTextResponse | None:
        host = request.headers.get("host", "").lower()
        if self.hosts is not None and host not in self.hosts:
            return PlainTextResponse(f"this server answers to {' or '.join(sorted(self.hosts))}, not to "
                                     f"{host or 'no Host'}", status_code=403)
        origin = request.headers.get("origin")
        if origin is not None and origin.lower() != f"http://{host}":
            return PlainTextResponse(f"requests from other sites are refused (Origin {origin})", status_code=403)
        if self.token is not None:
            given = (request.headers.get("x-token") or request.query_params.get("token")
                     or request.cookies.get(TOKEN_COOKIE) or "")
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                return PlainTextResponse("an access token is required: open the address rlhf-jax label printed",
                                         status_code=401)
        if request.method in ("GET", "HEAD"):
            return None
        if not hmac.compare_digest(request.headers.get(SECRET_HEADER, "").encode(), self.secret.encode()):
            return PlainTextResponse(f"this request must come from the label page ({SECRET_HEADER} is missing or "
                                     "wrong): reload the page", status_code=403)
        if request.headers.get("content-type", "").partition(";")[0].strip().lower() != "application/json":
            return PlainTextResponse("the body must be JSON, sent as Content-Type: application/json",
                                     status_code=415)
        return None


async def _read_body(receive, declared_length: str | None) -> bytes | None:
    """The request's body; ``None`` once it is past :data:`MAX_BODY` (a declared length past
    it is not waited for) or the client has gone."""
    if declared_length is not None and declared_length.isdigit() and int(declared_length) > MAX_BODY:
        return None
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > MAX_BODY:
            return None
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive):
    """``receive`` for the app: the body already read, then whatever comes next (a disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay():
        return pending.pop() if pending else await receive()

    return replay


def run_settings(run_dir: str | Path) -> tuple[PeopleConfig, str]:
    """What the app needs from a run's ``config.yaml``: its people section and the first page
    to show. Only those are built, not the whole experiment config, whose dataclasses live
    beside the agents: serving a run never imports JAX or an agent."""
    config = read_run_config(run_dir)
    if config.get("labeler") != "people":
        raise ConfigError(f"{run_dir} was not trained with labeler: people, so it asks no one; "
                          "train with labeler=people to ask people")
    page = (feedback_kind(config.get("reward")) or PREFERENCES).name
    return build(PeopleConfig, config.get("people", {}), "people"), page


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (0: any free port), or a :class:`ConfigError` that says
    the port is out of range or taken."""
    if port not in PORTS:
        raise ConfigError(f"--port must be from {PORTS.start} to {PORTS.stop - 1}, got {port}")
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart need not wait
    try:
        listener.bind((host, port))
    except OSError as error:
        listener.close()
        if error.errno == errno.EADDRINUSE:
            raise ConfigError(f"port {port} on {host} is taken (another program, or another rlhf-jax label, "
                              "serves there): choose another with --port") from None
        raise ConfigError(f"cannot serve on {host} port {port}: {error.strerror}") from None
    return listener


class Limits(NamedTuple):
    """How much of the server one client can hold. Uvicorn times neither a request's head nor
    its body, and takes connections until the process has no file descriptor left (1,024):
    1,030 connections that never sent a request locked every other client out."""

    connections: int = 256  # open at once; each with a clip open, still well within 1,024 descriptors
    request_s: float = 10.0  # for a request to arrive whole, head and body, once its connection is ready


class _LimitedH11(H11Protocol):
    """Uvicorn's HTTP/1.1 connection within :class:`Limits`. Once a connection is ready for a
    request (it has opened, or its last response has gone), the request must arrive whole
    within ``request_s``, or the connection is closed. Past ``connections`` open connections,
    the one that has waited longest for a request is closed: the new one itself when every
    other is busy with a request."""

    _order = itertools.count()  # of the moments connections became ready

    def __init__(self, *args, limits: Limits, **kwargs):
        super().__init__(*args, **kwargs)
        self.limits = limits
        self.ready_since = 0
        self.deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._ready()
        open_ = [c for c in self.connections if not c.transport.is_closing()]
        if len(open_) > self.limits.connections:
            waiting = [c for c in open_ if c.conn.their_state is h11.IDLE]  # self among them
            min(waiting, key=lambda c: c.ready_since).transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._ready()

    def connection_lost(self, exc) -> None:
        self.deadline.cancel()
        super().connection_lost(exc)

    def _ready(self) -> None:
        self.ready_since = next(self._order)
        if self.deadline is not None:
            self.deadline.cancel()
        self.deadline = self.loop.call_later(self.limits.request_s, self._close_if_no_request)

    def _close_if_no_request(self) -> None:
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY):  # the head, or the body, still to come
            self.transport.close()


def label_server(app, limits: Limits = Limits()) -> uvicorn.Server:
    """The uvicorn server that serves ``app`` within ``limits``."""
    protocol = functools.partial(_LimitedH11, limits=limits)
    return uvicorn.Server(uvicorn.Config(app, log_level="warning", http=protocol))


def serve(run_dir: str | Path, host: str = "127.0.0.1", port: int = 8000, token: str | None = None) -> None:
    """Check the run and the port, print the address to open, and serve until interrupted."""
    people, page = run_settings(run_dir)
    if host not in LOOPBACK and not token:
        raise ConfigError(f"serving on {host} lets other machines in: give an access token with --token "
                          "(or RLHF_JAX_TOKEN)")
    with listen(host, port) as listener:
        port = listener.getsockname()[1]
        try:
            app = create_app(run_dir, people, token, default_page=page, host=host, port=port)
        except (OSError, sqlite3.Error) as error:  # a read-only or full disk: the secret and answers go there
            raise RunError(f"cannot serve {run_dir}: {error}. The server writes its page secret and people's "
                           "answers there: make room, or make it writable, then start it again") from None
        shown = f"[{host}]" if ":" in host else host
        print(f"labeling {run_dir}: open http://{shown}:{port}/{page}" + (f"?token={token}" if token else ""),
              flush=True)
        label_server(app).run(sockets=[listener])

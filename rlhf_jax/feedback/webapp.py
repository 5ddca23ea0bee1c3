"""``rlhf-jax label RUN_DIR``: the web page where people compare clips and mark moments.

A Starlette (ASGI) app served by uvicorn over the run's label store
(:mod:`rlhf_jax.feedback.store`); it keeps no state of its own, so it can be stopped and
started again at any time, and several people can label at once.

Pages: ``/compare`` (two looping clips side by side; Christiano et al. appendix B) and
``/annotate`` (one episode on a scrubbable timeline, with progress and regress marks; the
IBT paper's appendix A.1). JSON API:

=====================================  ====================================================
``GET  /api/status``                   answered and waiting queries of each kind
``POST /api/next``                     ``{kind, who}``: the query to show ``who`` (or null)
``POST /api/queries/{id}/answer``      ``{choice, who, seconds}``: left, right, tie, cant_tell
``POST /api/queries/{id}/marks``       ``{marks: [{step, sign}], who, seconds}``
``GET  /clips/{name}``                 a clip (byte ranges served, so videos can seek)
=====================================  ====================================================

Errors: 404 for an unknown query or clip, 400 for a malformed answer; answering a query a
second time stores nothing and returns the answer that stands. Clip names must look like
``q12_0.mp4``, so no name can reach a file outside the run's ``clips/`` folder. With a
token (required when bound beyond 127.0.0.1), every request must carry it: ``?token=`` on
the first page (the page then sets a cookie), or an ``X-Token`` header.
"""
from __future__ import annotations

import hmac
import html
import json
import re
from importlib import resources
from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from rlhf_jax.config_base import build, read_run_config
from rlhf_jax.errors import ConfigError
from rlhf_jax.feedback.config import PeopleConfig
from rlhf_jax.feedback.labeler import CLIPS_DIR
from rlhf_jax.feedback.store import KINDS, STORE_FILE, BadAnswer, LabelStore, UnknownQuery

CLIP_NAME = re.compile(r"q\d{1,12}_\d\.mp4")
TOKEN_COOKIE = "rlhf_jax_token"
STATIC = resources.files("rlhf_jax.feedback") / "static"
PAGE_TITLES = {"compare": "Which clip is better?", "annotate": "Mark progress and regress"}


def _query_json(row) -> dict:
    return {"id": row.id, "kind": row.kind, "clips": [f"/clips/{name}" for name in row.clips],
            "frames": row.frames, "fps": row.fps}


def _answer_json(row) -> dict:
    answer = {"query_id": row.query_id, "choice": row.choice, "who": row.who, "answered_at": row.answered_at,
              "seconds": row.seconds}
    if row.kind == "annotate":
        answer["marks"] = [{"step": step, "sign": sign} for step, sign in row.marks]
    return answer


async def _json_body(request: Request) -> dict:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadAnswer("the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise BadAnswer("the body must be a JSON object")
    return body


def _field(body: dict, name: str, kind, required: bool = True):
    if name not in body:
        if required:
            raise BadAnswer(f"missing field {name!r}")
        return None
    value = body[name]
    # bool is an int in Python: never accept true/false for a number.
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise BadAnswer(f"field {name!r} has the wrong type: {value!r}")
    return value


def create_app(run_dir: str | Path, people: PeopleConfig = PeopleConfig(), token: str | None = None,
               default_page: str = "compare") -> Starlette:
    """The labeling app over ``run_dir``'s label store (created if training has not yet)."""
    run_dir = Path(run_dir).resolve()
    store = LabelStore(run_dir / STORE_FILE)
    clips_dir = run_dir / CLIPS_DIR

    def page(kind: str):
        template = (STATIC / f"{kind}.html").read_text()

        async def endpoint(request: Request):
            text = (template.replace("{{title}}", html.escape(PAGE_TITLES[kind]))
                    .replace("{{instruction}}", html.escape(people.instruction_for(kind))))
            response = HTMLResponse(text)
            if token is not None and request.query_params.get("token") == token:
                response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
            return response

        return endpoint

    async def home(request: Request):
        query = f"?{request.url.query}" if request.url.query else ""
        return RedirectResponse(f"/{default_page}{query}")

    async def status(request: Request):
        return JSONResponse({kind: store.counts(kind) for kind in KINDS})

    async def next_query(request: Request):
        body = await _json_body(request)
        kind = _field(body, "kind", str)
        row = store.next_query(kind, _field(body, "who", str), people.assignment_timeout_s)
        return JSONResponse({"query": None if row is None else _query_json(row), **store.counts(kind)})

    async def answer(request: Request):
        query_id = request.path_params["query_id"]
        store.query(query_id)  # unknown: 404 before a malformed body's 400
        body = await _json_body(request)
        stored, row = store.answer(query_id, _field(body, "choice", str), _field(body, "who", str),
                                   _field(body, "seconds", (int, float), required=False))
        return JSONResponse({"stored": stored, "answer": _answer_json(row)})

    async def marks(request: Request):
        query_id = request.path_params["query_id"]
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
        Route("/compare", page("compare")),
        Route("/annotate", page("annotate")),
        Route("/api/status", status),
        Route("/api/next", next_query, methods=["POST"]),
        Route("/api/queries/{query_id:int}/answer", answer, methods=["POST"]),
        Route("/api/queries/{query_id:int}/marks", marks, methods=["POST"]),
        Route("/clips/{name}", clip),
        Mount("/static", StaticFiles(directory=str(STATIC)), name="static"),
    ]
    middleware = [Middleware(TokenCheck, token=token)] if token is not None else []
    return Starlette(routes=routes, middleware=middleware,
                     exception_handlers={UnknownQuery: unknown_query, BadAnswer: bad_answer})


class TokenCheck:
    """Refuse (401) any request that does not carry the access token."""

    def __init__(self, app, token: str):
        self.app, self.token = app, token

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request = Request(scope)
        given = (request.headers.get("x-token") or request.query_params.get("token")
                 or request.cookies.get(TOKEN_COOKIE) or "")
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            response = PlainTextResponse("an access token is required: open the address rlhf-jax label printed",
                                         status_code=401)
            return await response(scope, receive, send)
        return await self.app(scope, receive, send)


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def run_settings(run_dir: str | Path) -> tuple[PeopleConfig, str]:
    """What the app needs from a run's ``config.yaml``: its people section and the first page
    to show. Only those are built, not the whole experiment config, whose dataclasses live
    beside the agents: serving a run never imports JAX or an agent."""
    config = read_run_config(run_dir)
    if config.get("labeler") != "people":
        raise ConfigError(f"{run_dir} was not trained with labeler: people, so it asks no one; "
                          "train with labeler=people to ask people")
    page = "annotate" if config.get("reward") == "ibt" else "compare"
    return build(PeopleConfig, config.get("people", {}), "people"), page


def serve(run_dir: str | Path, host: str = "127.0.0.1", port: int = 8000, token: str | None = None) -> None:
    """Check the run, print the address to open, and serve until interrupted."""
    import uvicorn

    people, page = run_settings(run_dir)
    if host not in LOOPBACK and not token:
        raise ConfigError(f"serving on {host} lets other machines in: give an access token with --token "
                          "(or RLHF_JAX_TOKEN)")
    app = create_app(run_dir, people, token, default_page=page)
    shown = f"[{host}]" if ":" in host else host
    print(f"labeling {run_dir}: open http://{shown}:{port}/{page}" + (f"?token={token}" if token else ""), flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")

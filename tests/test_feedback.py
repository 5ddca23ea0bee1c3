"""The label store, the training side's PeopleLabeler, and every endpoint of the labeling app."""
import contextlib
import http.client
import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import uvicorn
from starlette.testclient import TestClient

from rlhf_jax.cli import main
from rlhf_jax.errors import ConfigError
from rlhf_jax.feedback.config import PeopleConfig
from rlhf_jax.feedback.labeler import PeopleLabeler
from rlhf_jax.feedback.store import STORE_FILE, LabelStore
from rlhf_jax.feedback.webapp import (MAX_BODY, SECRET_FILE, SECRET_HEADER, STATIC, TOKEN_COOKIE, Limits,
                                      create_app, label_server, listen)
from rlhf_jax.reward.kinds import ANNOTATE_MIN_SECONDS
from rlhf_jax.reward.people import Query

CLIP_BYTES = b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 4  # stands in for an MP4
ADDRESS = "http://127.0.0.1:8000"  # where create_app assumes it is served, unless told


def fake_render(obs, path, fps):
    """Writes a stand-in clip: these tests are about the store and the app, not about video."""
    path.write_bytes(CLIP_BYTES)


def page_secret(client, page="/compare") -> str:
    """The secret a page carries, found as the page's script finds it."""
    return re.search(r'<meta name="label-secret" content="([^"]+)">', client.get(page).text).group(1)


def as_the_page(app, **options) -> TestClient:
    """A client that asks as the labeling page does: at the server's address, with its secret."""
    client = TestClient(app, base_url=ADDRESS, **options)
    client.headers[SECRET_HEADER] = page_secret(client)
    return client


def pair_query(i, k=5):
    obs = np.random.default_rng(i).normal(size=(2, k, 4)).astype(np.float32)
    reward = np.ones((2, k), np.float32)
    return Query(i, "compare", obs, np.zeros((2, k), np.int32), reward)


def episode_query(i, k=8):
    return Query(i, "annotate", np.zeros((1, k, 4), np.float32), np.zeros((1, k), np.int32), np.zeros((1, k), np.float32))


@pytest.fixture
def run_dir(tmp_path):
    """A run whose labeler has asked three comparisons (ids 0-2) and one episode (id 3)."""
    labeler = PeopleLabeler(tmp_path, fake_render, fps=50.0)
    labeler.ask([pair_query(0), pair_query(1), pair_query(2)])
    labeler.ask([episode_query(3)])
    labeler.wait_for_renders()
    return tmp_path


@pytest.fixture
def client(run_dir):
    return as_the_page(create_app(run_dir, PeopleConfig(assignment_timeout_s=0.3, instruction="Keep the pole up.")))


class Clock:
    """The store's clock, moved by hand: a test of hold times must not depend on how long the
    host takes between two requests (a loaded CI machine once took over 1.5 s)."""

    def __init__(self):
        self.now = 1_800_000_000.0

    def time(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    from rlhf_jax.feedback import store

    fake = Clock()
    monkeypatch.setattr(store, "time", fake)
    return fake


def rows(run_dir, sql):
    with sqlite3.connect(run_dir / STORE_FILE) as db:
        return db.execute(sql).fetchall()


JSON = {"Content-Type": "application/json"}


@contextlib.contextmanager
def served(run_dir, limits: Limits = Limits(), **options):
    """The app behind the server ``rlhf-jax label`` runs (uvicorn on a free loopback port, in a
    thread): for requests a test client would tidy up before the app saw them. Yields the port."""
    listener = listen("127.0.0.1", 0)
    port = listener.getsockname()[1]
    server = label_server(create_app(run_dir, port=port, **options), limits)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        assert server.started, "the server did not start"
        yield port
    finally:
        server.should_exit = True
        thread.join(10)
        listener.close()


# --------------------------------------------------------------------- the store
def test_the_store_is_sqlite_in_wal_mode(run_dir):
    assert rows(run_dir, "PRAGMA journal_mode") == [("wal",)]
    queries = rows(run_dir, "SELECT id, kind, clips, segments, frames, fps, priority FROM queries ORDER BY id")
    assert [q[:2] for q in queries] == [(0, "compare"), (1, "compare"), (2, "compare"), (3, "annotate")]
    assert queries[0][2:] == ('["q0_0.mp4", "q0_1.mp4"]', "q0.npz", 5, 50.0, 0)
    assert [q[6] for q in queries] == [0, 1, 2, 0]  # rank within the batch that asked them
    assert (run_dir / "clips" / "q3_0.mp4").read_bytes() == CLIP_BYTES
    with np.load(run_dir / "queries" / "q1.npz") as saved:
        np.testing.assert_array_equal(saved["obs"], pair_query(1).obs)


def test_answers_reach_training_once_and_again_after_a_restart_until_a_checkpoint_holds_them(run_dir):
    store = LabelStore(run_dir / STORE_FILE)
    store.answer(0, "left", "ann", 2.5)
    store.answer(1, "cant_tell", "ann")
    store.submit_marks(3, [(6, -1), (2, 1)], "bob")
    labeler = PeopleLabeler(run_dir, fake_render, fps=50.0)
    got = {a.id: a for a in labeler.answers()}
    assert got[0].mu == 1.0 and got[1].mu is None  # "can't tell" reaches the loop as None: never trained on
    np.testing.assert_array_equal(got[3].marks, [0, 0, 1, 0, 0, 0, -1, 0])
    assert labeler.answers() == []  # each answer once
    labeler.checkpoint_saved([0])  # a checkpoint now holds query 0's label only

    restarted = PeopleLabeler(run_dir, fake_render, fps=50.0)  # training killed and started again
    pending, next_id = restarted.restore()
    assert [q.id for q in pending] == [1, 2, 3] and next_id == 4
    np.testing.assert_array_equal(pending[0].obs, pair_query(1).obs)
    assert sorted(a.id for a in restarted.answers()) == [1, 3]  # delivered again; 0 is in the checkpoint
    assert rows(run_dir, "SELECT query_id, in_checkpoint FROM answers ORDER BY query_id") == [(0, 1), (1, 0), (3, 0)]

    # Killed after saving a checkpoint that holds 0 and 3, before telling the store: the
    # checkpoint's own record wins; killed again, a restore from an older one (only 3) undoes 0.
    again = PeopleLabeler(run_dir, fake_render, fps=50.0)
    assert [q.id for q in again.restore([0, 3])[0]] == [1, 2]
    assert sorted(a.id for a in again.answers()) == [1]
    older = PeopleLabeler(run_dir, fake_render, fps=50.0)
    assert [q.id for q in older.restore([3])[0]] == [0, 1, 2]
    assert sorted(a.id for a in older.answers()) == [0, 1]
    # A checkpoint that names no answers (written before checkpoints did) leaves the store's
    # record as it stands, and a save after it adds to that record, never takes from it.
    unnamed = PeopleLabeler(run_dir, fake_render, fps=50.0)
    assert [q.id for q in unnamed.restore(None)[0]] == [0, 1, 2]
    unnamed.checkpoint_saved([1])
    assert rows(run_dir, "SELECT query_id, in_checkpoint FROM answers ORDER BY query_id") == [(0, 0), (1, 1), (3, 1)]


def test_an_episode_to_annotate_lasts_long_enough_to_mark_and_a_pair_plays_in_real_time(tmp_path):
    """50 CartPole steps at the environment's 50 fps made a 1 s clip, over before anyone could
    mark it: an episode plays slowed down, at the frame rate the store records for the page."""
    rendered = []

    def render(obs, path, fps):
        rendered.append(fps)
        path.write_bytes(CLIP_BYTES)

    labeler = PeopleLabeler(tmp_path, render, fps=50.0)
    labeler.ask([pair_query(0, k=50), episode_query(1, k=50), episode_query(2, k=1000)])
    labeler.wait_for_renders()
    store = LabelStore(tmp_path / STORE_FILE)
    episode = store.query(1)
    assert episode.frames / episode.fps >= ANNOTATE_MIN_SECONDS  # how long the clip plays
    assert store.query(0).fps == store.query(2).fps == 50.0  # a pair, and a long episode: in real time
    assert rendered == [50.0, 50.0, episode.fps, 50.0]  # each clip written at the rate recorded


def test_a_failed_render_is_reported_to_the_training_loop(tmp_path):
    def broken(obs, path, fps):
        raise OSError("disk full")

    labeler = PeopleLabeler(tmp_path, broken, fps=50.0)
    labeler.ask([pair_query(0)])
    with pytest.raises(RuntimeError, match="disk full"):
        labeler.wait_for_renders()


# ------------------------------------------------------------------- the pages
def test_the_pages_show_the_instruction_keys_and_empty_state(client):
    compare = client.get("/compare")
    assert compare.status_code == 200
    for text in ("Keep the pole up.", "Left is better", "Tie", "Can't tell", "No clips waiting",
                 "refreshes itself", "/static/label.js"):
        assert text in compare.text, text
    assert "Progress here" in client.get("/annotate").text
    assert client.get("/", follow_redirects=False).headers["location"] == "/compare"
    script = client.get("/static/label.js")
    assert script.status_code == 200 and "ArrowLeft" in script.text
    assert client.get("/static/../store.py").status_code == 404


# The page's script run by Node in a stand-in for the browser: every element a plain object, and
# each request answered with the reply recorded for its path. Prints what #notice says after
# each step.
PAGE_IN_NODE = r"""
const vm = require("vm"), fs = require("fs");
const [script, repliesJson] = process.argv.slice(1);
const replies = JSON.parse(repliesJson);
const elements = {};
const element = (id) => elements[id] ??= {id, hidden: true, textContent: "", value: "", dataset: {}, style: {},
  addEventListener() {}, replaceChildren() {}, append() {}, pause() {}, play() {}};
const page = {
  document: {body: {dataset: {kind: "compare", renewS: "1"}}, getElementById: element,
             querySelector: () => ({content: "the-secret"}), querySelectorAll: () => [],
             addEventListener() {}, createElement: () => element("new")},
  localStorage: {getItem: () => "ann", setItem() {}}, performance: {now: () => 0},
  setTimeout() {}, setInterval() {},
  fetch: async (path) => ({ok: true, json: async () => replies[path.split("?")[0]]}),
};
vm.createContext(page);
vm.runInContext(fs.readFileSync(script, "utf8"), page);
const settled = () => new Promise((resolve) => setImmediate(resolve));
const notice = () => element("notice").hidden ? "" : element("notice").textContent;
(async () => {
  await settled();
  await vm.runInContext("renewHold()", page);
  console.log(JSON.stringify(notice()));
  await vm.runInContext('send("answer", {choice: "left"})', page);
  await settled();
  console.log(JSON.stringify(notice()));
})();
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js to run the page's script")
def test_the_page_says_when_an_answer_was_not_stored_and_why(run_dir, clock):
    """The page ignored "held": false and "stored": false: a person whose answer lost a race
    was not told. The replies are the server's own, recorded as the race happened."""
    client = as_the_page(create_app(run_dir, PeopleConfig(assignment_timeout_s=60)))
    bob = client.post("/api/next", json={"kind": "compare", "who": "bob"}).json()
    clock.advance(61)  # bob's page went quiet; his query goes to ann, but bob still answers it
    replies = {"/api/next": client.post("/api/next", json={"kind": "compare", "who": "ann"}).json()}
    assert replies["/api/next"]["query"]["id"] == bob["query"]["id"] == 0
    assert client.post("/api/queries/0/answer", json={"choice": "right", "who": "bob"}).json()["stored"]
    replies["/api/queries/0/hold"] = client.post("/api/queries/0/hold", json={"who": "ann"}).json()
    replies["/api/queries/0/answer"] = client.post("/api/queries/0/answer", json={"choice": "left", "who": "ann"}).json()
    assert replies["/api/queries/0/hold"] == {"held": False} and not replies["/api/queries/0/answer"]["stored"]
    replies["/api/status"] = client.get("/api/status").json()
    result = subprocess.run(["node", "-e", PAGE_IN_NODE, str(STATIC / "label.js"), json.dumps(replies)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    after_hold, after_answer = (json.loads(line) for line in result.stdout.splitlines())
    assert "no longer yours" in after_hold and "someone else" in after_hold
    assert "not stored" in after_answer and "bob answered it first" in after_answer


def test_text_put_into_a_page_is_escaped(run_dir):
    instruction = '<script>alert("x")</script> & <b>bold</b>'
    client = TestClient(create_app(run_dir, PeopleConfig(instruction=instruction)), base_url=ADDRESS)
    for page in ("/compare", "/annotate"):
        text = client.get(page).text
        assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in text
        assert "<script>alert" not in text and "<b>" not in text


@pytest.mark.parametrize("method, path", [("GET", "/compare"), ("GET", "/annotate"), ("GET", "/"),
                                          ("GET", "/api/status"), ("GET", "/static/label.js"),
                                          ("GET", "/clips/q0_0.mp4"), ("GET", "/clips/nothing.mp4"),
                                          ("POST", "/api/next"), ("POST", "/api/queries/0/answer")])
def test_every_response_carries_the_security_headers(client, method, path):
    for response in (client.request(method, path, json={"kind": "compare", "who": "ann"}, follow_redirects=False),
                     client.request(method, path, headers={"Host": "evil.example:8000"})):  # a refusal too
        headers = response.headers
        assert headers["x-frame-options"] == "DENY" and headers["x-content-type-options"] == "nosniff"
        assert headers["referrer-policy"] == "no-referrer"
        policy = dict(rule.strip().split(" ", 1) for rule in headers["content-security-policy"].split(";"))
        assert policy["default-src"] == policy["frame-ancestors"] == "'none'"
        assert all(policy[kind] == "'self'" for kind in ("script-src", "style-src", "media-src", "connect-src"))


def test_status_counts_answered_and_waiting(client):
    waiting = lambda n: {"waiting": n, "for_you": n, "held_by_others": []}
    assert client.get("/api/status").json() == {"compare": {"answered": 0, **waiting(3)},
                                                "annotate": {"answered": 0, **waiting(1)}}
    client.post("/api/queries/0/answer", json={"choice": "tie", "who": "ann"})
    assert client.get("/api/status").json()["compare"] == {"answered": 1, **waiting(2)}


def test_counts_tell_what_waits_for_you_from_what_others_hold_and_for_how_long(run_dir):
    """The page said "3 waiting" beside "No clips waiting" while other people held all three."""
    client = as_the_page(create_app(run_dir, PeopleConfig(assignment_timeout_s=60, heartbeat_timeout_s=20)))
    ask = lambda who: client.post("/api/next", json={"kind": "compare", "who": who}).json()
    ask("ann")
    ask("bob")
    bob = client.get("/api/status", params={"who": "bob"}).json()["compare"]
    assert (bob["waiting"], bob["for_you"]) == (3, 2)  # his own, and the one nobody holds
    (hold,) = bob["held_by_others"]
    assert hold["who"] == "ann" and 19 < hold["expires_in_s"] <= 20  # unless her page says she still has it
    assert ask("cy")["for_you"] == 1
    dee = ask("dee")
    assert dee["query"] is None and (dee["waiting"], dee["for_you"]) == (3, 0)
    assert [h["who"] for h in dee["held_by_others"]] == ["ann", "bob", "cy"]  # the soonest free first


# --------------------------------------------------- several people at once
def test_a_query_goes_to_one_person_at_a_time_and_back_after_the_timeout(client, clock):
    ask = lambda who, kind="compare": client.post("/api/next", json={"kind": kind, "who": who}).json()["query"]
    first = ask("ann")
    assert first["id"] == 0 and first["clips"] == ["/clips/q0_0.mp4", "/clips/q0_1.mp4"]
    assert (first["frames"], first["fps"]) == (5, 50.0)
    assert ask("bob")["id"] == 1  # ann holds 0
    assert ask("ann")["id"] == 0  # a reload shows ann her own query again
    assert ask("cy")["id"] == 2
    assert ask("dee") is None  # all three held
    clock.advance(0.35)  # past the time-out: unanswered queries return to the pool
    assert ask("dee")["id"] == 0
    episode = ask("ann", "annotate")
    assert episode["kind"] == "annotate" and episode["clips"] == ["/clips/q3_0.mp4"]


def test_a_closed_page_gives_its_query_back_soon_and_an_open_one_keeps_it(run_dir, clock):
    """Queries held by pages since closed kept everyone else (and so training's start) waiting
    for the whole assignment time-out. An open page renews its hold every
    heartbeat_timeout_s / 4 (label.js); a closed one stops, and its query goes back."""
    client = as_the_page(create_app(run_dir, PeopleConfig(assignment_timeout_s=300, heartbeat_timeout_s=1.5)))
    ask = lambda who: client.post("/api/next", json={"kind": "compare", "who": who}).json()["query"]
    assert [ask("ann")["id"], ask("bob")["id"], ask("cy")["id"]] == [0, 1, 2]  # then ann and cy close their tabs
    assert ask("dee") is None
    assert 'data-renew-s="0.375"' in client.get("/compare").text  # how often the page renews
    for _ in range(8):  # 2 s of bob's page, still open
        assert client.post("/api/queries/1/hold", json={"who": "bob"}).json() == {"held": True}
        clock.advance(0.25)
    assert [ask("dee")["id"], ask("eve")["id"], ask("fay")] == [0, 2, None]  # bob still has 1
    assert client.post("/api/queries/0/hold", json={"who": "ann"}).json() == {"held": False}  # dee's now
    client.post("/api/queries/2/answer", json={"choice": "tie", "who": "eve"})
    assert client.post("/api/queries/2/hold", json={"who": "eve"}).json() == {"held": False}  # answered
    assert client.post("/api/queries/9/hold", json={"who": "eve"}).status_code == 404


def test_answered_queries_are_never_handed_out_again(client):
    client.post("/api/queries/0/answer", json={"choice": "left", "who": "ann"})
    assert client.post("/api/next", json={"kind": "compare", "who": "ann"}).json()["query"]["id"] == 1


# ------------------------------------------------------------------ answers
def test_an_answer_is_stored_with_who_when_and_how_long(client, run_dir):
    before = time.time()
    reply = client.post("/api/queries/2/answer", json={"choice": "right", "who": "ann", "seconds": 3.25}).json()
    assert reply["stored"] and reply["answer"]["choice"] == "right"
    (query_id, choice, who, answered_at, seconds), = rows(
        run_dir, "SELECT query_id, choice, who, answered_at, seconds FROM answers")
    assert (query_id, choice, who, seconds) == (2, "right", "ann", 3.25) and before <= answered_at <= time.time()


def test_answering_twice_is_idempotent(client, run_dir):
    client.post("/api/queries/1/answer", json={"choice": "left", "who": "ann"})
    again = client.post("/api/queries/1/answer", json={"choice": "right", "who": "bob"})
    assert again.status_code == 200
    assert not again.json()["stored"] and again.json()["answer"]["choice"] == "left"  # the first stands
    assert rows(run_dir, "SELECT choice, who FROM answers") == [("left", "ann")]


@pytest.mark.parametrize("body", [
    {"choice": "up", "who": "ann"},  # not a choice
    {"who": "ann"},  # no choice
    {"choice": "left"},  # nobody
    {"choice": "left", "who": ""},
    {"choice": 1, "who": "ann"},
    {"choice": "left", "who": "ann", "seconds": -1},
    {"choice": "left", "who": "ann", "seconds": "3"},
    ["left", "ann"],  # not an object
])
def test_a_malformed_answer_is_400(client, run_dir, body):
    response = client.post("/api/queries/0/answer", json=body)
    assert response.status_code == 400 and "error" in response.json()
    assert rows(run_dir, "SELECT * FROM answers") == []


def test_a_body_that_is_not_json_is_refused(client):
    assert client.post("/api/queries/0/answer", content=b"choice=left", headers=JSON).status_code == 400
    # Not even sent as JSON: what a form on another site sends (no preflight).
    response = client.post("/api/queries/0/answer", content=b'{"choice": "left", "who": "ann"}',
                           headers={"Content-Type": "text/plain"})
    assert response.status_code == 415


# ------------------------------------------------------- inputs that were 500s
@pytest.mark.parametrize("path, body", [
    (f"/api/queries/{2**63}/answer", {"choice": "left", "who": "ann"}),  # past SQLite's 64-bit integers
    (f"/api/queries/{2**63}/marks", {"marks": [], "who": "ann"}),
    (f"/api/queries/{2**63}/hold", {"who": "ann"}),
    (f"/api/queries/{10**40}/answer", {"choice": "left", "who": "ann"}),
    # Past Python's own limit on the digits int() reads (4,300): a 500.
    (f"/api/queries/{'9' * 5001}/answer", {"choice": "left", "who": "ann"}),
    (f"/api/queries/{'9' * 5001}/marks", {"marks": [], "who": "ann"}),
    (f"/api/queries/{'9' * 5001}/hold", {"who": "ann"}),
], ids=["answer-2^63", "marks-2^63", "hold-2^63", "answer-10^40", "answer-5001-digits", "marks-5001-digits",
        "hold-5001-digits"])
def test_a_query_id_past_sqlites_integers_is_unknown(client, run_dir, path, body):
    response = client.post(path, json=body)
    assert response.status_code == 404 and "no query" in response.json()["error"]
    assert rows(run_dir, "SELECT * FROM answers") == []


@pytest.mark.parametrize("seconds", [b"Infinity", b"-Infinity", b"NaN", b"1e400", b"-1e400", b"1e300", b"-0.5"])
def test_seconds_must_be_finite_and_sane_and_nothing_is_stored_until_they_are(client, run_dir, seconds):
    """Infinity was stored before the reply failed, and every retry of that query failed after."""
    for path, answer in (("/api/queries/0/answer", b'"choice": "left"'), ("/api/queries/3/marks", b'"marks": []')):
        body = b'{' + answer + b', "who": "ann", "seconds": ' + seconds + b'}'
        response = client.post(path, content=body, headers=JSON)
        assert response.status_code == 400 and response.json()["error"]
    assert rows(run_dir, "SELECT * FROM answers") == []
    retry = client.post("/api/queries/0/answer", json={"choice": "left", "who": "ann", "seconds": 2.5})
    assert retry.status_code == 200 and retry.json()["stored"]


@pytest.mark.parametrize("path, body", [
    ("/api/queries/0/answer", b'{"choice": "left", "who": "\\ud800"}'),
    ("/api/queries/3/marks", b'{"marks": [], "who": "ann\\udfff"}'),
    ("/api/queries/0/hold", b'{"who": "\\ud800"}'),
    ("/api/next", b'{"kind": "compare", "who": "\\ud800"}'),
])
def test_a_name_with_half_a_surrogate_pair_is_400(client, run_dir, path, body):
    """JSON can carry half of a UTF-16 surrogate pair, which has no UTF-8 form: storing it failed (500)."""
    response = client.post(path, content=body, headers=JSON)
    assert response.status_code == 400 and "who" in response.json()["error"]
    assert rows(run_dir, "SELECT * FROM answers") == []
    assert rows(run_dir, "SELECT id FROM queries WHERE assigned_to IS NOT NULL") == []


def test_seconds_may_be_null_as_the_server_itself_returns_them(client, run_dir):
    """An answer without its time comes back with "seconds": null; sending that back was a 400."""
    for path, answer in (("/api/queries/0/answer", {"choice": "left"}), ("/api/queries/3/marks", {"marks": []})):
        reply = client.post(path, json={**answer, "who": "ann", "seconds": None})
        assert reply.status_code == 200 and reply.json()["stored"], reply.text
        assert reply.json()["answer"]["seconds"] is None
    assert rows(run_dir, "SELECT query_id, seconds FROM answers ORDER BY query_id") == [(0, None), (3, None)]


def test_a_deeply_nested_body_is_refused_without_a_500(client, run_dir):
    deep = b"[" * 30_000 + b"]" * 30_000  # 60 KB: under the body limit, far past the parser's recursion
    response = client.post("/api/queries/0/answer", content=deep, headers=JSON)
    assert response.status_code == 400 and "nested" in response.json()["error"]
    deep_object = b'{"a": ' * 8_000 + b"1" + b"}" * 8_000  # 56 KB
    assert client.post("/api/queries/0/answer", content=deep_object, headers=JSON).status_code == 400
    deeper = b"[" * 200_000 + b"]" * 200_000  # past the body limit, so never parsed
    assert client.post("/api/queries/0/answer", content=deeper, headers=JSON).status_code == 413
    assert rows(run_dir, "SELECT * FROM answers") == []


def padded_answer(size: int) -> bytes:
    """A valid answer of exactly ``size`` bytes."""
    head = b'{"choice": "left", "who": "ann", "pad": "'
    return head + b"x" * (size - len(head) - 2) + b'"}'


def test_a_body_past_the_limit_is_413_and_one_at_it_is_read(client, run_dir):
    response = client.post("/api/queries/0/answer", content=padded_answer(MAX_BODY + 1), headers=JSON)
    assert response.status_code == 413 and "too large" in response.text
    assert rows(run_dir, "SELECT * FROM answers") == []
    assert client.post("/api/queries/0/answer", content=padded_answer(MAX_BODY), headers=JSON).json()["stored"]


@pytest.mark.parametrize("framing", ["Content-Length: 104857600", "Transfer-Encoding: chunked"])
def test_a_large_body_is_refused_before_it_has_all_arrived(run_dir, framing):
    """A 100 MB answer grew the server by 323 MB: it read every byte before refusing. Now the 413
    comes back while the client is still sending, with or without a declared length."""
    with served(run_dir) as port, socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        secret = (run_dir / SECRET_FILE).read_text()
        connection.sendall(f"POST /api/queries/0/answer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{framing}\r\n"
                           f"Content-Type: application/json\r\n{SECRET_HEADER}: {secret}\r\n\r\n".encode())
        piece = b"x" * 16384
        with contextlib.suppress(OSError):  # the server may hang up on the rest
            for _ in range(32):  # 512 KiB of the 100 MB; the rest never comes
                connection.sendall(piece if "Length" in framing else b"%x\r\n%s\r\n" % (len(piece), piece))
        reply = connection.recv(4096)  # a server still waiting for the body times out here
    assert reply.startswith(b"HTTP/1.1 413"), reply
    assert rows(run_dir, "SELECT * FROM answers") == []


def closed_by_the_server(connection: socket.socket, within_s: float) -> bool:
    """Whether the server closes ``connection`` (which has had no reply) within ``within_s``."""
    connection.settimeout(within_s)
    try:
        return connection.recv(4096) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def get_status(port: int) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/api/status")
        return connection.getresponse().status
    finally:
        connection.close()


def test_idle_connections_past_the_cap_do_not_lock_out_a_client(run_dir):
    """1,030 connections that never sent a request held all 1,024 file descriptors, and no one
    else got in. Past the cap, the server closes the connection that has waited longest for a
    request, so one that asks is answered."""
    with served(run_dir, Limits(connections=4, request_s=60)) as port:
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(8)]
        assert get_status(port) == 200  # the ninth connection: the fifth idle one goes for it
        closed = [closed_by_the_server(connection, 5 if i < 5 else 0.3) for i, connection in enumerate(idle)]
        assert closed == [True] * 5 + [False] * 3
        for connection in idle:
            connection.close()


def test_a_request_that_does_not_arrive_whole_in_time_is_cut_off(run_dir):
    """Nothing timed the request's head or body: a client could hold a connection for ever by
    sending nothing, half a head, or half a body. A request must arrive whole within
    ``request_s`` of the connection's being ready for it."""
    with served(run_dir, Limits(connections=64, request_s=0.5)) as port:
        started = time.monotonic()
        silent, half_head, half_body = (socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3))
        half_head.sendall(f"GET /api/status HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode())
        secret = (run_dir / SECRET_FILE).read_text()
        half_body.sendall(f"POST /api/queries/0/answer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 100\r\n"
                          f"Content-Type: application/json\r\n{SECRET_HEADER}: {secret}\r\n\r\n".encode()
                          + b'{"choice": "left", ')
        assert [closed_by_the_server(c, 5) for c in (silent, half_head, half_body)] == [True] * 3
        assert time.monotonic() - started >= 0.5
        assert get_status(port) == 200
        for connection in (silent, half_head, half_body):
            connection.close()
    assert rows(run_dir, "SELECT * FROM answers") == []


def test_an_unknown_query_is_404(client):
    assert client.post("/api/queries/99/answer", json={"choice": "left", "who": "ann"}).status_code == 404
    assert client.post("/api/queries/99/marks", json={"marks": [], "who": "ann"}).status_code == 404
    assert client.post("/api/queries/abc/answer", json={"choice": "left", "who": "ann"}).status_code == 404


def test_next_refuses_an_unknown_kind_or_no_name(client):
    assert client.post("/api/next", json={"kind": "rank", "who": "ann"}).status_code == 400
    assert client.post("/api/next", json={"kind": "compare"}).status_code == 400


# ------------------------------------------------------------------- marks
def test_marks_are_stored_one_row_each(client, run_dir):
    reply = client.post("/api/queries/3/marks", json={
        "marks": [{"step": 5, "sign": -1}, {"step": 1, "sign": 1}], "who": "bob", "seconds": 9}).json()
    assert reply["stored"] and reply["answer"]["marks"] == [{"step": 1, "sign": 1}, {"step": 5, "sign": -1}]
    assert rows(run_dir, "SELECT query_id, step, sign, who FROM marks ORDER BY step") == [
        (3, 1, 1, "bob"), (3, 5, -1, "bob")]
    assert rows(run_dir, "SELECT choice FROM answers") == [("marked",)]
    again = client.post("/api/queries/3/marks", json={"marks": [], "who": "cy"}).json()
    assert not again["stored"] and len(again["answer"]["marks"]) == 2


def test_an_episode_with_no_marks_is_an_answer(client, run_dir):
    assert client.post("/api/queries/3/marks", json={"marks": [], "who": "bob"}).json()["stored"]
    assert rows(run_dir, "SELECT * FROM marks") == []


@pytest.mark.parametrize("marks", [
    [{"step": 8, "sign": 1}],  # the episode has 8 frames: 0..7
    [{"step": -1, "sign": 1}],
    [{"step": 2, "sign": 0}],
    [{"step": 2, "sign": 1}, {"step": 2, "sign": -1}],
    [{"step": 2}],
    [{"step": 2, "sign": True}],
    [{"step": "2", "sign": 1}],
    "2:+1",
])
def test_malformed_marks_are_400(client, run_dir, marks):
    assert client.post("/api/queries/3/marks", json={"marks": marks, "who": "bob"}).status_code == 400
    assert rows(run_dir, "SELECT * FROM answers") == []


def test_a_comparison_takes_no_marks_and_an_episode_no_choice(client):
    assert client.post("/api/queries/0/marks", json={"marks": [], "who": "bob"}).status_code == 400
    assert client.post("/api/queries/3/answer", json={"choice": "left", "who": "bob"}).status_code == 400


# ------------------------------------------------------------------- clips
def test_clips_are_served_with_byte_ranges_so_videos_can_seek(client):
    whole = client.get("/clips/q1_0.mp4")
    assert whole.status_code == 200 and whole.content == CLIP_BYTES
    assert whole.headers["content-type"] == "video/mp4" and whole.headers["accept-ranges"] == "bytes"
    part = client.get("/clips/q1_0.mp4", headers={"Range": "bytes=10-19"})
    assert part.status_code == 206 and part.content == CLIP_BYTES[10:20]


@pytest.mark.parametrize("name", ["q9_0.mp4", "..%2Fconfig.yaml", "%2e%2e%2f%2e%2e%2fetc%2fpasswd", "q1_0.mp4%00.txt",
                                  "Q1_0.mp4", "q1_0.npz", "..%2Fqueries%2Fq1.npz", "%2Fetc%2Fpasswd", "link_0.mp4"])
def test_no_clip_name_reaches_outside_the_clips_folder(client, run_dir, name):
    (run_dir / "config.yaml").write_text("secret")
    (run_dir / "clips" / "link_0.mp4").symlink_to(run_dir / "config.yaml")
    response = client.get(f"/clips/{name}")
    assert response.status_code == 404 and b"secret" not in response.content


def test_a_clip_linked_to_a_file_outside_is_refused(client, run_dir):
    (run_dir / "outside.mp4").write_bytes(b"secret")
    (run_dir / "clips" / "q7_0.mp4").symlink_to(run_dir / "outside.mp4")
    assert client.get("/clips/q7_0.mp4").status_code == 404


def test_no_path_sent_as_it_is_reaches_outside_the_served_folders(run_dir):
    """The test client normalises "/static/../store.py" before the app sees it; a real server
    gets these bytes as they are (http.client sends the path unchanged)."""
    (run_dir / "config.yaml").write_text("secret")
    paths = ["/static/../store.py", "/static/..%2fstore.py", "/static/%2e%2e/store.py", "/static/%2e%2e%2fstore.py",
             "/static/..%5cstore.py", "/static/../../feedback/store.py", "/static//etc/passwd",
             "/static/../../../../../../etc/passwd", "/static/%2e%2e%2f%2e%2e%2f%2e%2e%2f%2e%2e%2fetc%2fpasswd",
             "/clips/../config.yaml", "/clips/..%2fconfig.yaml", "/clips/%2e%2e%2fconfig.yaml", "/clips/../labels.sqlite"]
    with served(run_dir) as port:
        for path in paths:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            connection.request("GET", path)
            response = connection.getresponse()
            body = response.read()
            connection.close()
            assert response.status == 404, (path, response.status)
            assert not any(text in body for text in (b"secret", b"CREATE TABLE", b"root:", b"SQLite")), path
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", "/static/label.js")  # the server does serve its files
        assert connection.getresponse().status == 200
        connection.close()


# ------------------------------------------------------- requests not from the page
ANSWER = b'{"choice": "left", "who": "mallory"}'


@pytest.mark.parametrize("headers, status", [
    # What a page of another site can send without asking first: a form, or a no-cors fetch.
    ({"Content-Type": "text/plain", "Origin": "http://evil.example", SECRET_HEADER: None}, 403),
    ({"Content-Type": "application/x-www-form-urlencoded", "Origin": "http://evil.example", SECRET_HEADER: None}, 403),
    # Each rule alone, the others met:
    ({"Origin": "http://evil.example"}, 403),
    ({"Origin": "http://127.0.0.1:9999"}, 403),  # a page served from another local port
    ({"Origin": "null"}, 403),  # a sandboxed frame, a file
    ({"Host": "evil.example:8000"}, 403),  # a site whose name points at this machine
    ({"Host": "127.0.0.1:9999"}, 403),
    ({SECRET_HEADER: None}, 403),  # without the page's secret
    ({SECRET_HEADER: "guess"}, 403),
    ({"Content-Type": "text/plain"}, 415),
], ids=["other-site-text", "other-site-form", "origin", "origin-local-port", "origin-null", "host", "host-port",
        "no-secret", "wrong-secret", "not-json"])
def test_a_request_not_from_the_page_stores_nothing(client, run_dir, headers, status):
    request = client.build_request("POST", "/api/queries/0/answer", content=ANSWER, headers=JSON)
    for name, value in headers.items():
        if value is None:
            del request.headers[name]
        else:
            request.headers[name] = value
    response = client.send(request)
    assert response.status_code == status and len(response.text) > 20  # a message that says why
    assert rows(run_dir, "SELECT * FROM answers") == []


def test_the_page_is_served_under_the_servers_own_names_only(client, run_dir):
    secret = (run_dir / SECRET_FILE).read_text()
    refused = client.get("/compare", headers={"Host": "evil.example:8000"})
    assert refused.status_code == 403 and secret not in refused.text
    for host in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000", "LOCALHOST:8000"):
        assert secret in client.get("/compare", headers={"Host": host}).text
    same_origin = client.post("/api/queries/0/answer", content=ANSWER, headers={**JSON, "Origin": ADDRESS})
    assert same_origin.json()["stored"]


def test_the_secret_belongs_to_the_run_and_outlives_a_restart(run_dir, tmp_path):
    first = page_secret(TestClient(create_app(run_dir), base_url=ADDRESS))
    again = page_secret(TestClient(create_app(run_dir), base_url=ADDRESS), "/annotate")  # the server restarted
    assert first == again == (run_dir / SECRET_FILE).read_text() and len(first) >= 40
    assert (run_dir / SECRET_FILE).stat().st_mode & 0o777 == 0o600
    assert page_secret(TestClient(create_app(tmp_path / "other"), base_url=ADDRESS)) != first


@pytest.mark.parametrize("secret", ["", " \n"])
def test_an_empty_secret_file_stops_the_server_in_one_line(run_dir, capsys, monkeypatch, secret):
    """An empty label_secret (what a power loss can leave of one written without fsync) let a
    POST with no secret at all store an answer: no secret, no server."""
    (run_dir / "config.yaml").write_text("reward: preferences\nlabeler: people\n")
    (run_dir / SECRET_FILE).write_text(secret)
    monkeypatch.setattr(uvicorn.Server, "run", lambda *args, **kwargs: pytest.fail("the server started"))
    assert main(["label", str(run_dir), "--port", "0"]) == 2
    out, err = capsys.readouterr()
    assert "http://" not in out and err.count("\n") == 1 and f"{run_dir / SECRET_FILE} is empty" in err
    with pytest.raises(ConfigError, match="is empty"):
        create_app(run_dir)


def test_the_secret_is_written_whole_and_synced_before_it_is_used(tmp_path, monkeypatch):
    synced = []
    fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.fstat(fd).st_ino), fsync(fd)))
    secret = page_secret(TestClient(create_app(tmp_path), base_url=ADDRESS))
    path = tmp_path / SECRET_FILE
    assert path.read_text() == secret
    assert path.stat().st_ino in synced and tmp_path.stat().st_ino in synced  # its bytes, then its name
    assert [p.name for p in tmp_path.iterdir() if SECRET_FILE in p.name] == [SECRET_FILE]  # nothing half-made left


# ------------------------------------------------------------------- access
def test_with_a_token_every_request_must_carry_it(run_dir):
    client = TestClient(create_app(run_dir, token="s3cret"), base_url=ADDRESS)
    assert client.get("/compare").status_code == 401
    assert client.get("/api/status").status_code == 401
    assert client.get("/clips/q0_0.mp4").status_code == 401
    assert client.get("/api/status", headers={"X-Token": "wrong"}).status_code == 401
    assert client.get("/api/status", headers={"X-Token": "s3cret"}).status_code == 200
    page = client.get("/compare?token=s3cret")
    assert page.status_code == 200 and page.cookies.get(TOKEN_COOKIE) == "s3cret"
    assert client.get("/clips/q0_0.mp4").status_code == 200  # the page's cookie now lets the browser in


def test_with_a_token_no_post_skips_it(run_dir):
    """Pages, reads and writes alike: the token gates them all, and the secret is asked besides."""
    app = create_app(run_dir, token="s3cret")
    browser = TestClient(app, base_url=ADDRESS)
    secret = page_secret(browser, "/compare?token=s3cret")  # the page also sets the token's cookie
    stranger = TestClient(app, base_url=ADDRESS, headers={SECRET_HEADER: secret})
    for path, body in [("/api/next", {"kind": "compare", "who": "mallory"}),
                       ("/api/queries/0/answer", {"choice": "left", "who": "mallory"}),
                       ("/api/queries/3/marks", {"marks": [], "who": "mallory"}),
                       ("/api/queries/0/hold", {"who": "mallory"})]:
        assert stranger.post(path, json=body).status_code == 401, path
        assert stranger.post(path, json=body, headers={"X-Token": "wrong"}).status_code == 401, path
    assert rows(run_dir, "SELECT * FROM answers") == []
    assert rows(run_dir, "SELECT id FROM queries WHERE assigned_to IS NOT NULL") == []
    assert browser.post("/api/queries/0/answer", json={"choice": "left", "who": "ann"}).status_code == 403  # no secret
    assert browser.post("/api/queries/0/answer", json={"choice": "left", "who": "ann"},
                        headers={SECRET_HEADER: secret}).json()["stored"]  # token by cookie
    assert stranger.post("/api/queries/1/answer", json={"choice": "left", "who": "bob"},
                         headers={"X-Token": "s3cret"}).json()["stored"]


def test_the_label_command_says_its_port_is_taken_before_printing_an_address(run_dir, capsys):
    (run_dir / "config.yaml").write_text("reward: preferences\nlabeler: people\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["label", str(run_dir), "--port", str(port)]) == 2
    out, err = capsys.readouterr()
    assert "http://" not in out
    assert err.count("\n") == 1 and f"port {port}" in err and "taken" in err and "--port" in err


@pytest.mark.parametrize("port", ["70000", "65536", "-1"])
def test_the_label_command_refuses_a_port_out_of_range_in_one_line(run_dir, capsys, port):
    (run_dir / "config.yaml").write_text("reward: preferences\nlabeler: people\n")
    assert main(["label", str(run_dir), "--port", port]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--port must be from 0 to 65535, got {port}" in err


@pytest.mark.parametrize("where", ["read-only disk", "full disk"])
def test_the_label_command_on_a_run_it_cannot_write_stops_in_one_line(where, small_disks, capsys, monkeypatch):
    disk = small_disks.mount("size=1m")
    (disk / "config.yaml").write_text("reward: preferences\nlabeler: people\n")
    if where == "read-only disk":
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    else:
        small_disks.fill(disk)
    monkeypatch.setattr(uvicorn.Server, "run", lambda *args, **kwargs: pytest.fail("the server started"))
    assert main(["label", str(disk), "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err[-3000:]
    assert err.startswith(f"rlhf-jax label: stopped: cannot serve {disk}: ")
    assert not [p.name for p in disk.iterdir() if SECRET_FILE in p.name]  # no half-made secret


def test_the_label_command_refuses_a_public_address_without_a_token(run_dir, capsys, monkeypatch):
    monkeypatch.delenv("RLHF_JAX_TOKEN", raising=False)
    (run_dir / "config.yaml").write_text("reward: preferences\nlabeler: people\n")
    assert main(["label", str(run_dir), "--host", "0.0.0.0"]) == 2
    assert "--token" in capsys.readouterr().err


def test_the_label_command_refuses_a_run_the_oracle_labels(run_dir, capsys):
    (run_dir / "config.yaml").write_text("reward: preferences\n")
    assert main(["label", str(run_dir)]) == 2
    assert "labeler" in capsys.readouterr().err
    assert main(["label", str(run_dir / "nowhere")]) == 2


@pytest.mark.parametrize("people, message", [
    ("{assignment_timeout_s: 0}", "people.assignment_timeout_s must be a positive number"),
    ("{heartbeat_timeout_s: -1}", "people.heartbeat_timeout_s must be a positive number"),
    ("{instructions: x}", "unknown key 'people.instructions'"),
])
def test_the_label_command_checks_the_people_section(run_dir, capsys, people, message):
    (run_dir / "config.yaml").write_text(f"reward: preferences\nlabeler: people\npeople: {people}\n")
    assert main(["label", str(run_dir)]) == 2
    assert message in capsys.readouterr().err


def test_the_label_command_serves_a_run_without_importing_jax_or_an_agent(tmp_path):
    """`rlhf-jax label` reads only the run's people section: no JAX, flax, optax, orbax or agent,
    so it starts at once, on any machine. A fresh interpreter, as the command line is."""
    (tmp_path / "config.yaml").write_text("reward: ibt\nlabeler: people\npeople:\n  instruction: Mark the falls.\n")
    script = f"""
import sys
import uvicorn
from starlette.testclient import TestClient
from rlhf_jax.cli import main

def run(server, sockets):  # instead of serving: what has been imported by now, and the page
    print("imported:", [m for m in ("jax", "flax", "optax", "orbax", "rlhf_jax.agents") if m in sys.modules])
    port = sockets[0].getsockname()[1]
    page = TestClient(server.config.app, base_url=f"http://127.0.0.1:{{port}}").get("/")
    print("page:", page.url.path, "Mark the falls." in page.text)

uvicorn.Server.run = run
sys.exit(main(["label", {str(tmp_path)!r}, "--port", "0"]))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode == 0, result.stderr
    assert "imported: []" in result.stdout and "page: /annotate True" in result.stdout

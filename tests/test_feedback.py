"""The label store, the training side's PeopleLabeler, and every endpoint of the labeling app."""
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient

from rlhf_jax.cli import main
from rlhf_jax.feedback.config import PeopleConfig
from rlhf_jax.feedback.labeler import ANNOTATE_MIN_SECONDS, PeopleLabeler
from rlhf_jax.feedback.store import STORE_FILE, LabelStore
from rlhf_jax.feedback.webapp import TOKEN_COOKIE, create_app
from rlhf_jax.reward.people import Query

CLIP_BYTES = b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 4  # stands in for an MP4


def fake_render(obs, path, fps):
    """Writes a stand-in clip: these tests are about the store and the app, not about video."""
    path.write_bytes(CLIP_BYTES)


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
    return TestClient(create_app(run_dir, PeopleConfig(assignment_timeout_s=0.3, instruction="Keep the pole up.")))


def rows(run_dir, sql):
    with sqlite3.connect(run_dir / STORE_FILE) as db:
        return db.execute(sql).fetchall()


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


def test_status_counts_answered_and_waiting(client):
    assert client.get("/api/status").json() == {"compare": {"answered": 0, "waiting": 3},
                                                "annotate": {"answered": 0, "waiting": 1}}
    client.post("/api/queries/0/answer", json={"choice": "tie", "who": "ann"})
    assert client.get("/api/status").json()["compare"] == {"answered": 1, "waiting": 2}


# --------------------------------------------------- several people at once
def test_a_query_goes_to_one_person_at_a_time_and_back_after_the_timeout(client):
    ask = lambda who, kind="compare": client.post("/api/next", json={"kind": kind, "who": who}).json()["query"]
    first = ask("ann")
    assert first["id"] == 0 and first["clips"] == ["/clips/q0_0.mp4", "/clips/q0_1.mp4"]
    assert (first["frames"], first["fps"]) == (5, 50.0)
    assert ask("bob")["id"] == 1  # ann holds 0
    assert ask("ann")["id"] == 0  # a reload shows ann her own query again
    assert ask("cy")["id"] == 2
    assert ask("dee") is None  # all three held
    time.sleep(0.35)  # past the time-out: unanswered queries return to the pool
    assert ask("dee")["id"] == 0
    episode = ask("ann", "annotate")
    assert episode["kind"] == "annotate" and episode["clips"] == ["/clips/q3_0.mp4"]


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


def test_a_body_that_is_not_json_is_400(client):
    response = client.post("/api/queries/0/answer", content=b"choice=left", headers={"Content-Type": "text/plain"})
    assert response.status_code == 400


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


# ------------------------------------------------------------------- access
def test_with_a_token_every_request_must_carry_it(run_dir):
    client = TestClient(create_app(run_dir, token="s3cret"))
    assert client.get("/compare").status_code == 401
    assert client.get("/api/status").status_code == 401
    assert client.get("/clips/q0_0.mp4").status_code == 401
    assert client.get("/api/status", headers={"X-Token": "wrong"}).status_code == 401
    assert client.get("/api/status", headers={"X-Token": "s3cret"}).status_code == 200
    page = client.get("/compare?token=s3cret")
    assert page.status_code == 200 and page.cookies.get(TOKEN_COOKIE) == "s3cret"
    assert client.get("/clips/q0_0.mp4").status_code == 200  # the page's cookie now lets the browser in


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

def run(app, **options):  # instead of serving: what has been imported by now, and the page
    print("imported:", [m for m in ("jax", "flax", "optax", "orbax", "rlhf_jax.agents") if m in sys.modules])
    page = TestClient(app).get("/")
    print("page:", page.url.path, "Mark the falls." in page.text)

uvicorn.run = run
sys.exit(main(["label", {str(tmp_path)!r}]))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode == 0, result.stderr
    assert "imported: []" in result.stdout and "page: /annotate True" in result.stdout

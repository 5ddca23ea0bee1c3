"""Killing the web app and the training run in the middle of labeling loses no answer and no query.

Real processes: ``rlhf-jax train`` with ``labeler=people`` and ``rlhf-jax label``, answered
over HTTP as the page would; both are killed with SIGKILL after two of the four initial
queries are answered, started again, training is killed again right after its first
checkpoint (while the clips of the queries it counts as asked are still being made), started
again, and the run asks every query of its budget once and trains on every answer given.
SIGTERM stops a people run cleanly.
"""
import json
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from compiling import ROOT, child_environment
from rlhf_jax.reward.people import Answer, HostLabels, Query

OVERRIDES = ["a2c.total_env_steps=8192", "run.chunk_env_steps=4096", "run.checkpoint_every_updates=1",
             "preferences.labels=16", "preferences.segment_capacity=32", "preferences.fit_pairs_per_env_step=0.01",
             "run.tensorboard=false"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(*words, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rlhf_jax.cli", *words], cwd=ROOT, env=child_environment(),
                            stdout=log.open("a"), stderr=subprocess.STDOUT)


def post(url: str, body: dict) -> dict:
    """As the label page does: JSON, with the secret the page carries."""
    page = urllib.request.urlopen(url.split("/api/")[0] + "/compare", timeout=10).read().decode()
    secret = re.search(r'<meta name="label-secret" content="([^"]+)">', page).group(1)
    request = urllib.request.Request(url, json.dumps(body).encode(),
                                     {"Content-Type": "application/json", "X-Label-Secret": secret})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def wait_for(condition, what: str, timeout: float, logs=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    shown = "\n".join(f"--- {log}:\n{log.read_text()[-3000:]}" for log in logs if log.exists())
    raise AssertionError(f"timed out waiting for {what}\n{shown}")


def label_server(run_dir: Path, log: Path):
    port = free_port()
    server = start("label", str(run_dir), "--port", str(port), log=log)
    url = f"http://127.0.0.1:{port}"

    def up():
        try:
            return urllib.request.urlopen(f"{url}/api/status", timeout=2).status == 200
        except OSError:
            return False

    wait_for(up, "the label server", 60, [log])
    return server, url


def answer_one(url: str, choice: str) -> int | None:
    query = post(f"{url}/api/next", {"kind": "compare", "who": "tester"})["query"]
    if query is None:
        return None
    post(f"{url}/api/queries/{query['id']}/answer", {"choice": choice, "who": "tester", "seconds": 1.0})
    return query["id"]


@pytest.mark.slow
def test_a_killed_app_and_training_run_lose_no_answered_query(tmp_path):
    run_dir, train_log, label_log = tmp_path / "run", tmp_path / "train.log", tmp_path / "label.log"
    logs = [train_log, label_log]
    db = lambda sql: sqlite3.connect(run_dir / "labels.sqlite").execute(sql).fetchall()
    train = start("train", "configs/rlhf_cartpole_people.yaml", f"run.dir={run_dir}", *OVERRIDES, log=train_log)
    try:
        wait_for(lambda: (run_dir / "config.yaml").exists(), "the run directory", 120, logs)
        server, url = label_server(run_dir, label_log)
        # The four initial queries (25% of 16) appear once their clips are rendered.
        status = lambda: json.loads(urllib.request.urlopen(f"{url}/api/status", timeout=10).read())["compare"]
        wait_for(lambda: status()["waiting"] == 4, "the initial queries", 300, logs)
        answered = [answer_one(url, "left"), answer_one(url, "cant_tell")]
        for process in (train, server):
            process.send_signal(signal.SIGKILL)
            process.wait()
        assert sorted(db("SELECT query_id, choice FROM answers")) == sorted(zip(answered, ["left", "cant_tell"]))

        train = start("train", "--resume", str(run_dir), log=train_log)
        server, url = label_server(run_dir, label_log)
        for row in db("SELECT query_id, choice FROM answers"):
            assert row in zip(answered, ["left", "cant_tell"])  # still there after both restarted

        # RL starts once the initial queries are answered; kill training as soon as its first
        # checkpoint exists: it counts the queries of chunk 0 as asked, whose clips are still
        # being made (those queries were lost, and a normal end dropped the ones not yet made).
        first_checkpoint = run_dir / "checkpoints" / "0"

        def answer_until_saved():
            if not first_checkpoint.exists():
                answer_one(url, "right")
            return first_checkpoint.exists()

        wait_for(answer_until_saved, "the first checkpoint", 400, logs)
        train.send_signal(signal.SIGKILL)
        train.wait()
        train = start("train", "--resume", str(run_dir), log=train_log)

        def keep_answering():
            answer_one(url, "right")
            return train.poll() is not None

        wait_for(keep_answering, "the run to finish", 400, logs)
        assert train.returncode == 0, train_log.read_text()[-3000:]
        server.send_signal(signal.SIGKILL)
    finally:
        for process in (train, locals().get("server")):
            if process is not None and process.poll() is None:
                process.kill()
    # The restarted run asked no query twice and trained on every answer but "can't tell" that
    # reached it: those its last checkpoint holds (an answer given while the finished run was
    # still writing its files arrives too late: it stays in the store, and the export adds it).
    assert [q for q, in db("SELECT id FROM queries ORDER BY id")] == list(range(16))  # the budget, each once
    trained = [q for q, choice in db("SELECT query_id, choice FROM answers WHERE in_checkpoint") if choice != "cant_tell"]
    with np.load(run_dir / "labels.npz") as labels:
        assert len(labels["mu"]) == len(trained)
        for query_id in trained:
            with np.load(run_dir / "queries" / f"q{query_id}.npz") as query:
                matches = [np.array_equal(query["obs"], pair) for pair in labels["obs"]]
            assert sum(matches) == 1, f"query {query_id} is not among the trained labels exactly once"
    assert answered[0] in trained


@pytest.mark.slow
def test_sigterm_stops_a_people_run_cleanly(tmp_path):
    """SDL (pygame draws the clips) took SIGTERM for itself, and a people run went on training."""
    run_dir, log = tmp_path / "run", tmp_path / "train.log"
    train = start("train", "configs/rlhf_cartpole_people.yaml", f"run.dir={run_dir}", *OVERRIDES, log=log)
    try:
        clips = run_dir / "clips"
        wait_for(lambda: clips.is_dir() and len(list(clips.glob("*.mp4"))) >= 2, "the first clips", 300, [log])
        train.send_signal(signal.SIGTERM)
        assert train.wait(timeout=60) == 128 + signal.SIGTERM, log.read_text()[-3000:]
    finally:
        if train.poll() is None:
            train.kill()
    text = log.read_text()
    assert "rlhf-jax train: stopped: interrupted by SIGTERM before it finished a chunk. No checkpoint was saved " \
           f"yet: rlhf-jax train --resume {run_dir.resolve()} starts the run again from the beginning." in text
    assert "Traceback" not in text


def test_a_checkpoint_names_the_answers_its_state_holds_and_a_restore_tells_the_labeler():
    """A run killed after writing checkpoint 0 but before telling the store was given the
    answers in it again on its resume, and trained on them twice (10 labels from 7 answers)."""
    class Recorder:
        def __init__(self):
            self.ready, self.saved, self.restored = [], [], []

        def ask(self, queries):
            pass

        def answers(self):
            ready, self.ready = self.ready, []
            return ready

        def checkpoint_saved(self, ids):
            self.saved.append(ids)

        def restore(self, in_checkpoint):
            self.restored.append(in_checkpoint)
            return [], 0

    recorder = Recorder()
    host = HostLabels(recorder)
    empty = np.zeros((2, 3, 1), np.float32)
    host.ask([Query(i, "compare", empty, empty, empty) for i in range(4)])
    recorder.ready = [Answer(1, 0.0), Answer(0, 1.0), Answer(9, 1.0)]  # 9 was never asked: ignored
    assert [q.id for q, _ in host.arrived()] == [1, 0]
    assert host.in_state() == [0, 1]
    host.checkpoint_saved()
    recorder.ready = [Answer(2, 0.5)]
    host.arrived()
    host.checkpoint_saved()
    assert recorder.saved == [[0, 1], [0, 1, 2]] and set(host.pending) == {3}

    restarted = HostLabels(recorder)
    restarted.restore(4, [0, 1])  # the checkpoint restored holds answers 0 and 1
    assert recorder.restored == [[0, 1]] and restarted.in_state() == [0, 1]


@pytest.mark.parametrize("asked, next_id, expected", [(5, 8, 8), (9, 8, 9)])
def test_a_restored_run_numbers_queries_after_every_query_the_store_holds(asked, next_id, expected):
    class Durable:
        def restore(self, in_checkpoint):
            return [Query(7, "compare", None, None, None)], next_id

    host = HostLabels(Durable())
    assert host.restore(asked, None) == expected and set(host.pending) == {7}

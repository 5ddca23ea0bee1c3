"""The label store: one SQLite file per run, shared by the training loop and the web app.

Christiano et al. ran the labelers, the reward predictor and the agent as asynchronous
processes (section 2.2). Here the two sides that people touch meet in ``labels.sqlite``
in the run directory, in WAL mode so that the web app's reads and writes never block
training for long and a killed process never leaves a half-written answer:

* ``queries``: what was asked: two segments to compare or one episode to mark, their
  clips (file names under ``clips/``), the ``.npz`` holding their observations (under
  ``queries/``), when they were asked, their priority (their rank in the disagreement
  order: lower first), who has them on screen since when (``assigned_to``/``_at``), and
  when that person's page last said it still shows them (``seen_at``);
* ``answers``: left, right, tie, can't tell (or ``marked`` for an annotated episode), who
  answered, when, and how long it took; ``in_checkpoint`` once training has saved a
  checkpoint that holds the label;
* ``marks``: the IBT marks of an annotated episode: step, sign (+1 progress, -1 regress), who.

A query is handed to one person at a time (a "hold") and goes back to the pool if that
person has not answered within the assignment time-out, or sooner once their page stops
renewing the hold (:class:`rlhf_jax.feedback.config.PeopleConfig`). Answers are final:
the first one stands, and answering again changes nothing (idempotent), so a double click
or a retried request is harmless. "Can't tell" is kept here but never trained on, as in the paper.
"""
from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from pathlib import Path
from typing import NamedTuple

from rlhf_jax.feedback.config import PeopleConfig
from rlhf_jax.reward import kinds
from rlhf_jax.reward.kinds import CHOICE_MU, IBT, PREFERENCES

STORE_FILE = "labels.sqlite"
CHOICES = tuple(CHOICE_MU)  # a comparison's answers: left, right, tie, cant_tell
KINDS = tuple(kind.name for kind in kinds.KINDS)  # a query's kind, as the store keeps it: its FeedbackKind's name

SCHEMA = """
CREATE TABLE IF NOT EXISTS queries (
    id          INTEGER PRIMARY KEY,  -- the training loop's query number
    kind        TEXT NOT NULL CHECK (kind IN ('compare', 'annotate')),
    clips       TEXT NOT NULL,        -- JSON list of file names under clips/ (2, or 1 episode)
    segments    TEXT NOT NULL,        -- file name under queries/: obs, action, oracle_reward
    frames      INTEGER NOT NULL,     -- steps per segment (episode)
    fps         REAL NOT NULL,
    asked_at    REAL NOT NULL,
    priority    INTEGER NOT NULL DEFAULT 0,
    assigned_to TEXT,
    assigned_at REAL,
    seen_at     REAL                  -- the holder's page last renewed its hold
);
CREATE TABLE IF NOT EXISTS answers (
    query_id      INTEGER PRIMARY KEY REFERENCES queries(id),
    choice        TEXT NOT NULL CHECK (choice IN ('left', 'right', 'tie', 'cant_tell', 'marked')),
    who           TEXT NOT NULL,
    answered_at   REAL NOT NULL,
    seconds       REAL,               -- from the clips' showing to the answer
    in_checkpoint INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS marks (
    query_id INTEGER NOT NULL REFERENCES queries(id),
    step     INTEGER NOT NULL,
    sign     INTEGER NOT NULL CHECK (sign IN (-1, 1)),
    who      TEXT NOT NULL,
    PRIMARY KEY (query_id, step)
);
CREATE INDEX IF NOT EXISTS queries_by_kind ON queries (kind, asked_at, priority);
"""
# When a hold ends: the assignment time-out, or the page's silence, whichever comes first
# (0, long over, for a query never handed out). The one rule for who holds what.
HOLD_ENDS = "COALESCE(MIN(q.assigned_at + :timeout, q.seen_at + :heartbeat), 0)"
# SQLite's integers are 64-bit: a larger id names no query (and would overflow the driver).
ID_RANGE = range(-2**63, 2**63)
# How long a person may take over one answer: longer than any real sitting, short of absurd.
MAX_SECONDS = 7 * 24 * 3600.0


class UnknownQuery(KeyError):
    """No query has this id (the web app answers 404)."""


class BadAnswer(ValueError):
    """An answer that cannot be stored as given (the web app answers 400)."""


def check_who(who) -> None:
    # Stored as UTF-8, which half of a UTF-16 surrogate pair (JSON's "\ud800") cannot be.
    if (not isinstance(who, str) or not who.strip() or len(who) > 100
            or any("\ud800" <= c <= "\udfff" for c in who)):
        raise BadAnswer("who must be a name of 1 to 100 characters")


def check_seconds(seconds) -> None:
    # A range check that inf and nan fail too; an answer's time must come back out as JSON.
    if seconds is not None and not (isinstance(seconds, (int, float)) and 0 <= seconds <= MAX_SECONDS):
        raise BadAnswer(f"seconds must be a number from 0 to {MAX_SECONDS:.0f}, got {seconds!r}")


def check_kind(kind) -> None:
    if kind not in KINDS:
        raise BadAnswer(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")


def check_id(query_id: int) -> None:
    if query_id not in ID_RANGE:
        raise UnknownQuery(query_id)


class QueryRow(NamedTuple):
    id: int
    kind: str
    clips: list[str]
    segments: str
    frames: int
    fps: float


class AnswerRow(NamedTuple):
    query_id: int
    kind: str
    choice: str
    who: str
    answered_at: float
    seconds: float | None
    marks: list[tuple[int, int]]  # (step, sign), by step


class Hold(NamedTuple):
    who: str
    expires_in_s: float  # then the query goes back to the pool, unless renewed


class Counts(NamedTuple):
    """The queries of one kind as one person sees them."""

    answered: int
    waiting: int  # not yet answered, held or not
    for_you: int  # not yet answered and not held by anyone else (their own hold included)
    held_by_others: list[Hold]  # soonest free first


def read_answered(path: str | Path, kind: str) -> list[tuple[QueryRow, AnswerRow]]:
    """Every answered query of ``kind`` in the store at ``path`` with its answer, oldest answer
    first, the store opened read-only: for reading a finished run (``rlhf-jax labels export``),
    which must not write to it."""
    check_kind(kind)
    db = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True, timeout=30)
    try:
        rows = db.execute(
            "SELECT q.id, q.kind, q.clips, q.segments, q.frames, q.fps, a.choice, a.who, a.answered_at, a.seconds"
            " FROM answers a JOIN queries q ON q.id = a.query_id WHERE q.kind = ? ORDER BY a.answered_at, q.id",
            (kind,)).fetchall()
        return [(QueryRow(i, kind, json.loads(clips), segments, frames, fps),
                 AnswerRow(i, kind, choice, who, answered_at, seconds, LabelStore._marks(db, i)))
                for i, kind, clips, segments, frames, fps, choice, who, answered_at, seconds in rows]
    finally:
        db.close()


class LabelStore:
    """``labels.sqlite`` of one run; safe to use from several threads and processes at once.

    ``people`` says how long holds last (the training side, which hands out none, need not say)."""

    def __init__(self, path: str | Path, people: PeopleConfig = PeopleConfig()):
        self.path = Path(path)
        self.people = people
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, timeout=30)
        try:
            db.execute("PRAGMA journal_mode=WAL")  # persistent: every later connection uses it
            db.executescript(SCHEMA)
            if "seen_at" not in [column[1] for column in db.execute("PRAGMA table_info(queries)")]:
                db.execute("ALTER TABLE queries ADD COLUMN seen_at REAL")  # a store made before holds were renewed
        finally:
            db.close()

    def _hold_times(self, **more) -> dict:
        """The parameters of :data:`HOLD_ENDS`, now, and ``more``."""
        return {"timeout": self.people.assignment_timeout_s, "heartbeat": self.people.heartbeat_timeout_s,
                "now": time.time(), **more}

    @contextlib.contextmanager
    def _connect(self):
        """One connection per operation: cheap, and never shared between threads.

        ``BEGIN IMMEDIATE`` takes the write lock at once, so two people asking for the
        next query at the same moment cannot both be handed the same one."""
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            db.execute("PRAGMA busy_timeout = 30000")
            db.execute("PRAGMA synchronous = NORMAL")  # durable at each WAL checkpoint; safe with WAL
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            db.close()

    # ------------------------------------------------------------ training's side
    def add_query(self, query_id: int, kind: str, clips: list[str], segments: str, frames: int, fps: float,
                  priority: int = 0) -> None:
        """Make a query visible to people (its clips and arrays already on disk)."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        with self._connect() as db:
            db.execute("INSERT OR REPLACE INTO queries (id, kind, clips, segments, frames, fps, asked_at, priority)"
                       " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (query_id, kind, json.dumps(clips), segments, frames, fps, time.time(), priority))

    def answers_not_in_checkpoint(self) -> list[AnswerRow]:
        """Every answer training has not yet saved in a checkpoint, oldest first."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT a.query_id, q.kind, a.choice, a.who, a.answered_at, a.seconds FROM answers a"
                " JOIN queries q ON q.id = a.query_id WHERE a.in_checkpoint = 0 ORDER BY a.answered_at").fetchall()
            return [AnswerRow(*row, self._marks(db, row[0])) for row in rows]

    def queries_not_in_checkpoint(self) -> list[QueryRow]:
        """Queries whose label is not yet in a saved checkpoint: unanswered, or answered since."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT q.id, q.kind, q.clips, q.segments, q.frames, q.fps FROM queries q"
                " LEFT JOIN answers a ON a.query_id = q.id WHERE a.in_checkpoint IS NOT 1 ORDER BY q.id").fetchall()
        return [QueryRow(i, kind, json.loads(clips), segments, frames, fps)
                for i, kind, clips, segments, frames, fps in rows]

    def mark_in_checkpoint(self, query_ids) -> None:
        """Training saved a checkpoint holding these answers: they need never be delivered again."""
        ids = [(int(i),) for i in query_ids]
        with self._connect() as db:
            db.executemany("UPDATE answers SET in_checkpoint = 1 WHERE query_id = ?", ids)

    def set_in_checkpoint(self, query_ids) -> None:
        """Training's checkpoint holds exactly these answers: they need never be delivered
        again, and every other answer must be (a restore may go back to an older checkpoint)."""
        ids = [(int(i),) for i in query_ids]
        with self._connect() as db:
            db.execute("CREATE TEMP TABLE IF NOT EXISTS saved (query_id INTEGER PRIMARY KEY)")
            db.execute("DELETE FROM saved")
            db.executemany("INSERT OR IGNORE INTO saved VALUES (?)", ids)
            db.execute("UPDATE answers SET in_checkpoint = (query_id IN (SELECT query_id FROM saved))")

    def last_query_id(self) -> int:
        """The highest query id ever stored (-1 for none): a resumed run numbers on from here."""
        with self._connect() as db:
            return db.execute("SELECT COALESCE(MAX(id), -1) FROM queries").fetchone()[0]

    # ---------------------------------------------------------- people's side
    def next_query(self, kind: str, who: str) -> QueryRow | None:
        """The query to show ``who`` next, now held by them; ``None`` when none is waiting.

        A person who reloads the page gets back the query they already hold; otherwise the
        oldest free query (best first within its batch), where a hold that has ended
        (:data:`HOLD_ENDS`) counts as free."""
        check_kind(kind)
        check_who(who)
        with self._connect() as db:
            times = self._hold_times(kind=kind, who=who)
            row = db.execute(
                "SELECT q.id, q.kind, q.clips, q.segments, q.frames, q.fps FROM queries q"
                " WHERE q.kind = :kind AND NOT EXISTS (SELECT 1 FROM answers a WHERE a.query_id = q.id)"
                f" AND (q.assigned_to IS NULL OR q.assigned_to = :who OR {HOLD_ENDS} <= :now)"
                " ORDER BY (q.assigned_to IS :who) DESC, q.asked_at, q.priority, q.id LIMIT 1", times).fetchone()
            if row is None:
                return None
            db.execute("UPDATE queries SET assigned_to = :who, assigned_at = :now, seen_at = :now WHERE id = :id",
                       {**times, "id": row[0]})
        i, kind, clips, segments, frames, fps = row
        return QueryRow(i, kind, json.loads(clips), segments, frames, fps)

    def renew(self, query_id: int, who: str) -> bool:
        """``who``'s page still shows the query: keep holding it for them. False when it is no
        longer theirs to hold (answered, or handed to someone else after their hold ended)."""
        check_who(who)
        check_id(query_id)
        with self._connect() as db:
            return db.execute(
                "UPDATE queries AS q SET seen_at = :now WHERE q.id = :id AND q.assigned_to = :who"
                " AND NOT EXISTS (SELECT 1 FROM answers a WHERE a.query_id = q.id)"
                f" AND {HOLD_ENDS} > :now", self._hold_times(id=query_id, who=who)).rowcount == 1

    def answer(self, query_id: int, choice: str, who: str, seconds: float | None = None) -> tuple[bool, AnswerRow]:
        """Store a comparison's answer; ``(stored, the answer that stands)``.

        Raises :class:`UnknownQuery` for an id never asked, :class:`BadAnswer` for a choice
        outside :data:`CHOICES` or a query that asks for marks. A second answer to the same
        query stores nothing and returns the first."""
        if choice not in CHOICES:
            raise BadAnswer(f"choice must be one of {', '.join(CHOICES)}, got {choice!r}")
        return self._store_answer(query_id, PREFERENCES.name, choice, who, seconds, [])

    def submit_marks(self, query_id: int, marks, who: str, seconds: float | None = None) -> tuple[bool, AnswerRow]:
        """Store an annotated episode's marks ``[(step, sign)]`` (possibly none: nothing happened).

        Raises :class:`BadAnswer` for a step outside the episode, a sign other than +1/-1,
        two marks on one step, or a query that asks for a comparison."""
        marks = sorted((int(step), int(sign)) for step, sign in marks)
        steps = [step for step, _ in marks]
        if len(set(steps)) != len(steps):
            raise BadAnswer("two marks on the same step")
        if any(sign not in (-1, 1) for _, sign in marks):
            raise BadAnswer("a mark's sign must be +1 (progress) or -1 (regress)")
        return self._store_answer(query_id, IBT.name, "marked", who, seconds, marks)

    def _store_answer(self, query_id, kind, choice, who, seconds, marks):
        check_who(who)
        check_seconds(seconds)
        check_id(query_id)
        with self._connect() as db:
            row = db.execute("SELECT kind, frames FROM queries WHERE id = ?", (query_id,)).fetchone()
            if row is None:
                raise UnknownQuery(query_id)
            if row[0] != kind:
                raise BadAnswer(f"query {query_id} asks to {row[0]}, not to {kind}")
            if any(not 0 <= step < row[1] for step, _ in marks):
                raise BadAnswer(f"a mark's step must lie in [0, {row[1]})")
            stored = db.execute(
                "INSERT OR IGNORE INTO answers (query_id, choice, who, answered_at, seconds) VALUES (?, ?, ?, ?, ?)",
                (query_id, choice, who, time.time(), seconds)).rowcount == 1
            if stored:
                db.executemany("INSERT INTO marks (query_id, step, sign, who) VALUES (?, ?, ?, ?)",
                               [(query_id, step, sign, who) for step, sign in marks])
            first = db.execute("SELECT query_id, choice, who, answered_at, seconds FROM answers WHERE query_id = ?",
                               (query_id,)).fetchone()
            return stored, AnswerRow(first[0], kind, *first[1:], self._marks(db, query_id))

    def query(self, query_id: int) -> QueryRow:
        check_id(query_id)
        with self._connect() as db:
            row = db.execute("SELECT id, kind, clips, segments, frames, fps FROM queries WHERE id = ?",
                             (query_id,)).fetchone()
        if row is None:
            raise UnknownQuery(query_id)
        return QueryRow(row[0], row[1], json.loads(row[2]), *row[3:])

    def counts(self, kind: str, who: str | None = None) -> Counts:
        """The queries of one kind: answered, waiting, and of those waiting, which are free for
        ``who`` (their own hold included) and which others hold, until when."""
        check_kind(kind)
        with self._connect() as db:
            times = self._hold_times(kind=kind, who=who)
            total, answered = db.execute(
                "SELECT COUNT(*), COUNT(a.query_id) FROM queries q LEFT JOIN answers a ON a.query_id = q.id"
                " WHERE q.kind = :kind", times).fetchone()
            held = [Hold(*row) for row in db.execute(
                f"SELECT q.assigned_to, {HOLD_ENDS} - :now FROM queries q WHERE q.kind = :kind"
                " AND NOT EXISTS (SELECT 1 FROM answers a WHERE a.query_id = q.id)"
                f" AND q.assigned_to IS NOT :who AND {HOLD_ENDS} > :now ORDER BY 2", times)]
        return Counts(answered, total - answered, total - answered - len(held), held)

    @staticmethod
    def _marks(db, query_id: int) -> list[tuple[int, int]]:
        return [tuple(row) for row in db.execute(
            "SELECT step, sign FROM marks WHERE query_id = ? ORDER BY step", (query_id,))]

"""Tuning database (DESIGN.md ⑪): SQLite in WAL mode, one row per measurement, committed on arrival.

A tuning run killed at any moment resumes with every reported measurement in the database and
re-measures none of them. Rows are plain JSON (never pickle); ``export_jsonl`` / ``import_jsonl``
share them between machines.

Example:
    >>> import felixjax as fj, tempfile, os
    >>> db = fj.Database(os.path.join(tempfile.mkdtemp(), "runs.db"))
    >>> len(db)
    0
"""
from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from codegen.measure import MeasureResult
from codegen.ops import Task
from codegen.space import Config
from codegen.target import Target

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    task_key TEXT NOT NULL,
    target_key TEXT NOT NULL,
    run TEXT NOT NULL,
    trial INTEGER NOT NULL,
    sketch TEXT NOT NULL,
    config TEXT NOT NULL,
    status TEXT NOT NULL,
    latency REAL,
    latencies TEXT NOT NULL,
    error TEXT NOT NULL,
    build_s REAL NOT NULL,
    run_s REAL NOT NULL,
    timestamp REAL NOT NULL,
    elapsed_s REAL NOT NULL,
    flops INTEGER NOT NULL,
    task TEXT NOT NULL,
    target TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS records_task ON records (task_key, target_key, run);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

_COLUMNS = ("task_key", "target_key", "run", "trial", "sketch", "config", "status", "latency", "latencies",
            "error", "build_s", "run_s", "timestamp", "elapsed_s", "flops", "task", "target")


@dataclass(frozen=True)
class TuningRecord:
    """One measured candidate: what was measured, where, and what came out.

    Attributes:
        task: the workload.
        target_key: ``Target.key`` of the machine it ran on (``target`` holds the full JSON).
        run: the tuning run it belongs to (e.g. ``"gradient:0"``); budgets and resumption count per run.
        trial: index of the candidate within its run (0-based; failures count as trials).
        config: the schedule (its ``sketch`` names the loop structure).
        result: status, latencies (seconds per call, one per repeat), error text, timings.
        elapsed_s: seconds since the start of the run when the result arrived.
    """

    task: Task
    target_key: str
    run: str
    trial: int
    config: Config
    result: MeasureResult
    elapsed_s: float = 0.0
    target: dict = field(default_factory=dict, compare=False, repr=False)
    id: int | None = field(default=None, compare=False)

    @property
    def ok(self) -> bool:
        return self.result.ok

    @property
    def status(self) -> str:
        return self.result.status

    @property
    def latency_s(self) -> float:
        """Median seconds per call (inf for a failed candidate: it is never counted as fast)."""
        return self.result.latency_s

    @property
    def gflops(self) -> float:
        lat = self.latency_s
        return self.task.flops / lat / 1e9 if math.isfinite(lat) and lat > 0 else 0.0

    @property
    def sketch(self) -> str:
        return self.config.sketch

    def to_json(self) -> dict:
        return {"task": self.task.to_json(), "target_key": self.target_key, "target": self.target, "run": self.run,
                "trial": self.trial, "config": self.config.to_json(), "result": self.result.to_json(),
                "elapsed_s": self.elapsed_s}

    @staticmethod
    def from_json(d: dict) -> "TuningRecord":
        return TuningRecord(Task.from_json(d["task"]), d["target_key"], d["run"], int(d["trial"]),
                            Config.from_json(d["config"]), MeasureResult.from_json(d["result"]),
                            float(d.get("elapsed_s", 0.0)), d.get("target") or {})


def _target_key(target: Target | str) -> str:
    return target if isinstance(target, str) else target.key


class Database:
    """SQLite store of tuning records; safe to open from several threads of one process.

    Args:
        path: database file (created if missing). ``":memory:"`` works for tests.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        if self.path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(self.path)) or ".", exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.executescript(_SCHEMA)
        except sqlite3.DatabaseError as e:
            raise ValueError(f"{self.path}: not a felixjax database ({e})") from None

    def __repr__(self) -> str:
        return f"Database({self.path!r}, {len(self)} records)"

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __len__(self) -> int:
        with self._lock:
            return self._conn.execute("SELECT COUNT(*) FROM records").fetchone()[0]

    # ---- writing -------------------------------------------------------------------------------
    def add(self, rec: TuningRecord) -> TuningRecord:
        """Insert and commit one record (a few microseconds against ~0.2 s of measuring)."""
        r = rec.result
        row = (rec.task.key, rec.target_key, rec.run, rec.trial, rec.config.sketch, rec.config.dumps(), r.status,
               r.latency_s if r.ok else None, json.dumps(list(r.latencies)), r.error, r.build_s, r.run_s,
               r.timestamp, rec.elapsed_s, rec.task.flops, json.dumps(rec.task.to_json(), sort_keys=True),
               json.dumps(rec.target, sort_keys=True))
        with self._lock:
            cur = self._conn.execute(f"INSERT INTO records ({', '.join(_COLUMNS)}) VALUES "
                                     f"({', '.join('?' * len(_COLUMNS))})", row)
        return TuningRecord(rec.task, rec.target_key, rec.run, rec.trial, rec.config, rec.result, rec.elapsed_s,
                            rec.target, cur.lastrowid)

    # ---- reading -------------------------------------------------------------------------------
    def _rows(self, where: str, args: tuple, order: str = "id") -> Iterator[TuningRecord]:
        with self._lock:
            rows = self._conn.execute(f"SELECT id, {', '.join(_COLUMNS)} FROM records {where} ORDER BY {order}",
                                      args).fetchall()
        tasks: dict[str, Task] = {}
        for row in rows:
            d = dict(zip(("id",) + _COLUMNS, row))
            task = tasks.get(d["task"]) or tasks.setdefault(d["task"], Task.from_json(json.loads(d["task"])))
            result = MeasureResult(d["status"], tuple(json.loads(d["latencies"])), d["error"], d["build_s"],
                                   d["run_s"], d["timestamp"])
            yield TuningRecord(task, d["target_key"], d["run"], d["trial"], Config.from_json(d["config"]), result,
                               d["elapsed_s"], json.loads(d["target"]), d["id"])

    @staticmethod
    def _where(task: Task | None, target: Target | str | None, run: str | None,
               ok_only: bool = False) -> tuple[str, tuple]:
        conds, args = [], []
        if task is not None:
            conds.append("task_key = ?")
            args.append(task.key)
        if target is not None:
            conds.append("target_key = ?")
            args.append(_target_key(target))
        if run is not None:
            conds.append("run = ?")
            args.append(run)
        if ok_only:
            conds.append("status = 'ok'")
        return ("WHERE " + " AND ".join(conds) if conds else ""), tuple(args)

    def records(self, task: Task | None = None, target: Target | str | None = None, *,
                run: str | None = None) -> list[TuningRecord]:
        """Records in insertion order, optionally filtered by task, target and run."""
        where, args = self._where(task, target, run)
        return list(self._rows(where, args))

    def best(self, task: Task, target: Target | str, *, run: str | None = None) -> TuningRecord | None:
        """The fastest correct record of a task on a target (``None`` if there is none)."""
        where, args = self._where(task, target, run, ok_only=True)
        return next(self._rows(where, args, order="latency ASC, id ASC LIMIT 1"), None)

    def count(self, task: Task, target: Target | str, *, run: str | None = None) -> int:
        where, args = self._where(task, target, run)
        with self._lock:
            return self._conn.execute(f"SELECT COUNT(*) FROM records {where}", args).fetchone()[0]

    def tasks(self) -> list[tuple[Task, str]]:
        """Distinct (task, target_key) pairs in the database."""
        with self._lock:
            rows = self._conn.execute("SELECT DISTINCT task, target_key FROM records ORDER BY id").fetchall()
        seen, out = set(), []
        for t, k in rows:
            if (t, k) not in seen:
                seen.add((t, k))
                out.append((Task.from_json(json.loads(t)), k))
        return out

    def runs(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self._conn.execute("SELECT DISTINCT run FROM records ORDER BY run")]

    # ---- sharing -------------------------------------------------------------------------------
    def export_jsonl(self, path: str | os.PathLike) -> int:
        """Write every record as one JSON object per line; returns the count."""
        n = 0
        with open(path, "w") as f:
            for rec in self._rows("", ()):
                f.write(json.dumps(rec.to_json(), sort_keys=True) + "\n")
                n += 1
        return n

    def import_jsonl(self, path: str | os.PathLike) -> int:
        """Append the records of a JSONL export; returns the count."""
        n = 0
        with open(path) as f:
            for line in f:
                if line.strip():
                    self.add(TuningRecord.from_json(json.loads(line)))
                    n += 1
        return n

    def set_meta(self, key: str, value: str) -> None:
        with self._lock:
            self._conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def get_meta(self, key: str, default: str | None = None) -> str | None:
        with self._lock:
            row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default


def now() -> float:
    return time.time()


def iter_ok(records: Iterable[TuningRecord]) -> Iterator[TuningRecord]:
    return (r for r in records if r.ok)

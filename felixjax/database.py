"""Tuning database (DESIGN.md ⑪): SQLite in WAL mode, one row per measurement, committed on arrival.

A tuning run killed at any moment resumes with every reported measurement in the database and
re-measures none of them. Rows are plain JSON (never pickle); ``export_jsonl`` / ``import_jsonl``
share them between machines.

Example:
    >>> import felixjax as fj, tempfile, os
    >>> db = fj.Database(os.path.join(tempfile.mkdtemp(), "runs.db"))
    >>> len(db)
    0

Trust (issue 12): a file is opened only when it is a felixjax database: it carries the felixjax
``application_id`` (``user_version`` is the schema version), or it has exactly the ``records`` and
``meta`` tables of a database written before the marker existed (then it is stamped). Anything else
(another application's SQLite file, a non-SQLite file) is refused before a byte is written; a file
that fails ``PRAGMA quick_check`` is refused as corrupted. ``Database(path, readonly=True)`` reads a
read-only file; writes wait out another process's lock (busy timeout plus retries with backoff).
Pending configurations are claimed in a ``claims`` table (never counted as records) so that tuners
sharing a database and a run do not measure the same configuration twice.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import socket
import sqlite3
import threading
import time
import zlib
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from codegen.measure import MeasureResult
from codegen.ops import Task
from codegen.space import Config
from codegen.target import Target

from . import db_files
from .db_files import APPLICATION_ID, COLUMNS, SCHEMA_VERSION, finite_json  # noqa: F401 (finite_json: re-exported)
from .errors import DatabaseError

#: run-name prefix of in-network schedule choices (``retime:network:<run>``, :meth:`Database.network_choice`)
NETWORK_PREFIX = "retime:network:"

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
CREATE TABLE IF NOT EXISTS record_info (record_id INTEGER PRIMARY KEY, info TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS claims (
    task_key TEXT NOT NULL,
    target_key TEXT NOT NULL,
    run TEXT NOT NULL,
    config TEXT NOT NULL,
    owner TEXT NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (task_key, target_key, run, config)
);
"""

#: seconds a claim holds when its owner cannot be checked (another host's process): :meth:`Database.claim`
CLAIM_TTL_S = 3600.0

_COLUMNS = COLUMNS


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
        info: what the measurer reported besides the result, as JSON (e.g. on a ``cuda-sim`` target:
            ptxas's registers, shared memory and spills, or the estimate and ``registers_estimated``;
            the simulator's bound and occupancy); stored in the ``record_info`` table, ``{}`` if none.
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
    info: dict = field(default_factory=dict, compare=False, repr=False)

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
                "elapsed_s": self.elapsed_s, **({"info": self.info} if self.info else {})}

    @staticmethod
    def from_json(d: dict) -> "TuningRecord":
        return TuningRecord(Task.from_json(d["task"]), d["target_key"], d["run"], int(d["trial"]),
                            Config.from_json(d["config"]), MeasureResult.from_json(d["result"]),
                            float(d.get("elapsed_s", 0.0)), d.get("target") or {}, info=d.get("info") or {})


def _target_key(target: Target | str) -> str:
    """A target's key; a string is a key already, except a target's name ("cpu", "cuda-sim:a100"), which is
    that target's key (as ``fj.tune`` reads the name; a name taken for a key matched no record)."""
    if isinstance(target, str):
        return Target.parse(target).key if target.lower() == "cpu" or target.startswith("cuda-sim:") else target
    return target.key


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # another user's live process (or we cannot tell): keep its claims
    return True


class Database:
    """SQLite store of tuning records; safe to open from several threads of one process and from
    several processes at once (claims keep concurrent tuners of one run off each other's configs).

    Args:
        path: database file (created if missing). ``":memory:"`` works for tests.
        readonly: open an existing file for reading only (``mode=ro``): works on read-only files and
            folders; every write raises `~felixjax.errors.DatabaseError`.
        timeout_s: how long a read or write waits for another process's lock (SQLite busy timeout plus
            retries with exponential backoff) before `DatabaseError` says the database is locked.

    Raises:
        felixjax.errors.DatabaseError: the file is not a felixjax database (left untouched), is
            corrupted, is read-only while ``readonly`` is false, or stays locked past ``timeout_s``.
        FileNotFoundError: ``readonly`` and there is no such file.
    """

    def __init__(self, path: str | os.PathLike, readonly: bool = False, *, timeout_s: float = 60.0):
        self.path = db_files.checked_path(path)  # ("~" expanded; "" refused: SQLite's throwaway database)
        self.readonly = bool(readonly)
        self.timeout_s = float(timeout_s)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        memory = self.path == ":memory:" or self.path.startswith("file::memory:")
        busy = min(5.0, self.timeout_s)
        exists = not memory and os.path.exists(self.path)
        if self.readonly and not memory and not exists:
            raise FileNotFoundError(f"{self.path}: no such database")
        version = db_files.inspect(self.path, busy) if exists else 0
        if self.readonly:
            if memory:
                self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
                self._run(lambda c: c.executescript(_SCHEMA), write=False)
                return
            self._conn = self._connect_ro(busy)
            return
        if not memory:
            try:
                os.makedirs(os.path.dirname(os.path.abspath(self.path)) or ".", exist_ok=True)
            except OSError as e:
                raise DatabaseError(f"{self.path}: cannot create the database's folder ({e.strerror})") from None
            if not db_files.writable(self.path):
                raise db_files.readonly_error(self.path)
        try:
            self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=busy)
        except sqlite3.Error as e:
            raise db_files.open_error(self.path, e) from None

        def setup(c: sqlite3.Connection) -> None:
            c.execute("PRAGMA journal_mode=WAL")
            c.execute("PRAGMA synchronous=NORMAL")
            c.executescript(_SCHEMA)
            if version < SCHEMA_VERSION:  # new, or written before the marker: stamp it
                c.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

        self._run(setup)

    def _connect_ro(self, busy: float) -> sqlite3.Connection:
        last: Exception | None = None
        for params in ({"mode": "ro"}, {"mode": "ro", "immutable": "1"}):
            # immutable only when plain read-only fails: a read-only folder where no -shm file can be made
            # (and so no WAL writer can be at work either)
            if "immutable" in params and (err := db_files.unreadable_wal(self.path)) is not None:
                raise err
            try:
                conn = sqlite3.connect(db_files.uri(self.path, **params), uri=True, check_same_thread=False,
                                       isolation_level=None, timeout=busy)
                conn.execute("SELECT COUNT(*) FROM records").fetchone()
                return conn
            except sqlite3.OperationalError as e:  # "unable to open" / "attempt to write a readonly database"
                last = e
                if "no such table" in str(e).lower():
                    raise DatabaseError(f"{self.path}: an empty file, not yet a felixjax database (no records to "
                                        f"read)") from None
                if any(h in str(e).lower() for h in db_files.BUSY_HINTS):
                    break
        raise DatabaseError(f"{self.path}: cannot open the database for reading ({last})")

    # ---- running statements: retries on contention, one-line errors -----------------------------
    def _run(self, fn, *, write: bool = True):
        """``fn(conn)`` under the thread lock; "database is locked" is retried with exponential backoff
        up to ``timeout_s``; corruption and read-only files become `DatabaseError`."""
        if self._conn is None:
            raise DatabaseError(f"{self.path}: the database is closed")
        if write and self.readonly:
            raise DatabaseError(f"{self.path}: opened read-only (Database(..., readonly=True)); cannot write")
        deadline = time.monotonic() + self.timeout_s
        delay = 0.05
        while True:
            with self._lock:
                try:
                    return fn(self._conn)
                except BaseException as e:
                    if self._conn.in_transaction:
                        try:
                            self._conn.execute("ROLLBACK")
                        except sqlite3.Error:
                            pass
                    if not isinstance(e, sqlite3.DatabaseError):
                        raise
                    err = e
            msg = str(err).lower()
            if isinstance(err, sqlite3.OperationalError) and any(h in msg for h in db_files.BUSY_HINTS):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DatabaseError(f"{self.path}: the database stayed locked by another process for "
                                        f"{self.timeout_s:g} s ({err})") from None
                time.sleep(min(delay, left))
                delay = min(delay * 2, 2.0)
                continue
            if "readonly" in msg or "read-only" in msg:
                raise db_files.readonly_error(self.path) from None
            if isinstance(err, sqlite3.ProgrammingError):  # the caller's values (a Target for its key), not the file
                raise DatabaseError(f"{self.path}: {err} (nothing is wrong with the file)") from None
            if not isinstance(err, sqlite3.OperationalError) or any(h in msg for h in db_files.CORRUPT_HINTS):
                raise db_files.corrupted(self.path, err) from None
            if any(h in msg for h in ("disk i/o", "disk is full", "unable to open")):
                hint = (" (is the disk full, or a file size limit reached? nothing stored before is lost)"
                        if "unable to open" not in msg else "")
                raise DatabaseError(f"{self.path}: {err}{hint}") from None
            raise err

    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        return self._run(lambda c: c.execute(sql, args).fetchall(), write=False)

    def __repr__(self) -> str:
        return f"Database({self.path!r}, {len(self)} records)"

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __len__(self) -> int:
        return self._query("SELECT COUNT(*) FROM records")[0][0]

    # ---- writing -------------------------------------------------------------------------------
    def add(self, rec: TuningRecord, *, number: bool = False) -> TuningRecord:
        """Insert and commit one record (a few microseconds against ~0.2 s of measuring); its claim, if
        any, goes in the same transaction. ``number``: its ``trial`` is one past the largest trial number of
        its run (0 for the first), taken in the same transaction (two tuners of one run never number a trial
        twice; after a deleted row, numbers go on from the largest left)."""
        row = _row(rec)

        def insert(c: sqlite3.Connection) -> tuple[int, int]:
            c.execute("BEGIN IMMEDIATE")
            values = row
            if number:
                n = c.execute("SELECT COALESCE(MAX(trial) + 1, 0) FROM records WHERE task_key = ? AND "
                              "target_key = ? AND run = ?", row[:3]).fetchone()[0]  # after a deleted row: no reuse
                values = row[:3] + (n,) + row[4:]
            rowid = _insert(c, values, rec.info)
            c.execute("COMMIT")
            return rowid, values[3]

        rowid, trial = self._run(insert)
        return dataclasses.replace(rec, id=rowid, trial=trial)  # its info too (it was dropped: res.history lost it)

    # ---- claims: concurrent tuners of one run measure each configuration once --------------------
    def claim(self, task: Task, target: Target | str, run: str, configs: Iterable[Config], *,
              owner: str | None = None, ttl_s: float = CLAIM_TTL_S, budget: int | None = None) -> list[Config]:
        """Atomically claim the configurations of ``configs`` that are neither measured in (task, target,
        run) nor claimed by another live owner; returns those claimed, in their order (duplicates once).
        ``budget``: the run's trials; no more are claimed than it leaves after the run's records and the
        other owners' live claims (two tuners of one run share it exactly).

        A claim lives in the ``claims`` table (never a record: no count, history or budget sees it) until
        :meth:`add` stores its record or :meth:`release` drops it. Claims whose process (same host) is gone,
        or older than ``ttl_s`` seconds, are ignored and deleted. ``owner`` defaults to ``"host:pid"`` (a
        tuning session passes ``"host:pid:n"``, one per session); re-claiming one's own configuration succeeds
        (and renews it).
        """
        owner = owner or _owner()
        host, pid, now_s = socket.gethostname(), os.getpid(), time.time()
        scope = (task.key, _target_key(target), run)
        wanted = list(dict.fromkeys(configs))
        keys = [c.dumps() for c in wanted]

        def txn(c: sqlite3.Connection) -> list[Config]:
            c.execute("BEGIN IMMEDIATE")
            held = c.execute("SELECT config, owner, host, pid, created FROM claims WHERE task_key = ? AND "
                             "target_key = ? AND run = ?", scope).fetchall()
            live: dict[str, str] = {}
            stale = []
            for key, who, h, p, created in held:
                if created < now_s - ttl_s or (h == host and not _pid_alive(p)):
                    stale.append((key,))
                else:
                    live[key] = who
            if stale:
                c.executemany("DELETE FROM claims WHERE task_key = ? AND target_key = ? AND run = ? AND config = ?",
                              [scope + k for k in stale])
            measured = {r[0] for r in c.execute("SELECT DISTINCT config FROM records WHERE task_key = ? AND "
                                                "target_key = ? AND run = ?", scope)}
            got, rows = [], []
            room = len(wanted)
            if budget is not None:
                done = c.execute("SELECT COUNT(*) FROM records WHERE task_key = ? AND target_key = ? AND run = ?",
                                 scope).fetchone()[0]
                room = budget - done - sum(1 for k, w in live.items() if w != owner and k not in measured)
            for cfg, key in zip(wanted, keys):
                if key in measured or live.get(key, owner) != owner:
                    continue
                if len(got) >= room:
                    break
                got.append(cfg)
                rows.append(scope + (key, owner, host, pid, now_s))
            c.executemany("INSERT OR REPLACE INTO claims (task_key, target_key, run, config, owner, host, pid, "
                          "created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
            c.execute("COMMIT")
            return got

        return self._run(txn)

    def release(self, task: Task | None = None, target: Target | str | None = None, run: str | None = None,
                configs: Iterable[Config] | None = None, *, owner: str | None = None) -> int:
        """Drop ``owner``'s claims in (task, target, run): those of ``configs``, or all when ``None``;
        returns how many were dropped. ``task``, ``target`` and ``run`` left out: the owner's claims
        everywhere, e.g. ``db.release(owner="hostB:4242:1")`` for a tuner that died on another host (its
        claims would hold for an hour: :meth:`claim`'s ``ttl_s``)."""
        owner = owner or _owner()
        if configs is not None and (task is None or target is None or run is None):
            raise ValueError("release(configs=...) takes the task, target and run of those configs")
        where, scope = self._where(task, target, run)
        where = (where + " AND" if where else "WHERE") + " owner = ?"
        scope = tuple(scope) + (owner,)

        def txn(c: sqlite3.Connection) -> int:
            if configs is None:
                return c.execute(f"DELETE FROM claims {where}", scope).rowcount
            c.execute("BEGIN IMMEDIATE")
            n = sum(c.execute(f"DELETE FROM claims {where} AND config = ?", scope + (cfg.dumps(),)).rowcount
                    for cfg in dict.fromkeys(configs))
            c.execute("COMMIT")
            return n

        return self._run(txn)

    def claims(self, task: Task | None = None, target: Target | str | None = None, *,
               run: str | None = None, created: bool = False) -> list[tuple]:
        """The claims on record (expired ones included until a :meth:`claim` clears them): (config, owner),
        with ``created`` (config, owner, the Unix time it was made or last renewed)."""
        where, args = self._where(task, target, run)
        rows = self._query(f"SELECT config, owner, created FROM claims {where} ORDER BY created, config", args)
        return [(Config.from_json(k), o, t) if created else (Config.from_json(k), o) for k, o, t in rows]

    # ---- reading -------------------------------------------------------------------------------
    def _rows(self, where: str, args: tuple, order: str = "id") -> Iterator[TuningRecord]:
        if self._has_info():
            rows = self._query(f"SELECT id, {', '.join(_COLUMNS)}, record_info.info FROM records LEFT JOIN record_info "
                               f"ON record_info.record_id = records.id {where} ORDER BY {order}", args)
        else:  # a read-only database written before the table existed
            rows = [r + (None,) for r in
                    self._query(f"SELECT id, {', '.join(_COLUMNS)} FROM records {where} ORDER BY {order}", args)]
        tasks: dict[str, Task] = {}
        for row in rows:
            d = dict(zip(("id",) + _COLUMNS + ("info",), row))
            try:
                task = tasks.get(d["task"]) or tasks.setdefault(d["task"], Task.from_json(json.loads(d["task"])))
                result = MeasureResult(d["status"], tuple(float(x) for x in json.loads(d["latencies"])), d["error"],
                                       d["build_s"], d["run_s"], d["timestamp"])
                rec = TuningRecord(task, d["target_key"], d["run"], d["trial"], Config.from_json(d["config"]), result,
                                   d["elapsed_s"], json.loads(d["target"]), d["id"],
                                   json.loads(d["info"]) if d["info"] else {})
            except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
                raise self._damaged(d["id"], e) from None
            yield rec

    def _damaged(self, rowid, e: Exception) -> DatabaseError:
        """A row whose stored JSON no longer decodes (SQLite keeps no checksums: a flipped byte passes its checks)."""
        return DatabaseError(f"{self.path}: record {rowid} is damaged ({type(e).__name__}: {e}); the other records "
                             f"are intact: export them with Database.export_jsonl after removing this one "
                             f"(sqlite3 {self.path} 'DELETE FROM records WHERE id = {rowid}'; keep a copy first)")

    def _has_info(self) -> bool:
        """Whether the ``record_info`` table exists (always, except in read-only old databases)."""
        if getattr(self, "_info_table", None) is None:
            self._info_table = bool(self._query("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND "
                                                "name = 'record_info'")[0][0])
        return self._info_table

    @staticmethod
    def _where(task: Task | None, target: Target | str | None, run: str | None,
               ok_only: bool = False, since: int | None = None,
               exclude_sketches: Collection[str] = ()) -> tuple[str, tuple]:
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
        if ok_only:  # (an 'ok' row without a usable time, written by hand or by an older version, is no result)
            conds.append("status = 'ok' AND latency IS NOT NULL")
        if since is not None:
            conds.append("id > ?")
            args.append(int(since))
        if exclude_sketches:  # a sketch's name is its text before the first '.' (padded variants)
            given = (exclude_sketches,) if isinstance(exclude_sketches, str) else exclude_sketches  # one name
            names = sorted({str(n) for n in given})
            conds.append(f"substr(sketch, 1, instr(sketch || '.', '.') - 1) NOT IN ({', '.join('?' * len(names))})")
            args.extend(names)
        return ("WHERE " + " AND ".join(conds) if conds else ""), tuple(args)

    def records(self, task: Task | None = None, target: Target | str | None = None, *,
                run: str | None = None, since: int | None = None, retimes: bool = False) -> list[TuningRecord]:
        """Records in insertion order, optionally filtered by task, target and run.

        ``since``: only records whose row id (``TuningRecord.id``) is greater, e.g. those other
        processes added after a record this one knows, or after :meth:`last_id`.
        ``retimes``: without a ``run``, also the ``retime:<run>`` rows (a session's end-of-run
        re-timings of its best configs, which belong to no run's history).
        """
        where, args = self._where(task, target, run, since=since)
        if run is None and not retimes:
            where = (where + " AND " if where else "WHERE ") + "run NOT LIKE 'retime:%'"
        return list(self._rows(where, args))

    def last_id(self) -> int:
        """The row id of the newest record (0 when empty): a point to pass as ``records(since=...)``."""
        return self._query("SELECT COALESCE(MAX(id), 0) FROM records")[0][0]

    def best(self, task: Task, target: Target | str, *, run: str | None = None,
             retimed: bool = False, exclude_sketches: Collection[str] = ()) -> TuningRecord | None:
        """The fastest correct record of a task on a target (``None`` if there is none); ``retimed``:
        among the ``retime:<run>`` rows only (end-of-run re-timings, interleaved with the runner-ups), each
        run's newest re-timing only (a batch starts at its trial 0: an older one of the run could hold a
        lucky figure of a config timed again since). In-network choices (``retime:network:<run>``,
        :meth:`network_choice`) hold a layer's time inside a network, not its kernel's: they are never
        compared here. ``exclude_sketches``: sketch names whose records (their padded variants,
        ``<name>.<variant>``, included) are passed over. Where a config re-timed only on a busy machine (``noisy``:
        its timings are upper bounds) ran faster than the fastest clean row, that config wins, as its run's fastest
        record of it while tuning (a slower clean runner-up was taken for the best), else, timed only disturbed, as
        its re-timing at its lowest timing (:func:`as_bound`)."""
        where, args = self._where(task, target, run, ok_only=True, exclude_sketches=exclude_sketches)
        if run is None:
            where += f" AND run NOT LIKE '{NETWORK_PREFIX}%'"
        if retimed:
            where += " AND run LIKE 'retime:%' AND records.id >= " + _BATCH_START
        rec = next(self._rows(where, args, order="latency ASC, id ASC LIMIT 1"), None)
        if not retimed:
            return rec
        return self._disturbed_below(task, target, run, rec, exclude_sketches) or rec

    def _disturbed_below(self, task: Task, target: Target | str, run: str | None, rec: TuningRecord | None,
                         exclude_sketches: Collection[str]) -> TuningRecord | None:
        """:func:`disturbed_below` over the runs' newest re-timings: its run's fastest record of that config while
        tuning (else its re-timing as an upper bound, :func:`as_bound`), else ``None`` (session 79: a disturbed best
        made a 2.7x slower clean runner-up the best)."""
        where, args = self._where(task, target, run, exclude_sketches=exclude_sketches)
        where += (f" AND status = 'noisy' AND run LIKE 'retime:%' AND run NOT LIKE '{NETWORK_PREFIX}%' AND "
                  f"records.id >= {_BATCH_START}")
        if (fastest := disturbed_below(self._rows(where, args), rec)) is None:
            return None
        where, args = self._where(task, target, fastest.run.removeprefix("retime:"), ok_only=True)
        return next(self._rows(where + " AND config = ?", args + (fastest.config.dumps(),),
                               order="latency ASC, id ASC LIMIT 1"), None) or as_bound(fastest)

    def newest_id(self, task: Task, target: Target | str, run: str) -> int:
        """The row id of the newest record of ``run`` for a task on a target, 0 when there is none (a run's
        newest record against its ``retime:<run>`` rows': whether its end-of-run re-timing covers it)."""
        where, args = self._where(task, target, run)
        return self._query(f"SELECT COALESCE(MAX(id), 0) FROM records {where}", args)[0][0]

    def network_choice(self, task: Task, target: Target | str, *,
                       exclude_sketches: Collection[str] = ()) -> TuningRecord | None:
        """The newest in-network choice of a task's schedule on a target (a ``retime:network:<run>`` row
        written by :func:`felixjax.network_select.select_in_network`: the config whose layers ran fastest
        inside a whole network, its latency the layer's time there), ``None`` if there is none;
        ``exclude_sketches`` as in :meth:`best`."""
        where, args = self._where(task, target, None, ok_only=True, exclude_sketches=exclude_sketches)
        where += f" AND run LIKE '{NETWORK_PREFIX}%'"
        return next(self._rows(where, args, order="id DESC LIMIT 1"), None)

    def count(self, task: Task, target: Target | str, *, run: str | None = None, since: int | None = None,
              retimes: bool = False) -> int:
        """``len(records(task, target, run=run, since=since, retimes=retimes))``, counted in SQL."""
        where, args = self._where(task, target, run, since=since)
        if run is None and not retimes:
            where = (where + " AND " if where else "WHERE ") + "run NOT LIKE 'retime:%'"
        return self._query(f"SELECT COUNT(*) FROM records {where}", args)[0][0]

    def tasks(self) -> list[tuple[Task, str]]:
        """Distinct (task, target_key) pairs in the database."""
        return [(task, key) for task, key, _ in self.task_targets()]

    _TASK_TARGETS = ("SELECT r.task, g.target_key, r.target, g.first FROM (SELECT task_key, target_key, MIN(id) AS "
                     "first FROM records GROUP BY task_key, target_key) g JOIN records r ON r.id = g.first ORDER BY g.first")

    def _read_together(self, *queries: str) -> list[list[tuple]]:
        """The rows of each query, all read in one transaction: one state of the file, whatever another
        process writes meanwhile (separate reads could see a task in one and not in the next)."""
        def txn(c: sqlite3.Connection) -> list[list[tuple]]:
            c.execute("BEGIN")
            rows = [c.execute(q).fetchall() for q in queries]
            c.execute("COMMIT")
            return rows

        return self._run(txn, write=False)

    def task_targets(self, rows: list[tuple] | None = None) -> list[tuple[Task, str, dict]]:
        """(task, target_key, target JSON) of each distinct pair, in order of its first record: grouped on the
        index, one row decoded per pair (not the task JSON of every record). ``rows``: those of
        ``_TASK_TARGETS`` read already (inside a :meth:`_read_together`)."""
        rows = self._query(self._TASK_TARGETS) if rows is None else rows
        out = []
        for t, k, target, rowid in rows:
            try:
                out.append((Task.from_json(json.loads(t)), k, json.loads(target)))
            except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
                raise self._damaged(rowid, e) from None
        return out

    def run_summaries(self) -> list[dict]:
        """One dict per (task, target, run) of the histories (no re-timing rows), in order of its first
        record, aggregated in SQL (a report of a million records decodes a row per run, not every record):
        ``task``, ``target_key``, ``target`` (its JSON), ``run``, ``trials``, ``ok`` (correct and timed),
        ``seconds`` (the run's clock at its last record), ``best_s`` (inf without a correct record) and its
        ``sketch``, ``statuses`` ({failed status: count}) and ``retimed_s`` (the lowest clean row of the run's
        newest end-of-run re-timing, what ``fj.tune`` reports unless a disturbed re-timing came below it;
        ``None`` without one)."""
        ok, hist = "status = 'ok' AND latency IS NOT NULL", "run NOT LIKE 'retime:%'"
        best_rows, failed_rows, again_rows, pair_rows, run_rows = self._read_together(
            f"SELECT task_key, target_key, run, MIN(latency), sketch FROM records WHERE {ok} AND {hist} "
            "GROUP BY task_key, target_key, run",  # SQLite: the bare column comes from the MIN's row
            f"SELECT task_key, target_key, run, status, COUNT(*) FROM records WHERE NOT ({ok}) AND {hist} "
            "GROUP BY task_key, target_key, run, status",
            f"SELECT task_key, target_key, substr(run, 8), MIN(latency) FROM records WHERE {ok} AND run LIKE "
            f"'retime:%' AND records.id >= {_BATCH_START} GROUP BY task_key, target_key, substr(run, 8)",
            self._TASK_TARGETS,
            f"SELECT task_key, target_key, run, COUNT(*), SUM({ok}), MAX(elapsed_s) FROM records WHERE {hist} "
            "GROUP BY task_key, target_key, run ORDER BY MIN(id)")
        best = {r[:3]: r[3:] for r in best_rows}
        failed: dict[tuple, dict[str, int]] = {}
        for *key, status, n in failed_rows:
            failed.setdefault(tuple(key), {})[status] = n
        again = {r[:3]: r[3] for r in again_rows}
        pairs = {(t.key, k): (t, target) for t, k, target in self.task_targets(pair_rows)}
        out = []
        for *key, trials, n_ok, seconds in run_rows:
            key = tuple(key)
            task, target = pairs[key[:2]]
            lat, sketch = best.get(key, (math.inf, "-"))
            out.append({"task": task, "target_key": key[1], "target": target, "run": key[2], "trials": trials,
                        "ok": n_ok or 0, "seconds": seconds, "best_s": lat, "sketch": sketch,
                        "statuses": failed.get(key, {}), "retimed_s": again.get(key)})
        return out

    def replayed_runs(self) -> set[tuple[str, str, str]]:
        """``(task_key, target_key, run)`` of the runs holding replayed records (synthetic latencies of a replay
        measurer, ``info["replayed"]``; ``fj.tune(measurer=...)`` files them under the real target's key)."""
        if not self._has_info():
            return set()
        return {tuple(r) for r in self._query(
            "SELECT DISTINCT task_key, target_key, run FROM records JOIN record_info ON record_info.record_id = "
            "records.id WHERE record_info.info LIKE '%\"replayed\": true%'", ())}

    def trial_latencies(self) -> list[tuple[str, str, str, float]]:
        """``(task_key, target_key, run, latency)`` of every trial of every history (no re-timing rows), in
        insertion order; ``inf`` for a failed trial. Only these columns: no record is decoded."""
        return [(t, k, r, lat if lat is not None else math.inf) for t, k, r, lat in self._query(
            "SELECT task_key, target_key, run, CASE WHEN status = 'ok' THEN latency END FROM records "
            "WHERE run NOT LIKE 'retime:%' ORDER BY id")]

    def runs(self, *, retimes: bool = False) -> list[str]:
        """Names of the tuning runs (``retime:<run>`` rows, a session's end-of-run re-timings, only
        with ``retimes=True``)."""
        names = [r[0] for r in self._query("SELECT DISTINCT run FROM records ORDER BY run")]
        return names if retimes else [n for n in names if not n.startswith("retime:")]

    # ---- sharing -------------------------------------------------------------------------------
    def export_jsonl(self, path: str | os.PathLike) -> int:
        """Write every record (re-timings included) as one JSON object per line, gzipped when ``path`` ends in
        ``.gz`` (what `import_jsonl` reads); returns the count. Missing folders of ``path`` are created, as for
        the database itself; the database's own path is refused (:func:`felixjax.db_files.write_jsonl`)."""
        return db_files.write_jsonl(path, (rec.to_json() for rec in self._rows("", ())), self.path)

    def import_jsonl(self, path: str | os.PathLike) -> int:
        """Append the records of a JSONL export (gzipped when the name ends in ``.gz``); returns how many were
        added. A record this database already holds is skipped (the same measurement: task, target, run,
        trial, config and timestamp), and so is one of a tuning run that already measured its config: importing
        a file twice, or into the database it came from, changes nothing, and no run holds a config twice. Every
        line is checked before any is added: a line that is not a tuning record (cut off, not JSON, a missing or
        mistyped field, a correct result without a finite positive time) is a `DatabaseError` naming it, and
        nothing of the file is imported."""

        def txn(c: sqlite3.Connection) -> int:  # one transaction: a bad line rolls back what came before it
            c.execute("BEGIN IMMEDIATE")
            held = {(t, k, run, trial, cfg, ts) for t, k, run, trial, cfg, ts in c.execute(
                "SELECT task_key, target_key, run, trial, config, timestamp FROM records")}
            measured = {h[:3] + (h[4],) for h in held if not h[2].startswith("retime:")}
            n = 0
            for rec in _read_jsonl(path):  # streamed: a DatabaseError at a bad line, nothing committed
                row = _row(rec)
                key, in_run = row[:4] + (row[5], row[12]), row[:3] + (row[5],)
                if key in held or in_run in measured:
                    continue
                _insert(c, row, rec.info)
                held.add(key)
                if not rec.run.startswith("retime:"):
                    measured.add(in_run)
                n += 1
            c.execute("COMMIT")
            return n

        return self._run(txn)

    def set_meta(self, key: str, value: str) -> None:
        self._run(lambda c: c.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value)))

    def get_meta(self, key: str, default: str | None = None) -> str | None:
        rows = self._query("SELECT value FROM meta WHERE key = ?", (key,))
        return rows[0][0] if rows else default

    def run_settings(self, task: Task, target_key: str, run: str) -> dict | None:
        """What a run was started with (:mod:`felixjax.provenance`: seed, strategy and its options, cost model,
        defaults, library versions, start time), or None (a run started before session 79, or none)."""
        raw = self.get_meta(settings_key(target_key, task.key, run))
        return None if raw is None else json.loads(raw)


def disturbed_below(retimed: Iterable[TuningRecord], best: TuningRecord | None) -> TuningRecord | None:
    """The ``noisy`` re-timing row (timings are upper bounds) of lowest timing below ``best``'s latency (the fastest
    clean row; ``None``: none), else ``None``: that config is the faster (Database.best, TuneResult.best)."""
    noisy = [r for r in retimed if r.result.status == "noisy" and r.result.latencies]
    fastest = min(noisy, key=lambda r: min(r.result.latencies), default=None)
    return fastest if fastest and min(fastest.result.latencies) < (best.latency_s if best else math.inf) else None


def as_bound(rec: TuningRecord) -> TuningRecord:
    """A ``noisy`` record as ``ok`` at its lowest timing, an upper bound (its ``error`` says so): a config timed only
    disturbed, below every clean one, is the best (session 80: one 5x slower was built instead)."""
    bound = (min(rec.result.latencies),)
    return dataclasses.replace(rec, result=dataclasses.replace(rec.result, status="ok", latencies=bound,
                                                               error=UPPER_BOUND))


UPPER_BOUND = "upper bound: every timing of this config was disturbed (noisy); its latency is the lowest of them"


def settings_key(target_key: str, task_key: str, run: str) -> str:
    """The meta key of a run's settings (:mod:`felixjax.provenance`)."""
    return f"settings:{target_key}:{task_key}:{run}"


#: the first row id of a re-timing batch's newest batch (a batch starts at its trial 0), for ``records``
_BATCH_START = ("(SELECT COALESCE(MAX(s.id), 0) FROM records s WHERE s.task_key = records.task_key "
                "AND s.target_key = records.target_key AND s.run = records.run AND s.trial = 0)")


def _row(rec: TuningRecord) -> tuple:
    """The records table's values of ``rec``, in :data:`_COLUMNS` order."""
    r = rec.result
    return (rec.task.key, rec.target_key, rec.run, rec.trial, rec.config.sketch, rec.config.dumps(), r.status,
            r.latency_s if r.ok else None, json.dumps(list(r.latencies)), r.error, r.build_s, r.run_s,
            r.timestamp, rec.elapsed_s, rec.task.flops, json.dumps(rec.task.to_json(), sort_keys=True),
            json.dumps(rec.target, sort_keys=True))


def _insert(c: sqlite3.Connection, values: tuple, info: dict) -> int:
    """Insert one record's row (and its info) inside the caller's transaction, dropping any claim on its
    config in its run (measured now); returns its row id."""
    cur = c.execute(f"INSERT INTO records ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})", values)
    if info:
        c.execute("INSERT INTO record_info (record_id, info) VALUES (?, ?)",
                  (cur.lastrowid, json.dumps(info, sort_keys=True)))
    c.execute("DELETE FROM claims WHERE task_key = ? AND target_key = ? AND run = ? AND config = ?",
              values[:3] + (values[5],))
    return cur.lastrowid


def _read_jsonl(path: str | os.PathLike) -> Iterator[TuningRecord]:
    """The records of a JSONL export, one at a time, or a `DatabaseError` at the first line that is not one
    (cut off, not JSON, a missing or mistyped field, a correct result without a finite positive time)."""
    try:
        yield from _parse_jsonl(path)
    except (EOFError, OSError, UnicodeDecodeError, zlib.error) as e:  # a cut-off .gz, a binary file
        if isinstance(e, FileNotFoundError):
            raise
        raise DatabaseError(f"{path}: cannot be read to the end ({type(e).__name__}: {e}); nothing of the file "
                            f"was imported") from None


def _parse_jsonl(path) -> Iterator[TuningRecord]:
    with (gzip.open(path, "rt") if str(path).endswith(".gz") else open(path)) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = TuningRecord.from_json(json.loads(line))
                if rec.result.status == "ok" and not rec.result.ok:  # (ok: every time finite and positive)
                    raise ValueError(f"a correct result with the time(s) {list(rec.result.latencies)}")
            except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
                raise DatabaseError(f"{path}, line {i}: not a tuning record ({type(e).__name__}: {e}); nothing of "
                                    f"the file was imported") from None
            yield rec


def now() -> float:
    return time.time()


def iter_ok(records: Iterable[TuningRecord]) -> Iterator[TuningRecord]:
    return (r for r in records if r.ok)

"""Opening a felixjax database file: what is checked before SQLite is trusted with it (a folder, another
application's file, a newer schema, a damaged header, read-only files and journals) and the one-line
errors for each (:class:`felixjax.errors.DatabaseError`). Used by :class:`felixjax.database.Database`."""
from __future__ import annotations

import gzip
import json
import math
import os
import sqlite3
import urllib.parse
from collections.abc import Iterable
from pathlib import Path

from .errors import DatabaseError

#: ``PRAGMA application_id`` of every felixjax database ("FJAX").
APPLICATION_ID = 0x464A4158
#: ``PRAGMA user_version``: the schema version this code writes (0 = unmarked, written before the marker).
SCHEMA_VERSION = 1
#: the columns of the records table, in the order the database writes them
COLUMNS = ("task_key", "target_key", "run", "trial", "sketch", "config", "status", "latency", "latencies",
           "error", "build_s", "run_s", "timestamp", "elapsed_s", "flops", "task", "target")

SQLITE_MAGIC = b"SQLite format 3\x00"
KNOWN_TABLES = {"records", "meta", "claims", "record_info", "sqlite_sequence"}
CORRUPT_HINTS = ("malformed", "not a database", "corrupt", "disk image", "could not decode")  # (a text column's bytes)
BUSY_HINTS = ("locked", "busy")


def checked_path(path: str | os.PathLike) -> str:
    """A database path, ``~`` expanded ("~/runs.db" is the home folder's, not ./~/). An empty one (an unset
    ``$DB``) is an error: SQLite would open a private temporary database, deleted with every measurement."""
    path = os.path.expanduser(os.fspath(path))
    if not path.strip():
        raise DatabaseError("the database path is empty (an unset variable?); give a file name, e.g. runs.db")
    return path


def open_error(path: str, e: Exception) -> DatabaseError:
    """SQLite could not open ``path``; a path longer than SQLite takes (512 bytes in its default build) says so."""
    size = len(os.fsencode(os.path.abspath(path)))
    long = f"; its absolute path is {size} bytes, longer than SQLite opens" if size > 512 else ""
    return DatabaseError(f"{path}: cannot open the database ({e}{long})")


def writable(path: str) -> bool:
    """Whether this process may write the database file and create its journal files beside it."""
    folder = os.path.dirname(os.path.abspath(path)) or "."
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return False
    if any(os.path.exists(f) and not os.access(f, os.W_OK) for f in (path + "-wal", path + "-shm")):
        return False
    return os.access(folder, os.W_OK | os.X_OK)


def uri(path: str, **params: str) -> str:
    return "file:" + urllib.parse.quote(os.path.abspath(path)) + "?" + urllib.parse.urlencode(params)


def header(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(100)


def corrupted(path: str, why: str) -> DatabaseError:
    why = " ".join(str(why).split())[:200]
    return DatabaseError(f"{path}: corrupted felixjax database ({why}); refusing to use it: restore a backup, or "
                         f"export what is still readable with the sqlite3 shell's .recover")


def readonly_error(path: str) -> DatabaseError:
    # a journal file another user's (or a read-only open's) SQLite left behind, not writable by us, blocks
    # writing as surely as the database file: name it, the database and folder look writable
    stuck = [f for f in (path + "-wal", path + "-shm") if os.path.exists(f) and not os.access(f, os.W_OK)]
    if stuck and os.access(path, os.W_OK):
        return DatabaseError(f"{path}: its journal file {os.path.basename(stuck[0])} is read-only (left by another "
                             f"user's or a read-only process); with no other process using the database, delete "
                             f"{' and '.join(map(os.path.basename, stuck))} or make {'them' if len(stuck) > 1 else 'it'} writable")
    return DatabaseError(f"{path}: the database is read-only (no write permission on the file or its folder); "
                         f"reading commands (report, build, pretrain) work, writing (tune, compare) needs a writable "
                         f"copy")


def unreadable_wal(path: str) -> DatabaseError | None:
    """Read-only folder with a non-empty -wal left by a killed writer: SQLite cannot read its log
    without making a -shm file, and reading the main file alone would miss records."""
    wal = path + "-wal"
    if os.path.exists(wal) and os.path.getsize(wal) > 0:
        return DatabaseError(f"{path}: its write-ahead log ({os.path.basename(wal)}) cannot be read in a read-only "
                             f"folder; open it once where the folder is writable (or copy the .db and .db-wal files "
                             f"together to one)")
    return None


def inspect(path: str, timeout: float) -> int:
    """Check an existing file without writing to it; returns its ``user_version`` (0: unmarked, to stamp).

    Raises `DatabaseError` for a non-SQLite file, another application's SQLite file, a newer schema or a
    corrupted database."""
    try:
        head = header(path)
    except IsADirectoryError:
        raise DatabaseError(f"{path}: is a folder, not a felixjax database") from None
    except PermissionError:
        raise DatabaseError(f"{path}: cannot read the database (permission denied)") from None
    if not head:
        return 0  # an empty file: SQLite treats it as a new database
    if len(head) < 100 or not head.startswith(SQLITE_MAGIC):
        raise DatabaseError(f"{path}: not a felixjax database (not an SQLite file, or its header is corrupted); "
                            f"left untouched")
    app_id = int.from_bytes(head[68:72], "big", signed=True)
    if app_id not in (0, APPLICATION_ID):
        raise DatabaseError(f"{path}: not a felixjax database (SQLite application_id {app_id & 0xFFFFFFFF:#010x} "
                            f"belongs to another application); left untouched")
    # A WAL-mode file without a -wal file is closed by everyone: read it as immutable so that
    # inspecting it creates no -shm/-wal files either; otherwise read it through its WAL.
    wal = head[18] == 2 and head[19] == 2
    params = {"mode": "ro"}
    if wal and not os.path.exists(path + "-wal"):
        params["immutable"] = "1"
    try:
        conn = sqlite3.connect(uri(path, **params), uri=True, timeout=timeout, isolation_level=None,
                               check_same_thread=False)
        try:
            conn.execute("PRAGMA application_id").fetchone()
        except sqlite3.OperationalError as e:  # a WAL file left in a read-only folder: no -shm can be made
            if not any(h in str(e).lower() for h in ("readonly", "read-only", "unable to open")):
                raise
            conn.close()
            if (err := unreadable_wal(path)) is not None:
                raise err from None
            conn = sqlite3.connect(uri(path, mode="ro", immutable="1"), uri=True, timeout=timeout,
                                   isolation_level=None, check_same_thread=False)
    except sqlite3.OperationalError as e:
        if any(h in str(e).lower() for h in BUSY_HINTS):
            raise DatabaseError(f"{path}: the database stayed locked by another process ({e})") from None
        raise DatabaseError(f"{path}: cannot open the database ({e})") from None
    except sqlite3.DatabaseError as e:
        raise corrupted(path, e) from None
    try:
        try:
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            columns = {t: {r[1] for r in conn.execute(f"PRAGMA table_info({t})")}
                       for t in ("records", "meta", "claims") if t in tables}
        except sqlite3.DatabaseError as e:
            if isinstance(e, sqlite3.OperationalError) and any(h in str(e).lower() for h in BUSY_HINTS):
                raise DatabaseError(f"{path}: the database stayed locked by another process ({e})") from None
            raise corrupted(path, e) from None
        if app_id == APPLICATION_ID:
            if version > SCHEMA_VERSION:
                raise DatabaseError(f"{path}: written by a newer felixjax (schema {version}; this one reads up to "
                                    f"{SCHEMA_VERSION}): upgrade felixjax")
        elif tables:  # unmarked: a database of the previous version, recognized by its schema
            foreign = sorted(tables - KNOWN_TABLES)
            if foreign or not {"records", "meta"} <= tables:
                shown = ", ".join(sorted(tables - {"sqlite_sequence"})[:6])
                raise DatabaseError(f"{path}: not a felixjax database (an SQLite file with other tables: {shown}); "
                                    f"left untouched")
            if not set(("id",) + COLUMNS) <= columns["records"] or columns["meta"] != {"key", "value"}:
                raise DatabaseError(f"{path}: not a felixjax database (its records/meta tables have other columns); "
                                    f"left untouched")
        try:
            problems = [r[0] for r in conn.execute("PRAGMA quick_check(5)")]
        except sqlite3.DatabaseError as e:
            raise corrupted(path, e) from None
        if problems != ["ok"]:
            raise corrupted(path, "quick_check: " + "; ".join(problems))
        return version if app_id == APPLICATION_ID else 0
    finally:
        conn.close()


def finite_json(v):
    """``v`` (dicts, lists, tuples, scalars) with every non-finite float as None: what strict JSON holds
    of a figure that was not measured (a NaN mean over nothing, an inf latency)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: finite_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [finite_json(x) for x in v]
    return v


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict], db_path: str) -> int:
    """Write ``rows`` to ``path`` as JSON lines (gzipped when the name ends in ``.gz``, as the import reads it),
    through a temporary file renamed into place; returns the count. ``path`` naming the database ``db_path``
    (or one of its journal files) is an error: opening it for writing emptied the database."""
    path = Path(path)
    for own in (db_path, db_path + "-wal", db_path + "-shm", db_path + "-journal"):  # by any name (links, "..")
        if os.path.realpath(path) == os.path.realpath(own) or (
                path.exists() and os.path.exists(own) and os.path.samefile(path, own)):
            raise DatabaseError(f"{path}: is the database's own file; export to another path, e.g. runs.jsonl.gz")
    if path.is_dir():
        raise DatabaseError(f"{path}: is a folder; give the export a file name, e.g. runs.jsonl.gz")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    n = 0
    try:
        with gzip.open(tmp, "wt") if path.name.endswith(".gz") else open(tmp, "w") as f:
            for row in rows:
                f.write(json.dumps(row, sort_keys=True) + "\n")
                n += 1
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return n

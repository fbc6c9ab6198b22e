"""The tuning database under bad input and sharing (issue 12): application marker and legacy databases,
foreign / non-SQLite / corrupted files refused without writing a byte, read-only files, lock contention,
and the claims that keep concurrent tuners of one run off each other's configurations."""
import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import felixjax as fj
import felixjax.database as fjdb
from codegen.measure import MeasureResult
from codegen.space import Space, sketches_for
from felixjax.database import APPLICATION_ID, SCHEMA_VERSION, Database, TuningRecord
from felixjax.errors import DatabaseError

LEGACY = Path(__file__).parent / "data" / "legacy_v0.db"  # written by the unmarked Database of before issue 12
TARGET = fj.Target.cpu()
TASK = fj.ops.matmul(32, 32, 32)
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0  # root ignores file permissions


def configs(n: int, seed: int = 0):
    sp = Space(TASK, sketches_for(TASK)[0], TARGET)
    rng = np.random.default_rng(seed)
    out = list(dict.fromkeys(sp.sample(rng) for _ in range(4 * n)))[:n]
    assert len(out) == n
    return out


def rec(cfg, trial=0, run="r:0", lat=1e-5):
    return TuningRecord(TASK, TARGET.key, run, trial, cfg, MeasureResult("ok", (lat,)), 0.0)


def snapshot(path: Path) -> tuple:
    """Bytes and mtime of a file, and the files of its folder."""
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns, sorted(os.listdir(path.parent))


def marker(path) -> tuple[int, int]:
    c = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return c.execute("PRAGMA application_id").fetchone()[0], c.execute("PRAGMA user_version").fetchone()[0]
    finally:
        c.close()


def filled(path, n=6) -> list:
    cs = configs(n)
    with Database(path) as db:
        for i, c in enumerate(cs):
            db.add(rec(c, i))
    return cs


# ---- marker, legacy databases ------------------------------------------------------------------------
def test_new_database_carries_the_marker(tmp_path):
    Database(tmp_path / "a.db").close()
    assert marker(tmp_path / "a.db") == (APPLICATION_ID, SCHEMA_VERSION)


def test_legacy_database_is_read_and_stamped(tmp_path):
    path = tmp_path / "legacy.db"
    shutil.copy(LEGACY, path)
    assert marker(path) == (0, 0)
    with Database(path, readonly=True) as db:  # reading does not stamp
        assert len(db) == 6
    assert marker(path) == (0, 0)
    with Database(path) as db:
        assert len(db) == 6 and db.get_meta("created_by") == "felixjax-legacy-fixture"
        (task, key), = db.tasks()
        assert task.name == TASK.name and db.count(task, key, run="random:0") == 6
        assert db.best(task, key).latency_s == pytest.approx(1e-5)
        assert sum(r.ok for r in db.records()) == 5
        db.add(TuningRecord(task, key, "random:0", 6, configs(8)[7], MeasureResult("ok", (2e-5,))))
    assert marker(path) == (APPLICATION_ID, SCHEMA_VERSION)
    with Database(path) as db:
        assert len(db) == 7


# ---- refusing files that are not ours, without writing a byte ---------------------------------------------
def test_foreign_sqlite_file_is_refused_untouched(tmp_path):
    path = tmp_path / "other.sqlite"
    c = sqlite3.connect(path)
    c.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    c.execute("INSERT INTO users (name) VALUES ('ada')")
    c.commit()
    c.close()
    before = snapshot(path)
    for readonly in (False, True):
        with pytest.raises(DatabaseError, match="not a felixjax database.*users") as e:
            Database(path, readonly=readonly)
        assert "\n" not in str(e.value)
    assert snapshot(path) == before  # no felixjax table, no journal-mode change, no -wal/-shm file
    c = sqlite3.connect(path)
    assert c.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert [r[0] for r in c.execute("SELECT name FROM sqlite_master")] == ["users"]
    c.close()


def test_other_application_id_is_refused_untouched(tmp_path):
    path = tmp_path / "app.db"
    c = sqlite3.connect(path)
    c.execute("PRAGMA application_id = 1234")
    c.execute("CREATE TABLE records (x)")  # even with a table of our name
    c.commit()
    c.close()
    before = snapshot(path)
    with pytest.raises(DatabaseError, match="application_id 0x000004d2"):
        Database(path)
    assert snapshot(path) == before


def test_legacy_lookalike_with_other_columns_is_refused(tmp_path):
    path = tmp_path / "look.db"
    c = sqlite3.connect(path)
    c.execute("CREATE TABLE records (id INTEGER PRIMARY KEY, payload TEXT)")
    c.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    c.commit()
    c.close()
    before = snapshot(path)
    with pytest.raises(DatabaseError, match="other columns"):
        Database(path)
    assert snapshot(path) == before


@pytest.mark.parametrize("content", [b"hello, I am a text file\n", b"\x00" * 5000, b"SQLite format 3\x00abc"])
def test_non_sqlite_file_is_refused_untouched(tmp_path, content):
    path = tmp_path / "notes.db"
    path.write_bytes(content)
    before = snapshot(path)
    with pytest.raises(DatabaseError, match="not a felixjax database \\(not an SQLite file"):
        Database(path)
    assert snapshot(path) == before


def test_empty_file_becomes_a_database(tmp_path):
    path = tmp_path / "empty.db"
    path.touch()
    with pytest.raises(DatabaseError, match="empty file"):  # nothing to read, and reading writes nothing
        Database(path, readonly=True)
    assert path.stat().st_size == 0
    with Database(path) as db:
        assert len(db) == 0
    assert marker(path) == (APPLICATION_ID, SCHEMA_VERSION)


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "new.db"
    Database(path).close()
    c = sqlite3.connect(path)
    c.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    c.close()
    with pytest.raises(DatabaseError, match="newer felixjax"):
        Database(path)


# ---- corruption ------------------------------------------------------------------------------------
def corrupt(path: Path) -> None:
    """Overwrite the first page of the records table with garbage."""
    c = sqlite3.connect(path)
    page = c.execute("SELECT rootpage FROM sqlite_master WHERE name = 'records'").fetchone()[0]
    size = c.execute("PRAGMA page_size").fetchone()[0]
    c.close()
    assert not Path(str(path) + "-wal").exists()
    with open(path, "r+b") as f:
        f.seek((page - 1) * size)
        f.write(bytes(range(256)) * (size // 256))


def test_corrupted_database_is_refused_for_writing_and_reading(tmp_path):
    path = tmp_path / "bad.db"
    filled(path, 6)
    corrupt(path)
    before = snapshot(path)
    for readonly in (False, True):
        with pytest.raises(DatabaseError, match="corrupted felixjax database") as e:
            Database(path, readonly=readonly)
        assert "\n" not in str(e.value)
    assert snapshot(path) == before  # nothing written into it


def test_tune_refuses_a_corrupted_database(tmp_path):
    path = tmp_path / "bad.db"
    filled(path, 6)
    corrupt(path)
    before = snapshot(path)
    with pytest.raises(DatabaseError, match="corrupted"):
        fj.tune(TASK, TARGET, "random", trials=2, db=str(path), progress=False)
    assert snapshot(path) == before


@pytest.mark.parametrize("command", ["report", "pretrain", "tune"])
def test_commands_give_one_line_on_a_corrupted_database(command, tmp_path, capsys):
    from felixjax.cli import main as cli

    path = tmp_path / "bad.db"
    filled(path, 6)
    corrupt(path)
    before = snapshot(path)
    argv = {"report": ["report", str(path)], "pretrain": ["pretrain", str(path), "-o", str(tmp_path / "cm.npz")],
            "tune": ["tune", "--op", "matmul:m=8,n=8,k=8", "--strategy", "random", "--trials", "1", "--no-compare",
                     "--db", str(path)]}[command]
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "corrupted felixjax database" in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert snapshot(path) == before


def test_a_record_with_invalid_utf8_text_is_one_line(tmp_path, capsys):
    # a session-81 review: one flipped byte in a text column passes PRAGMA quick_check, and sqlite3 raised a bare
    # OperationalError ("Could not decode to UTF-8 column 'config'"): a 40-line traceback
    from felixjax.cli import main as cli

    path = tmp_path / "utf8.db"
    filled(path, 6)
    with sqlite3.connect(path) as c:
        c.execute("UPDATE records SET config = CAST(X'7B22FF22' AS TEXT) WHERE id = (SELECT MIN(id) FROM records)")
    assert cli(["pretrain", str(path), "-o", str(tmp_path / "cm.npz")]) == 2  # (reads every record)
    err = capsys.readouterr().err.strip()
    assert "corrupted felixjax database" in err and len(err.splitlines()) == 1


def test_an_empty_or_overlong_database_path_is_one_clear_error(tmp_path, capsys):
    # a session-81 review: db="" (an unset $DB) tuned into SQLite's private temporary database, deleted at exit with
    # every measurement; a path over SQLite's 512 bytes said only "unable to open", and the CLI's message was cut
    # to "error: [...]" (textwrap.shorten drops a first word over 400 characters)
    from felixjax.cli import main as cli

    with pytest.raises(DatabaseError, match="the database path is empty"):
        fj.tune(TASK, TARGET, "random", trials=1, db="", progress=False)
    assert cli(["tune", "--op", "matmul:m=8,n=8,k=8", "--trials", "1", "--no-compare", "--db", ""]) == 2
    assert "the database path is empty" in capsys.readouterr().err
    assert cli(["report", " "]) == 2 and "the database path is empty" in capsys.readouterr().err
    deep = tmp_path.joinpath(*["d" * 200] * 3)
    deep.mkdir(parents=True)
    assert cli(["tune", "--op", "matmul:m=8,n=8,k=8", "--trials", "1", "--no-compare", "--db", str(deep / "x.db")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "longer than SQLite opens" in err and "x.db" in err


def test_a_closed_pipe_ends_a_command_quietly(tmp_path):
    # a session-81 review: `felixjax report runs.db | head -1` died with a BrokenPipeError traceback
    path = tmp_path / "r.db"
    filled(path, 6)
    code = "import sys; from felixjax.cli import main; sys.exit(main(sys.argv[1:]))"
    p = subprocess.Popen([sys.executable, "-c", code, "report", str(path)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()  # the reader leaves before the report is written
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141 and "Traceback" not in err and not err.strip()


# ---- read-only files -----------------------------------------------------------------------------------
def test_readonly_open_reads_and_refuses_writes(tmp_path):
    path = tmp_path / "ro.db"
    cs = filled(path, 4)
    before = snapshot(path)
    with Database(path, readonly=True) as db:
        assert len(db) == 4 and [r.config for r in db.records()] == cs
        with pytest.raises(DatabaseError, match="read-only"):
            db.add(rec(configs(5)[4], 4))
        with pytest.raises(DatabaseError, match="read-only"):
            db.claim(TASK, TARGET, "r:0", cs)
    assert snapshot(path)[:2] == before[:2]
    with pytest.raises(FileNotFoundError):
        Database(tmp_path / "missing.db", readonly=True)


def test_writing_a_readonly_file_says_read_only(tmp_path, monkeypatch):
    path = tmp_path / "ro.db"
    filled(path, 2)
    monkeypatch.setattr(fjdb.db_files, "writable", lambda p: False)  # as a non-root user sees a chmod 444 file
    with pytest.raises(DatabaseError, match="read-only") as e:
        Database(path)
    assert "not a felixjax database" not in str(e.value)
    from felixjax.report import report

    assert "2 measurements" in report(str(path))  # reading commands work
    from felixjax.pretrain import load_dataset

    with pytest.raises(ValueError, match="no task with >= 16"):  # it read the 2 records, too few to train on
        load_dataset([path])


def test_a_read_only_journal_file_left_behind_is_named(tmp_path, monkeypatch):
    # session 73: a read-only -shm (SQLite gives it the database's mode when a reading process makes it) blocked
    # tuning into a database that had been made writable again, with "no write permission on the file or its
    # folder", both of which were writable
    path = tmp_path / "w.db"
    filled(path, 2)
    shm = str(path) + "-shm"
    Path(shm).write_bytes(b"")
    real = os.access
    monkeypatch.setattr(fjdb.os, "access", lambda p, mode: False if str(p) == shm and mode & os.W_OK else real(p, mode))
    with pytest.raises(DatabaseError, match=r"journal file w.db-shm is read-only.*delete w.db-shm or make it writable"):
        Database(path)


@pytest.mark.skipif(ROOT, reason="root ignores file permissions")
def test_chmod_readonly_file_and_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "runs.db"
    filled(path, 3)
    os.chmod(path, 0o444)
    os.chmod(folder, 0o555)
    try:
        with pytest.raises(DatabaseError, match="read-only"):
            Database(path)
        with Database(path, readonly=True) as db:
            assert len(db) == 3
    finally:
        os.chmod(folder, 0o755)
        os.chmod(path, 0o644)


# ---- contention ----------------------------------------------------------------------------------------
def hold_write_lock(path, seconds: float, locked: threading.Event,
                    until: threading.Event | None = None) -> threading.Thread:
    """Another connection holds the write lock for ``seconds``, or until ``until`` is set (at most 60 s)."""
    def hold():
        c = sqlite3.connect(path, isolation_level=None)
        c.execute("BEGIN IMMEDIATE")
        locked.set()
        if until is not None:
            until.wait(60)
        else:
            time.sleep(seconds)
        c.execute("COMMIT")
        c.close()

    th = threading.Thread(target=hold, daemon=True)
    th.start()
    assert locked.wait(10)
    return th


def test_writer_waits_out_a_six_second_lock(tmp_path):
    path = tmp_path / "busy.db"
    cs = filled(path, 2)
    with Database(path) as db:
        locked = threading.Event()
        th = hold_write_lock(path, 6.0, locked)
        more = configs(4)[2:]
        for i, c in enumerate(more):  # a tuner's writes while another process holds the lock
            db.add(rec(c, 2 + i))
        got = db.claim(TASK, TARGET, "r:0", cs + more + configs(5)[4:])
        th.join()
        assert len(db) == 4 and got == configs(5)[4:]


def test_lock_held_past_the_timeout_is_one_clear_error(tmp_path):
    path = tmp_path / "busy.db"
    filled(path, 1)
    with Database(path, timeout_s=0.3) as db:
        locked, done = threading.Event(), threading.Event()
        th = hold_write_lock(path, 0.0, locked, until=done)  # held until the error is in (no race with a stall)
        try:
            with pytest.raises(DatabaseError, match="locked by another process"):
                db.add(rec(configs(2)[1], 1))
        finally:
            done.set()
        th.join()
        assert len(db) == 1


# ---- claims ----------------------------------------------------------------------------------------------
def test_claims_are_exclusive_and_not_records(tmp_path):
    cs = configs(8)
    with Database(tmp_path / "c.db") as db:
        db.add(rec(cs[0], 0))  # measured: never claimable
        a = db.claim(TASK, TARGET, "r:0", cs[:5] + cs[:2], owner="a")
        assert a == cs[1:5]
        assert db.claim(TASK, TARGET, "r:0", cs, owner="b") == cs[5:]
        assert db.claim(TASK, TARGET, "r:0", cs[1:3], owner="a") == cs[1:3]  # one's own claims renew
        assert db.claim(TASK, TARGET, "other:0", cs, owner="c") == cs  # claims are per run
        assert len(db) == 1 and db.count(TASK, TARGET, run="r:0") == 1 and db.runs() == ["r:0"]
        assert [r.config for r in db.records()] == [cs[0]]
        db.add(rec(cs[1], 1))  # storing the record drops its claim
        assert cs[1] not in {c for c, _ in db.claims(TASK, TARGET, run="r:0")}
        assert db.release(TASK, TARGET, "r:0", [cs[2]], owner="a") == 1
        assert db.claim(TASK, TARGET, "r:0", cs, owner="b") == [cs[2]] + cs[5:]  # and renews its own
        assert db.release(TASK, TARGET, "r:0", owner="a") == 2  # cs[3], cs[4]
        assert db.claim(TASK, TARGET, "r:0", cs, owner="b") == [cs[2], cs[3], cs[4]] + cs[5:]


def test_claims_of_dead_processes_and_old_claims_expire(tmp_path):
    path = tmp_path / "c.db"
    cs = configs(4)
    with Database(path) as db:
        assert db.claim(TASK, TARGET, "r:0", cs[:2], owner="dead") == cs[:2]
        assert db.claim(TASK, TARGET, "r:0", cs[2:], owner="old") == cs[2:]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    c = sqlite3.connect(path)
    c.execute("UPDATE claims SET pid = ? WHERE owner = 'dead'", (dead.pid,))
    c.execute("UPDATE claims SET created = created - 7200 WHERE owner = 'old'")
    c.commit()
    c.close()
    with Database(path) as db:
        assert db.claim(TASK, TARGET, "r:0", cs, owner="new", ttl_s=3600) == cs
        assert {o for _, o in db.claims()} == {"new"}
        assert db.claim(TASK, TARGET, "r:0", cs, owner="newer", ttl_s=3600) == []  # a live one holds


def test_default_owner_is_host_and_pid(tmp_path):
    import socket

    cs = configs(2)
    with Database(tmp_path / "c.db") as db:
        assert db.claim(TASK, TARGET, "r:0", cs) == cs
        assert {o for _, o in db.claims()} == {f"{socket.gethostname()}:{os.getpid()}"}
        assert db.release(TASK, TARGET, "r:0") == 2


def test_a_dead_tuners_claims_are_released_by_owner_everywhere(tmp_path):
    # session 77: a tuner that died on another host holds its claims for an hour; one call clears them
    cs = configs(4)
    with Database(tmp_path / "c.db") as db:
        t0 = time.time()
        db.claim(TASK, TARGET, "r:0", cs[:2], owner="hostB:4242")
        db.claim(TASK, TARGET, "r:1", cs[2:], owner="hostB:4242")
        db.claim(TASK, TARGET, "r:1", cs[:2], owner="hostC:1")
        [(cfg, who, made)] = [c for c in db.claims(run="r:0", created=True)][:1]
        assert cfg == cs[0] and who == "hostB:4242" and t0 - 1 <= made <= time.time() + 1
        assert all(len(c) == 2 for c in db.claims())  # the (config, owner) pairs as before
        with pytest.raises(ValueError, match="takes the task, target and run"):
            db.release(configs=cs, owner="hostB:4242")
        assert db.release(TASK, TARGET, "r:1", [cs[2]], owner="hostB:4242") == 1
        assert db.release(owner="hostB:4242") == 3  # both runs
        assert {o for _, o in db.claims()} == {"hostC:1"}


def test_a_run_ending_claimed_names_the_holder_and_how_to_clear_it(tmp_path, monkeypatch):
    # session 77 (a user's review): a rerun whose proposals a dead tuner on another host still held waited
    # 300 x 1 s and ended "claimed" short of its budget, saying by whom or how to clear it nowhere
    import felixjax.session as session_mod
    from felixjax.testing import ReplayRunner

    monkeypatch.setattr(session_mod, "CLAIM_WAIT_S", 0.0)
    monkeypatch.setattr(session_mod, "CLAIM_WAITS", 2)
    path = tmp_path / "c.db"
    with Database(path) as db, session_mod.TuningSession(db=db, measurer=lambda t, tg: ReplayRunner.from_oracle(t, tg),
                                                         progress=False) as s:
        tr = s.add(TASK, "random", trials=6)
        db.claim(TASK, s.target_key, tr.run, configs(3), owner="hostB:4242")
        monkeypatch.setattr(db, "claim", lambda *a, **k: [])  # every proposal held

        def until_done():
            while not tr.done:
                s.step(tr)

        with pytest.warns(RuntimeWarning) as caught:
            until_done()
        assert tr.stop_reason == "claimed"
        [msg] = [str(w.message) for w in caught if "ends 'claimed'" in str(w.message)]
        assert "hostB:4242 holds 3 (claimed since " in msg and "3600 s" in msg
        assert f"fj.Database({str(path)!r}).release(owner='hostB:4242')" in msg
        assert Database.release(db, owner="hostB:4242") == 3


def test_concurrent_claimers_split_the_configs(tmp_path):
    path = tmp_path / "c.db"
    Database(path).close()
    cs = configs(40)
    got: dict[str, list] = {}

    def worker(name):
        with Database(path) as db:
            mine = []
            for i in range(0, len(cs), 5):
                mine += db.claim(TASK, TARGET, "r:0", cs[i:i + 10], owner=name)
            got[name] = list(dict.fromkeys(mine))  # its own claims renew: count each once

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [c for mine in got.values() for c in mine]
    assert sorted(every, key=lambda c: c.dumps()) == sorted(cs, key=lambda c: c.dumps())  # each exactly once


def test_records_since_a_known_row(tmp_path):
    cs = configs(5)
    with Database(tmp_path / "s.db") as db:
        assert db.last_id() == 0
        first = [db.add(rec(c, i)) for i, c in enumerate(cs[:2])]
        mark = db.last_id()
        assert mark == first[-1].id
        with Database(tmp_path / "s.db") as other:  # another tuner adds records
            for i, c in enumerate(cs[2:]):
                other.add(rec(c, 2 + i))
        new = db.records(TASK, TARGET, run="r:0", since=mark)
        assert [r.config for r in new] == cs[2:] and all(r.id > mark for r in new)
        assert db.count(TASK, TARGET, run="r:0", since=mark) == 3
        assert db.records(since=db.last_id()) == []
        assert "id" not in new[0].to_json() and TuningRecord.from_json(new[0].to_json()) == new[0]


def test_two_tuners_of_one_run_share_its_budget_exactly_and_number_trials_once(tmp_path):
    # session 76: two tuners of one run each claimed up to what they saw left: 13 records in a 12-trial
    # run, and the trial index 2 twice
    cs = configs(20)
    with Database(tmp_path / "b.db") as db:
        db.add(rec(cs[0], 0))
        assert db.claim(TASK, TARGET, "r:0", cs[1:9], owner="a", budget=12) == cs[1:9]  # 1 + 8 of 12
        assert db.claim(TASK, TARGET, "r:0", cs[9:20], owner="b", budget=12) == cs[9:12]  # 3 left, not 11
        assert db.claim(TASK, TARGET, "r:0", cs[12:], owner="c", budget=12) == []
        assert db.claim(TASK, TARGET, "r:0", cs[12:], owner="c") == cs[12:]  # no budget: no limit
        stored = [db.add(rec(c, 1), number=True) for c in (cs[1], cs[9], cs[2])]  # both tuners said trial 1
        assert [r.trial for r in stored] == [1, 2, 3]
        assert [r.trial for r in db.records(run="r:0")] == [0, 1, 2, 3]


def test_a_damaged_row_is_named_and_nothing_is_changed(tmp_path):
    # SQLite keeps no checksums: a flipped byte in a record's JSON passes quick_check; a read named nothing
    path = tmp_path / "d.db"
    filled(path, 3)
    c = sqlite3.connect(path)
    c.execute("UPDATE records SET config = '{\"sketch\": ' WHERE id = 2")
    c.commit()
    c.close()
    before = path.read_bytes()
    with Database(path) as db:
        with pytest.raises(DatabaseError, match=r"record 2 is damaged \(JSONDecodeError.*DELETE FROM records WHERE id = 2"):
            db.records()
        assert db.count(TASK, TARGET) == 3
    assert path.read_bytes() == before


@pytest.mark.parametrize("bad, why", [('{"task": ', "JSONDecodeError"), ("garbage", "JSONDecodeError"),
                                      ("{}", "KeyError"), ("nan", "a correct result with the time"),
                                      ("empty", "a correct result with the time")])
def test_import_jsonl_names_the_bad_line_and_imports_nothing(tmp_path, bad, why):
    src = tmp_path / "src.db"
    filled(src, 4)
    with Database(src) as db:
        db.export_jsonl(tmp_path / "x.jsonl")
    lines = (tmp_path / "x.jsonl").read_text().splitlines()
    if bad in ("nan", "empty"):  # an ok record whose time is NaN, or none (NULL sorts first: the task's "best")
        bad = lines[2].replace('"latencies": [1e-05]', '"latencies": [NaN]' if bad == "nan" else '"latencies": []')
        assert bad != lines[2]
    lines[2] = bad
    (tmp_path / "x.jsonl").write_text("\n".join(lines) + "\n")
    with Database(tmp_path / "dst.db") as db:
        with pytest.raises(DatabaseError, match=f"x.jsonl, line 3: not a tuning record.*{why}.*nothing of the file"):
            db.import_jsonl(tmp_path / "x.jsonl")
        assert len(db) == 0


def test_a_database_path_under_home_is_expanded(tmp_path, monkeypatch, capsys):
    from felixjax.cli import main

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with Database("~/h.db") as db:
        db.add(rec(configs(1)[0]))
    assert (tmp_path / "h.db").exists() and not (tmp_path / "~").exists()
    assert main(["report", "~/h.db"]) == 0 and "1 measurements" in capsys.readouterr().out  # quoted in a shell


def test_a_cut_off_gzip_export_is_one_clear_error(tmp_path):
    import gzip

    src = tmp_path / "src.db"
    filled(src, 6)
    with Database(src) as db:
        db.export_jsonl(tmp_path / "x.jsonl")
    data = gzip.compress((tmp_path / "x.jsonl").read_bytes())
    (tmp_path / "x.jsonl.gz").write_bytes(data[: len(data) // 2])
    with Database(tmp_path / "dst.db") as db:
        with pytest.raises(DatabaseError, match="x.jsonl.gz: cannot be read to the end.*nothing of the file"):
            db.import_jsonl(tmp_path / "x.jsonl.gz")
        assert len(db) == 0


def test_export_refuses_the_database_itself_and_gzips_a_gz_name(tmp_path):
    """Session 82, a review: ``export_jsonl`` onto the database's own path emptied it (opened for writing before
    a row was read: 7 records, then 0); a ``.jsonl.gz`` export was plain text that ``import_jsonl`` refused."""
    import gzip

    path = tmp_path / "r.db"
    filled(path, 5)
    before = path.read_bytes()
    with Database(path) as db:
        for own in (path, tmp_path / "r.db-wal", tmp_path / "newdir" / ".." / "r.db"):  # (a verification: the
            if own.exists() or "newdir" in str(own):  # last one passed, made newdir and overwrote the database)
                with pytest.raises(DatabaseError, match="is the database's own file"):
                    db.export_jsonl(own)
        with pytest.raises(DatabaseError, match="is a folder"):
            db.export_jsonl(tmp_path)
        assert len(db) == 5
        assert db.export_jsonl(tmp_path / "out" / "r.jsonl.gz") == 5
    with gzip.open(tmp_path / "out" / "r.jsonl.gz", "rt") as f:
        assert len(f.read().splitlines()) == 5
    with Database(tmp_path / "copy.db") as copy:
        assert copy.import_jsonl(tmp_path / "out" / "r.jsonl.gz") == 5
    assert path.read_bytes()[:16] == before[:16] and not list(tmp_path.glob("out/.*tmp*"))

"""ReplayRunner.from_database(path) reads its database read-only: nothing written, read-only files work."""
from __future__ import annotations

import os
import stat

import pytest

import felixjax as fj
from felixjax.testing import ReplayRunner


def _listing(folder):
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes()) for p in folder.iterdir()}


def test_from_database_path_is_opened_read_only(tmp_path):
    folder = tmp_path / "dbs"
    folder.mkdir()
    path = folder / "r.db"
    t = fj.ops.matmul(32, 32, 32)
    fj.tune(t, measurer=lambda task, target: ReplayRunner.from_oracle(task, target), progress=False, retime=0,
            strategy="random", trials=8, db=str(path))
    before = _listing(folder)
    os.chmod(path, stat.S_IRUSR | stat.S_IRGRP)
    os.chmod(folder, stat.S_IRUSR | stat.S_IXUSR)
    try:
        replay = ReplayRunner.from_database(path, t)
        replay_str = ReplayRunner.from_database(str(path), t)
    finally:
        os.chmod(folder, stat.S_IRWXU)
        os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
    after = _listing(folder)
    assert after["r.db"] == before["r.db"]                # the database file: not a byte written
    # (a read-only SQLite connection may leave an empty -wal and a -shm index where the folder is
    # writable, e.g. as root; in a read-only folder it leaves nothing)
    assert set(after) - set(before) <= {"r.db-wal", "r.db-shm"}
    assert after.get("r.db-wal", (0,))[0] == 0
    got = []
    with fj.Database(path, readonly=True) as db:
        cfgs = [r.config for r in db.records(task=t)]
    replay.measure(cfgs, lambda c, r: got.append(r) or True)
    assert len(got) == 8 and all(r.ok for r in got)
    assert replay_str.optimum == replay.optimum


def test_from_database_leaves_an_open_database_open(tmp_path):
    t = fj.ops.matmul(32, 32, 32)
    with fj.Database(tmp_path / "r.db") as db:
        fj.tune(t, measurer=lambda task, target: ReplayRunner.from_oracle(task, target), progress=False,
                retime=0, strategy="random", trials=4, db=db)
        ReplayRunner.from_database(db, t)
        assert len(db.records(task=t)) == 4                # still usable


def test_from_database_without_records_of_the_task(tmp_path):
    path = tmp_path / "r.db"
    fj.tune(fj.ops.matmul(32, 32, 32), measurer=lambda task, target: ReplayRunner.from_oracle(task, target),
            progress=False, retime=0, strategy="random", trials=4, db=str(path))
    with pytest.raises(ValueError, match="no records of matmul_16x16x16"):
        ReplayRunner.from_database(path, fj.ops.matmul(16, 16, 16))


def test_from_database_asks_for_read_only(tmp_path, monkeypatch):
    """(Where permissions do not stop a writer, e.g. as root, the mode asked for is what tells.)"""
    import felixjax.testing as testing

    path = tmp_path / "r.db"
    t = fj.ops.matmul(32, 32, 32)
    fj.tune(t, measurer=lambda task, target: ReplayRunner.from_oracle(task, target), progress=False, retime=0,
            strategy="random", trials=4, db=str(path))
    opened = []

    class Spy(testing.Database):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            opened.append(self)

    monkeypatch.setattr(testing, "Database", Spy)
    ReplayRunner.from_database(path, t)
    assert len(opened) == 1 and opened[0].readonly
    with pytest.raises(Exception):                         # closed again
        opened[0].records(task=t)

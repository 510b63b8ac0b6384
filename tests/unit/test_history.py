"""History's logic without a server: points as clients write them, the checks against a
branch's history, which base state a point replays from, and what a window frees."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from pgplane.compute.driver import HistoryBounds, Point
from pgplane.compute.local.history.archiving import (
    BASE_STATE,
    HistoryDirs,
    list_bases,
    prune,
)
from pgplane.compute.local.history.bases import stopped_by
from pgplane.compute.local.history.pitr import _likely_read, choose_base
from pgplane.compute.local.history.replay import RESTORED
from pgplane.core.models import Branch, Project
from pgplane.errors import BadRequest
from pgplane.services import history

_US = 1_000_000
SEGMENT = 16 << 20


def test_lsns_and_times_are_read_as_postgres_and_rfc_3339_write_them() -> None:
    assert history.parse_lsn("16/B374D848", "parent_lsn") == (0x16 << 32) | 0xB374D848
    assert history.format_lsn((0x16 << 32) | 0xB374D848) == "16/B374D848"
    for bad in ("16/", "/1", "1/2/3", "G/1", "123456789/1", "0/0"):
        with pytest.raises(BadRequest):
            history.parse_lsn(bad, "parent_lsn")
    assert history.parse_time("1970-01-01T00:00:01.000002Z", "t") == _US + 2
    assert history.parse_time("1970-01-01T01:00:00+01:00", "t") == 0
    for bad in ("yesterday", "2026-01-01T00:00:00", ""):
        with pytest.raises(BadRequest):
            history.parse_time(bad, "t")
    with pytest.raises(BadRequest, match="not both"):
        history.parse_point(
            lsn="0/1", timestamp="1970-01-01T00:00:00Z", lsn_field="a", time_field="b"
        )


def _check(point: Point, *, retention: int = 3600, created_ago: int = 1800, **bounds: int) -> None:
    now = time.time_ns() // 1000
    project = Project(
        id="p",
        account_id="a",
        name="p",
        region_id="r",
        pg_version=18,
        provisioner="k8s-pod",
        store_passwords=True,
        history_retention_seconds=retention,
        default_endpoint_settings={},
        settings={},
        created_at=now,
        updated_at=now,
    )
    created = now - created_ago * _US
    branch = Branch(
        id="br-a",
        project_id="p",
        parent_id=None,
        name="main",
        default=True,
        protected=False,
        current_state="ready",
        pending_state=None,
        state_changed_at=created,
        created_at=created,
        updated_at=created,
    )
    named = history.NamedPoint(point, "parent_timestamp", "x")
    history.check(named, project=project, branch=branch, bounds=HistoryBounds(**bounds))


def test_each_point_outside_the_history_is_refused_saying_why() -> None:
    now = time.time_ns() // 1000
    _check(Point(time_us=now - 60 * _US))  # inside everything: taken
    with pytest.raises(BadRequest, match="in the future"):
        _check(Point(time_us=now + 60 * _US))
    with pytest.raises(BadRequest, match="before branch br-a existed"):
        _check(Point(time_us=now - 3000 * _US), created_ago=1800)
    with pytest.raises(BadRequest, match="window of 3600 seconds"):
        _check(Point(time_us=now - 4000 * _US), created_ago=9000)
    with pytest.raises(BadRequest, match="keeps no history"):
        _check(Point(time_us=now - 60 * _US), retention=0)
    with pytest.raises(BadRequest, match="history of branch br-a starts"):
        _check(Point(time_us=now - 600 * _US), start_time_us=now - 300 * _US)
    with pytest.raises(BadRequest, match="never had this LSN"):
        _check(Point(lsn=1000), start_lsn=10, head_lsn=999)
    with pytest.raises(BadRequest, match="before the history"):
        _check(Point(lsn=5), start_lsn=10, head_lsn=999)
    with pytest.raises(BadRequest, match="no history yet"):
        _check(Point(lsn=5), head_lsn=999)
    _check(Point(lsn=500), start_lsn=10, head_lsn=999)
    _check(Point(lsn=500))  # nothing known (a detached project): the operation decides


def _base(dirs: HistoryDirs, start_segment: int, end_time_us: int) -> None:
    end_lsn = start_segment * SEGMENT + 100
    path = dirs.bases / f"{end_lsn:016X}"
    (path / "pgdata").mkdir(parents=True)
    state = {
        "start_lsn": start_segment * SEGMENT,
        "end_lsn": end_lsn,
        "end_time": end_time_us,
        "segment_size": SEGMENT,
        "files": {},
    }
    (path / BASE_STATE).write_text(json.dumps(state))


def test_a_window_keeps_the_base_before_it_and_what_follows(tmp_path: Path) -> None:
    dirs = HistoryDirs(tmp_path)
    dirs.wal.mkdir()
    now = 10_000 * _US
    _base(dirs, 1, now - 5000 * _US)
    _base(dirs, 4, now - 2000 * _US)
    _base(dirs, 7, now - 100 * _US)
    for segno in range(1, 10):
        (dirs.wal / f"00000001000000000000000{segno}").write_bytes(b"x" * 10)
    assert choose_base(list_bases(dirs), Point(lsn=5 * SEGMENT)) == list_bases(dirs)[1]
    assert choose_base(list_bases(dirs), Point(time_us=now - 6000 * _US)) is None
    assert choose_base(list_bases(dirs), Point(time_us=now)) == list_bases(dirs)[2]

    assert prune(dirs, 3000, now) == 0  # the window starts 3000 s back: the base 2000 s back...
    kept = [b.start_lsn // SEGMENT for b in list_bases(dirs)]
    assert kept == [1, 4, 7]  # ...is inside; the one 5000 s back is the one before the window
    assert prune(dirs, 1000, now) > 0  # from 1000 s back: the base before it is the second
    assert [b.start_lsn // SEGMENT for b in list_bases(dirs)] == [4, 7]
    assert sorted(p.name[-1] for p in dirs.wal.iterdir()) == [str(s) for s in range(4, 10)]
    prune(dirs, 0, now)  # no history kept at all
    assert list_bases(dirs) == []
    assert list(dirs.wal.iterdir()) == []


def test_base_states_taken_close_together_are_thinned_but_the_newest_is_kept(
    tmp_path: Path,
) -> None:
    """Taken often (a recovery replays from the newest), kept sparsely (each is a copy)."""
    dirs = HistoryDirs(tmp_path)
    dirs.wal.mkdir()
    now = 10_000 * _US
    for segment in (1, 2, 3, 5, 9, 10, 11):
        _base(dirs, segment, now - (100 - segment) * _US)
    apart = 4 * SEGMENT  # a kept base is followed by four segments' WAL before the next kept
    prune(dirs, 3600, now, lambda base: apart)
    kept = [b.start_lsn // SEGMENT for b in list_bases(dirs)]
    # 1 kept (the oldest); 2, 3 too close to it; 5 four past it; 9 four past 5; 10 too
    # close to 9; 11 the newest.
    assert kept == [1, 5, 9, 11]
    prune(dirs, 3600, now, lambda base: apart)  # converges
    assert [b.start_lsn // SEGMENT for b in list_bases(dirs)] == kept
    prune(dirs, 3600, now)  # without a spacing, every one in the window stays
    assert [b.start_lsn // SEGMENT for b in list_bases(dirs)] == kept


def test_stopped_data_is_dated_no_earlier_than_its_last_write(tmp_path: Path) -> None:
    """A state dated early would be taken to hold only what was committed by then."""
    control = tmp_path / "global" / "pg_control"
    control.parent.mkdir()
    control.write_bytes(b"")
    os.utime(control, ns=(1_700_000_041_900_000_001, 1_700_000_041_900_000_001))
    assert stopped_by(tmp_path) == 1_700_000_041_900_002


def test_the_segments_a_replay_reads_are_told_beforehand_or_read_from_its_log(
    tmp_path: Path,
) -> None:
    dirs = HistoryDirs(tmp_path)
    dirs.wal.mkdir()
    names = [f"00000001000000000000000{n}" for n in range(1, 6)]
    for n, name in enumerate(names, start=1):
        (dirs.wal / name).write_bytes(b"")
        os.utime(dirs.wal / name, ns=(n * 10 * 1000, n * 10 * 1000))  # written at n*10 us
    # A time: up to the first segment written at or after it (the stop may lie in any later
    # one, which the log then names).
    assert _likely_read(dirs, names, SEGMENT, Point(time_us=25)) == names[:3]
    assert _likely_read(dirs, names, SEGMENT, Point(time_us=30)) == names[:3]
    assert _likely_read(dirs, names, SEGMENT, Point(lsn=3 * SEGMENT + 5)) == names[:3]
    assert _likely_read(dirs, names, SEGMENT, None) == names
    log = (
        '2026-11-24 LOG:  restored log file "000000010000000000000004" from archive\n'
        '2026-11-24 LOG:  restored log file "00000002.history" from archive\n'
        "2026-11-24 LOG:  redo done at 0/4000028\n"
    )
    assert RESTORED.findall(log) == ["000000010000000000000004", "00000002.history"]

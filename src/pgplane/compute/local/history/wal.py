"""WAL segments: which of a data directory's segments a copy of it needs.

A segment is named ``TTTTTTTTXXXXXXXXYYYYYYYY``: timeline, then the segment number split in two
(``segno // segments_per_xlogid``, ``segno % segments_per_xlogid``), all hex. ``pg_wal`` holds
more than the WAL that matters: segments before the last checkpoint's REDO point are kept only
for ``wal_keep_size``/slots or not yet removed, and segments after the current one are old ones
renamed for reuse. A copy takes only the segments its recovery reads.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.postgres.binaries import PgInstall
from pgplane.compute.local.tenants.user import C_LOCALE, RunAs

_SEGMENT = re.compile(r"[0-9A-F]{24}")
_HISTORY = re.compile(r"[0-9A-F]{8}\.history")
_XLOGID = 0x1_0000_0000
_CONTROLDATA_TIMEOUT = 30.0
# A checkpoint record is ~120 bytes, plus a page header if it crosses a page: one starting this
# close to the end of a segment may end in the next one.
_CHECKPOINT_RECORD_MAX = 512


def parse_lsn(text: str) -> int:
    """``'16/B374D848'`` as a number."""
    high, _, low = text.strip().partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def segment_bytes(setting: str) -> int:
    """``wal_segment_size`` as SHOW prints it (``16MB``); ValueError unless a power of two up
    to 1 GiB (what Postgres allows)."""
    units = {"kB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
    value = next(
        (int(setting[: -len(u)]) * f for u, f in units.items() if setting.endswith(u)), None
    )
    value = int(setting) if value is None else value
    if value <= 0 or value > 1 << 30 or value & (value - 1):
        raise ValueError(f"wal_segment_size {setting!r}")
    return value


def segment_name(timeline: int, segno: int, segment_size: int) -> str:
    per_xlogid = _XLOGID // segment_size
    return f"{timeline:08X}{segno // per_xlogid:08X}{segno % per_xlogid:08X}"


def parse_segment(name: str, segment_size: int) -> tuple[int, int]:
    """(timeline, segment number) of a segment file name."""
    if _SEGMENT.fullmatch(name) is None:
        raise ComputeError(f"{name!r} is not a WAL segment name")
    per_xlogid = _XLOGID // segment_size
    return int(name[:8], 16), int(name[8:16], 16) * per_xlogid + int(name[16:], 16)


def segment_range(first: str, last: str, segment_size: int) -> list[str]:
    """The segment names from ``first`` through ``last``, on ``first``'s timeline."""
    timeline, start = parse_segment(first, segment_size)
    _, stop = parse_segment(last, segment_size)
    return [segment_name(timeline, segno, segment_size) for segno in range(start, stop + 1)]


def wal_files(pg_wal: Path) -> tuple[list[str], list[str]]:
    """The segment and timeline history file names in ``pg_wal``, sorted."""
    names = sorted(p.name for p in pg_wal.iterdir())
    segments = [n for n in names if _SEGMENT.fullmatch(n)]
    histories = [n for n in names if _HISTORY.fullmatch(n)]
    return segments, histories


@dataclass(frozen=True, slots=True)
class ControlData:
    """What a copy needs from ``pg_control`` (read by ``pg_controldata``)."""

    state: str
    checkpoint: int
    redo: int
    timeline: int
    segment_size: int

    @property
    def shut_down(self) -> bool:
        """Cleanly shut down: nothing to replay after the (shutdown) checkpoint record."""
        return self.state == "shut down"


async def read_control_data(install: PgInstall, run_as: RunAs, pgdata: Path) -> ControlData:
    binary = install.bin_dir / "pg_controldata"
    if not binary.is_file():
        raise ComputeError(f"{binary} is missing: it reads a stopped branch's control file")
    # pg_controldata translates its labels: the C locale's are the ones parsed below.
    out = await run_as.run([binary, "-D", pgdata], time_limit=_CONTROLDATA_TIMEOUT, env=C_LOCALE)
    return parse_control_data(out)


def parse_control_data(out: str) -> ControlData:
    fields = {}
    for line in out.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    try:
        return ControlData(
            state=fields["Database cluster state"],
            checkpoint=parse_lsn(fields["Latest checkpoint location"]),
            redo=parse_lsn(fields["Latest checkpoint's REDO location"]),
            timeline=int(fields["Latest checkpoint's TimeLineID"]),
            segment_size=int(fields["Bytes per WAL segment"]),
        )
    except (KeyError, ValueError) as exc:
        raise ComputeError(f"unexpected pg_controldata output ({exc}): {out[:500]}") from None


def needed_segments(control: ControlData, present: Iterable[str]) -> list[str]:
    """The segments a copy of a stopped cluster needs, of those ``present`` in its pg_wal.

    Cleanly shut down: only the segment(s) holding the shutdown checkpoint record, which is all
    that start-up reads (its REDO point is the record itself). Otherwise (the postmaster died):
    everything from the checkpoint's REDO segment on, which crash recovery replays; later
    segments that are renamed old ones end the replay, as they would on the parent itself.
    """
    size = control.segment_size
    first = control.redo // size
    present_segnos = {}
    for name in present:
        timeline, segno = parse_segment(name, size)
        if timeline == control.timeline:
            present_segnos[segno] = name
    if first not in present_segnos:
        missing = segment_name(control.timeline, first, size)
        raise ComputeError(f"WAL segment {missing} of the last checkpoint is missing")
    if control.shut_down:
        last = (control.checkpoint + _CHECKPOINT_RECORD_MAX) // size
        return [present_segnos[s] for s in range(first, last + 1) if s in present_segnos]
    return [name for segno, name in sorted(present_segnos.items()) if segno >= first]

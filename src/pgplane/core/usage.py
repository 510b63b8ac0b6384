"""Compute usage as the store keeps it: per endpoint, summed, and per hour.

The driver reports each run of an endpoint's compute (from its start to its stop) with the CPU
time it used so far, by the kernel's accounting. The store keeps, per endpoint, the totals of
every run and where the last one seen stood (its name, start, CPU and the time it was seen at).
Folding a reading adds only what is new since then, so a reading seen twice, or an older one
arriving after a newer one, adds nothing; a run newer than the one kept adds all it used since
its start. Totals grow only with a run's own figures, so they never grow while the compute is
suspended; they survive the compute's restarts (each is a new run) and the platform's (the
kept run is taken up where it was). A crash of the compute loses what it used since the last
sample of that run, no more.

Neon's meanings (its API document): ``active_time_seconds``, wall-clock time the computes ran;
``compute_time_seconds``, that time times the CPUs the compute had ("2 CPUs for 1 second is 2"),
here its cgroup's quota when read, else its maximum compute units; ``cpu_used_sec``, the CPU time
the compute's processes used as the kernel counted it.
"""

from __future__ import annotations

from dataclasses import dataclass

US = 1_000_000
HOUR_US = 3600 * US


@dataclass(frozen=True, slots=True)
class EndpointUsage:
    """An endpoint's totals over all its runs, and where its last run seen stood."""

    endpoint_id: str
    project_id: str
    branch_id: str
    run: str | None = None
    run_started_us: int = 0
    run_cpu_us: int = 0
    run_seen_us: int = 0
    cpu_us: int = 0
    active_us: int = 0
    cu_us: int = 0  # compute units x microseconds


@dataclass(frozen=True, slots=True)
class Totals:
    """Usage summed over endpoints (of a branch, or a project), in Neon's units."""

    cpu_us: int = 0
    active_us: int = 0
    cu_us: int = 0

    def __add__(self, other: Totals) -> Totals:
        return Totals(
            self.cpu_us + other.cpu_us, self.active_us + other.active_us, self.cu_us + other.cu_us
        )

    @classmethod
    def of(cls, usage: EndpointUsage) -> Totals:
        return cls(usage.cpu_us, usage.active_us, usage.cu_us)

    @property
    def cpu_used_sec(self) -> int:
        return self.cpu_us // US

    @property
    def active_time_seconds(self) -> int:
        return self.active_us // US

    @property
    def compute_time_seconds(self) -> int:
        return self.cu_us // US

    @property
    def compute_us_hours(self) -> float:
        """Compute-unit hours (what Neon's console shows compute time in)."""
        return self.cu_us / US / 3600


@dataclass(frozen=True, slots=True)
class HourUsage:
    """What a branch's computes used within one hour (``hour``: its start, epoch seconds)."""

    project_id: str
    branch_id: str
    hour: int
    cpu_us: int = 0
    active_us: int = 0
    cu_us: int = 0
    logical_byte_s: int = 0
    data_byte_s: int = 0
    history_byte_s: int = 0
    archived_byte_s: int = 0  # what its history's objects take in the object store
    written_bytes: int = 0  # WAL its computes wrote (as sampled: in the sample's hour)


@dataclass(frozen=True, slots=True)
class BranchSizes:
    """What a branch takes as last sampled (bytes; None: never known): its databases' size as
    Postgres reports it (``logical``, kept while no compute runs), its data's blocks on disk
    (``data``) and its history's (``history``: WAL archive and base states)."""

    project_id: str
    branch_id: str
    logical: int | None
    data: int | None
    history: int | None
    sampled_us: int
    wal_lsn: int | None = None  # where its WAL stood when last seen by a running compute
    written: int = 0  # WAL bytes its computes wrote (Neon's written_data_bytes)
    # With an object store: when its newest shipped WAL was written (epoch us), and the bytes
    # its history's objects take there.
    archived_at: int | None = None
    archived: int | None = None
    # Its archived WAL not shipped yet (bytes), the oldest written at ``unarchived_since``.
    unarchived: int | None = None
    unarchived_since: int | None = None


@dataclass(frozen=True, slots=True)
class StorageTotals:
    """Branches' sizes summed (what is unknown counts as 0)."""

    logical: int = 0
    data: int = 0
    history: int = 0
    byte_hours: int = 0  # logical size and history over time (Neon's data_storage_bytes_hour)
    written: int = 0  # WAL written (Neon's written_data_bytes)
    # With an object store: what the branches' history objects take there, and the local
    # history of those branches (of which the objects are the kept copy).
    archived: int = 0
    archived_history: int = 0

    def __add__(self, other: StorageTotals) -> StorageTotals:
        return StorageTotals(
            self.logical + other.logical,
            self.data + other.data,
            self.history + other.history,
            self.byte_hours + other.byte_hours,
            self.written + other.written,
            self.archived + other.archived,
            self.archived_history + other.archived_history,
        )

    @property
    def synthetic(self) -> int:
        """Neon's synthetic storage size: logical data and WAL (here: the history). A branch's
        history is counted where it is kept: with an object store, as its objects take there
        (sealed), once known; on this disk before that, and without one."""
        return self.logical + self.history - self.archived_history + self.archived

    @classmethod
    def of(cls, sizes: BranchSizes) -> StorageTotals:
        known = sizes.archived is not None
        return cls(
            sizes.logical or 0,
            sizes.data or 0,
            sizes.history or 0,
            written=sizes.written,
            archived=sizes.archived or 0,
            archived_history=(sizes.history or 0) if known else 0,
        )


def integrate(kept: BranchSizes, *, end: int) -> list[HourUsage]:
    """The storage ``kept`` says the branch took from when it was sampled to ``end``, as
    byte-seconds per hour (the sizes held until the next sample)."""
    out: list[HourUsage] = []
    at = kept.sampled_us
    while at < end:
        cut = min(end, (at // HOUR_US + 1) * HOUR_US)
        seconds = (cut - at) / US
        out.append(
            HourUsage(
                kept.project_id,
                kept.branch_id,
                at // HOUR_US * 3600,
                logical_byte_s=int((kept.logical or 0) * seconds),
                data_byte_s=int((kept.data or 0) * seconds),
                history_byte_s=int((kept.history or 0) * seconds),
                archived_byte_s=int((kept.archived or 0) * seconds),
            )
        )
        at = cut
    return out


def spread(
    kept: EndpointUsage, *, start: int, end: int, cpu_us: int, cu_us: int
) -> list[HourUsage]:
    """CPU and compute-unit time spread evenly over ``[start, end)``, cut at hour boundaries
    (a reading spanning no time puts its CPU in the hour it was read in)."""
    if end <= start:
        if cpu_us == 0:
            return []
        hour = end // HOUR_US * 3600
        return [HourUsage(kept.project_id, kept.branch_id, hour, cpu_us=cpu_us)]
    out: list[HourUsage] = []
    at, wall, cpu_left, cu_left = start, end - start, cpu_us, cu_us
    while at < end:
        cut = min(end, (at // HOUR_US + 1) * HOUR_US)
        last = cut == end
        part = cut - at
        cpu = cpu_left if last else cpu_us * part // wall
        cu = cu_left if last else cu_us * part // wall
        cpu_left, cu_left = cpu_left - cpu, cu_left - cu
        out.append(HourUsage(kept.project_id, kept.branch_id, at // HOUR_US * 3600, cpu, part, cu))
        at = cut
    return out

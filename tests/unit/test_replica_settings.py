"""A read-only compute's standby settings (compute/local/replicas/standby.py), without Postgres."""

from __future__ import annotations

from pathlib import Path

from pgplane.compute.local.replicas.standby import parse_minima, raised, standby_settings

CONTROLDATA = """\
pg_control version number:            1800
max_connections setting:              450
max_worker_processes setting:         8
max_wal_senders setting:              10
max_prepared_xacts setting:           0
max_locks_per_xact setting:           99999999999
Database cluster state:               in production
"""


def test_the_primary_s_values_are_read_and_bounded() -> None:
    assert parse_minima(CONTROLDATA) == {
        "max_connections": 450,
        "max_worker_processes": 8,
        "max_wal_senders": 10,
        "max_prepared_transactions": 0,
        "max_locks_per_transaction": 2147483647,  # a forged control file stays within bounds
    }
    assert parse_minima("max_connections setting: lots\nnonsense") == {}


def test_settings_are_raised_to_the_primary_s_never_lowered() -> None:
    own = {"Max_Connections": "112", "max_wal_senders": "20", "work_mem": "4MB"}
    out = raised(own, {"max_connections": 450, "max_wal_senders": 10, "max_worker_processes": 8})
    assert out == {
        "max_connections": "450",
        "max_wal_senders": "20",
        "work_mem": "4MB",
        "max_worker_processes": "8",
    }


def test_the_stream_and_the_archive_are_named_quoted() -> None:
    settings = standby_settings(
        endpoint_id="ep-a",
        wal_sockets=Path("/run/it's"),
        primary_port=5432,
        archive=Path("/data/a b/wal"),
    )
    assert settings["primary_conninfo"] == (
        "host='/run/it\\'s' port='5432' user='cloud_admin' application_name='ep-a'"
        " connect_timeout='5' sslmode='disable'"
    )
    assert settings["restore_command"] == "cp '/data/a b/wal'/%f %p"
    assert settings["hot_standby"] == "on" and settings["archive_mode"] == "off"
    alone = standby_settings(
        endpoint_id="ep-a", wal_sockets=Path("/x"), primary_port=None, archive=None
    )
    # Empty, not absent: what postgresql.auto.conf says never applies.
    assert alone["primary_conninfo"] == "" and alone["restore_command"] == ""

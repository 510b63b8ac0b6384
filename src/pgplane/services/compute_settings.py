"""What a user may set on a compute: its size (CU), its suspend timeout, its Postgres settings.

Checked when an endpoint is created or changed, and when a project's default endpoint settings
are: a compute restarted with a value Postgres refuses would not start again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Protocol

from pgplane.compute.driver import InvalidSettings
from pgplane.errors import BadRequest
from pgplane.services import names

MIN_CU = 0.25
MAX_CU = 16.0
MAX_SUSPEND_TIMEOUT_SECONDS = 604_800

# The Postgres settings a user may set per endpoint. Everything else (ports, sockets, paths,
# libraries, WAL archiving, TLS) belongs to the platform; sizes follow the compute's CU.
_USER_SETTINGS = frozenset(
    {
        "application_name",
        "datestyle",
        "default_statistics_target",
        "default_transaction_isolation",
        "effective_cache_size",
        "effective_io_concurrency",
        "enable_seqscan",
        "idle_in_transaction_session_timeout",
        "idle_session_timeout",
        "intervalstyle",
        "jit",
        "lock_timeout",
        "log_connections",
        "log_disconnections",
        "log_duration",
        "log_lock_waits",
        "log_min_duration_statement",
        "log_min_messages",
        "log_statement",
        "log_temp_files",
        "maintenance_work_mem",
        "max_connections",
        "max_parallel_workers",
        "max_parallel_workers_per_gather",
        "max_worker_processes",
        "random_page_cost",
        "search_path",
        "seq_page_cost",
        "shared_buffers",
        "statement_timeout",
        "temp_buffers",
        "timezone",
        "work_mem",
    }
)
_USER_SETTING_PREFIXES = ("autovacuum", "pg_stat_statements.")
_SETTING_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,62}$")
MAX_SETTING_VALUE = 256
# What pg_settings() takes, as regular expressions for the API document: a name it allows (in
# any case, as Postgres reads them), and a value without control characters.
SETTING_NAME_PATTERN = (
    "^("
    + "|".join(names.any_case(n) for n in sorted(_USER_SETTINGS))
    + "|"
    + "|".join(
        f"{names.any_case(p)}[A-Za-z0-9_.]{{0,{63 - len(p)}}}" for p in _USER_SETTING_PREFIXES
    )
    + ")$"
)
SETTING_VALUE_PATTERN = r"^[^\x00-\x1f]*$"
SETTING_REFUSED = "Postgres does not accept the value"


class SettingsCheck(Protocol):
    """Whether Postgres ``pg_version`` takes these values (the driver's ``check_settings``)."""

    async def __call__(self, *, pg_version: int, settings: Mapping[str, str]) -> None: ...


def pg_settings(values: dict[str, Any]) -> dict[str, str]:
    """Validate user Postgres settings: known tunables only, plain string values."""
    checked = {}
    for name, value in values.items():
        lowered = name.lower()
        if _SETTING_NAME.match(name) is None or not (
            lowered in _USER_SETTINGS or lowered.startswith(_USER_SETTING_PREFIXES)
        ):
            raise BadRequest(f"pg_settings: {name!r} cannot be set on a compute here")
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise BadRequest(f"pg_settings: the value of {name!r} must be a string")
        text = str(value)
        if len(text) > MAX_SETTING_VALUE or any(ord(c) < 32 for c in text):
            raise BadRequest(f"pg_settings: invalid value for {name!r}")
        checked[lowered] = text
    return checked


async def checked_pg_settings(
    values: dict[str, Any], *, pg_version: int, check: SettingsCheck
) -> dict[str, str]:
    """:func:`pg_settings`, then each value as Postgres itself reads it (type, unit, range,
    choices): a compute restarted with a value Postgres refuses would not start again."""
    settings = pg_settings(values)
    try:
        await check(pg_version=pg_version, settings=settings)
    except InvalidSettings as exc:
        raise BadRequest(f"pg_settings: {SETTING_REFUSED}: {exc}") from None
    return settings


def cu(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"{key} must be a number")
    if not MIN_CU <= value <= MAX_CU or (value * 4) % 1:
        raise BadRequest(f"{key} must be between {MIN_CU} and {MAX_CU:g}, in steps of 0.25")
    return float(value)


def suspend_timeout(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest("suspend_timeout_seconds must be an integer")
    if not -1 <= value <= MAX_SUSPEND_TIMEOUT_SECONDS:
        raise BadRequest(
            f"suspend_timeout_seconds must be between -1 and {MAX_SUSPEND_TIMEOUT_SECONDS}"
        )
    return value


def limits(low: float, high: float) -> tuple[float, float]:
    if low > high:
        raise BadRequest("autoscaling_limit_min_cu must not exceed autoscaling_limit_max_cu")
    return low, high


async def check_defaults(
    values: dict[str, Any], *, pg_version: int, check: SettingsCheck
) -> dict[str, Any]:
    """A project's ``default_endpoint_settings``, refused now if an endpoint made from them
    would be (rather than at the next branch with a compute)."""
    limits(
        cu(values.get("autoscaling_limit_min_cu", MIN_CU), "autoscaling_limit_min_cu"),
        cu(values.get("autoscaling_limit_max_cu", MIN_CU), "autoscaling_limit_max_cu"),
    )
    suspend_timeout(values.get("suspend_timeout_seconds", 0))
    if "pg_settings" in values:
        checked = await checked_pg_settings(
            values["pg_settings"], pg_version=pg_version, check=check
        )
        return {**values, "pg_settings": checked}
    return values

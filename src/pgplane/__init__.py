"""pgplane: a self-hostable Postgres platform with a Neon-compatible management API."""

__version__ = "0.1.0"

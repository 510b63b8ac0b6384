"""The operations engine: claims operations with a lease and runs one handler per action."""

from pgplane.engine.engine import Engine

__all__ = ["Engine"]

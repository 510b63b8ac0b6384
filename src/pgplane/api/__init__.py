"""The management API: thin routes over the services, Neon's shapes, one error body."""

from pgplane.api.app import create_app

__all__ = ["create_app"]

"""Persistence of desired state and operations, behind one contract (:mod:`pgplane.store.base`)."""

from pgplane.store.base import Store, Tx

__all__ = ["Store", "Tx"]

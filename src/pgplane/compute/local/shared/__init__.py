"""Shared storage: what moves between nodes (the cold archive, each branch's shipped history)."""

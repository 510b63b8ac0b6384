"""Schema-only branches: the source's roles and schema read, replayed into a new root cluster."""

"""The cold archive: a detached project's whole tree as one checksummed file."""

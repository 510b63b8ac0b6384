"""Postgres itself: installations and templates, postmasters and their identity, the platform's
sessions on a compute (roles, checks, verifiers)."""

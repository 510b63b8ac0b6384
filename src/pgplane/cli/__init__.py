"""The ``pgplane`` command."""

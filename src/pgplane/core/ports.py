"""Whether a TCP port is free on this machine: for compute ports, which other programs share."""

from __future__ import annotations

import socket


def is_free(port: int, host: str = "") -> bool:
    """Whether a listener could bind ``host:port`` now ("" is every address).

    SO_REUSEADDR as Postgres sets it on its listeners, so a port whose last connections linger
    in TIME_WAIT counts as free, as it is for the postmaster.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True

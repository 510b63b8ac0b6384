"""Log lines a client can cause, at most one per cause a minute.

Some warnings follow from what a client does: a stranger's login naming a role on a compute
that cannot be asked, a connection the kernel had no descriptor for. Each is worth saying; a
thousand a second of the same are not, and would fill the disk and bury the others. A cause (an
endpoint, say: never anything a client can make up a new one of at each try) is said once, then
kept quiet for :data:`EVERY` seconds; the next line of it says how many were left out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable

EVERY = 60.0
_CAUSES = 4096  # causes remembered; past this the quietest are forgotten first


class Sparse:
    def __init__(self, logger: logging.Logger, *, every: float = EVERY) -> None:
        self._log = logger
        self._every = every
        self._said: dict[Hashable, tuple[float, int]] = {}  # cause -> when said, left out since

    def warning(self, cause: Hashable, msg: str, *args: object) -> None:
        now = time.monotonic()
        said = self._said.get(cause)
        if said is not None and now - said[0] < self._every:
            self._said[cause] = (said[0], said[1] + 1)
            return
        if said is None and len(self._said) >= _CAUSES:
            for old in [c for c, (at, _) in self._said.items() if now - at >= self._every]:
                del self._said[old]
            if len(self._said) >= _CAUSES:
                del self._said[next(iter(self._said))]  # the one said longest ago
        self._said.pop(cause, None)
        self._said[cause] = (now, 0)
        left_out = 0 if said is None else said[1]
        if left_out:
            msg = f"{msg} (and {left_out} more like it since the last said)"
        self._log.warning(msg, *args, stacklevel=2)

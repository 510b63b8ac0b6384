"""``GET /metrics``: the platform's figures in Prometheus' text format, outside ``/api/v2``.

Unauthenticated, as the health probes are, so a Prometheus needs no key of any account: what it
shows is safe for anyone who reaches the API's port. Its labels take values from small fixed sets
(actions, statuses, states, reasons); no project, endpoint, account, key or address appears in
a name, label or value, and the number of series does not grow with tenants. Served only when
metrics are on (``--no-metrics`` / ``PGPLANE_METRICS=off``: a 404, as any unknown path).
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get
from litestar.datastructures import State

from pgplane.telemetry.prometheus import CONTENT_TYPE, Prometheus


@get("/metrics", include_in_schema=False, sync_to_thread=False)
def scrape(request: Request[Any, Any, State]) -> Response[bytes]:
    """The exposition, rendered at most once a second however often it is asked for."""
    metrics: Prometheus = request.app.state.metrics
    return Response(metrics.render(), media_type=CONTENT_TYPE)

"""What every console page shares: its template context, forms, labels, and error pages."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from litestar import MediaType, Response
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.response import Redirect, Template
from litestar.template.config import TemplateConfig

from pgplane import __version__
from pgplane.console.session import PREFIX, AnyRequest, SignedIn, maybe_signed_in
from pgplane.core import clock
from pgplane.core.models import Branch, Operation
from pgplane.errors import BadRequest, PgplaneError
from pgplane.services import access, history
from pgplane.store import Tx

HERE = Path(__file__).parent
MAX_FIELD = 4096

# The contract's display labels: "the web console displays statuses as OK, Scheduling, In
# progress and Error".
LABELS = {"scheduling": "Scheduling", "running": "In progress", "finished": "OK", "failed": "Error"}


def label(status: str) -> str:
    return LABELS.get(status, status)


def unsettled(ops: list[Operation]) -> bool:
    return any(not op.status.settled for op in ops)


# The console's "delete after" choices for a branch, in seconds ("" keeps it). As Neon's
# console, a new branch is deleted after a day unless the user keeps it: preview branches are
# the ones people forget (services/expiry.py says which branches cannot expire, and why).
EXPIRY_CHOICES = (
    ("", "never"),
    ("3600", "in 1 hour"),
    ("86400", "in 1 day"),
    ("604800", "in 7 days"),
)
DEFAULT_EXPIRY = "86400"


def expires_at(choice: str, field: str = "expires_in") -> int | None:
    """The time a "delete after" choice means from now (us), None for never; a 400 naming the
    field for anything the form does not offer."""
    if choice not in dict(EXPIRY_CHOICES):
        raise BadRequest(f"{field}: choose one of the offered times, not {choice[:40]!r}")
    return None if not choice else (clock.now_us() // 1_000_000 + int(choice)) * 1_000_000


def point_at(fields: dict[str, str], field: str) -> history.NamedPoint | None:
    """The time of a branch's history a form names in ``field`` (RFC 3339, as the API takes
    it), None when left empty; the API's 400 naming the field otherwise."""
    text = fields.get(field, "").strip()
    return (
        None
        if not text
        else history.parse_point(lsn=None, timestamp=text, lsn_field="lsn", time_field=field)
    )


async def history_bounds(
    me: SignedIn, project_id: str, find: Callable[[Tx], Awaitable[Branch]]
) -> history.HistoryBounds:
    """What the history of the branch ``find`` names holds now, asked of the data plane
    outside any store transaction (it may ask the branch's compute), as the API's routes do."""
    async with me.console.store.read() as tx:
        project = await access.live_project(tx, account_id=me.account_id, project_id=project_id)
        branch = await find(tx)
    return await me.console.history(
        project_id=project.id, branch_id=branch.id, pg_version=project.pg_version
    )


def when(us: int | None) -> str:
    """A stored time as the API shows it, to the second."""
    return "" if us is None else clock.format_us(us)[:19].replace("T", " ") + " UTC"


def until(us: int | None) -> str:
    """How long until a stored time, as a person says it ("in 23 hours": what is left, in its
    largest whole unit); "now" once it has come."""
    if us is None:
        return ""
    left = (us - clock.now_us()) // 1_000_000
    if left <= 0:
        return "now"
    for size, unit in ((86_400, "day"), (3_600, "hour"), (60, "minute"), (1, "second")):
        if left >= size:
            count = left // size
            return f"in {count} {unit}{'' if count == 1 else 's'}"
    raise AssertionError("unreachable")  # left >= 1 meets the last unit


def took(op: Operation) -> str:
    """How long an operation took, as its user waited: from its creation until it settled, the
    wait behind the project's earlier operations, the retries and the pauses between them
    included (the API's ``total_duration_ms`` runs from its first start, as Neon's); with its
    attempts when there were several."""
    if not op.status.settled:
        return ""
    ms = (op.updated_at - op.created_at) // 1000
    text = f"{ms} ms" if ms < 10_000 else f"{ms / 1000:.0f} s"
    attempts = op.failures_count + (op.status == "finished")
    return f"{text}, {attempts} attempts" if attempts > 1 else text


def templates() -> TemplateConfig[JinjaTemplateEngine]:
    def setup(engine: JinjaTemplateEngine) -> None:
        engine.engine.filters.update(label=label, when=when, until=until, took=took)

    return TemplateConfig(
        directory=HERE / "templates", engine=JinjaTemplateEngine, engine_callback=setup
    )


def page(request: AnyRequest, name: str, *, status_code: int = 200, **context: Any) -> Template:
    me = maybe_signed_in(request)
    common = {
        "prefix": PREFIX,
        "version": __version__,
        "me": me,
        "csrf": me.session.csrf_token if me else context.pop("csrf", ""),
    }
    return Template(
        template_name=name,
        context={**common, **context},
        status_code=status_code,
        media_type=MediaType.HTML,
    )


async def form(request: AnyRequest) -> dict[str, str]:
    """The posted form's fields, each a string of bounded length (repeated fields: the last)."""
    data = await request.form()
    return {str(k): str(v)[:MAX_FIELD] for k, v in data.items() if isinstance(v, str)}


def sign_in_first(request: AnyRequest, _: Exception) -> Response[Any]:
    """No session: pages go to the sign-in form; fragments (fetched by script) answer 401."""
    if request.headers.get("x-pgplane-fragment"):
        return Response("sign in again", status_code=401, media_type="text/plain")
    return Redirect(path=f"{PREFIX}/signin", status_code=303)


def error_page(request: AnyRequest, exc: PgplaneError) -> Template:
    """An error of the platform, shown as a page (the API answers JSON; the console HTML)."""
    response = page(
        request, "error.html", status_code=exc.status, code=exc.code, message=exc.message
    )
    response.headers.update(exc.headers)
    return response

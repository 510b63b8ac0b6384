"""The baseline app: a bare Starlette hello endpoint (served by uvicorn like pgplane)."""

from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route


async def hello(request: object) -> JSONResponse:
    return JSONResponse({"hello": "world"})


app = Starlette(routes=[Route("/", hello)])

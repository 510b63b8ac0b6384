"""The proxy's front doors, all on one port: Postgres (plain, after SSLRequest, or direct TLS with
ALPN ``postgresql``), HTTP/1.1 (plain or TLS), and a WebSocket at ``GET /v2`` carrying the
Postgres protocol, as Neon's serverless driver speaks it.

:mod:`.sniff` tells them apart by what a client sends first, without taking it off the socket;
:mod:`.postgres` reads a Postgres client's first packet; :mod:`.http` serves HTTP/1.1 over a
connection; :mod:`.router` says which request goes where; :mod:`.websocket` turns an upgraded
connection into a client the shared session steps (:mod:`pgplane.proxy.session`) serve.
"""

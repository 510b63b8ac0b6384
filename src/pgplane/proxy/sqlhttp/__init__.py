"""SQL over HTTP: Neon's ``POST /sql``, served at the proxy's HTTP door.

:mod:`.request` reads a request, :mod:`.handler` authenticates it through the doors' shared
steps and answers it, :mod:`.pool` keeps logged-in compute connections between requests and
:mod:`.reset` puts their sessions back as new, :mod:`.run` runs the queries on one (bounded in
time and size) and reads the answer through :mod:`.frames`, :mod:`.messages` is the extended
query protocol as bytes and :mod:`.render` the JSON Neon's driver parses.
"""

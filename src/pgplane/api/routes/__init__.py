"""Route handlers, one module per resource. Each parses, calls one service, maps the result."""

"""What the platform tells its operators: Prometheus metrics and structured logs.

A leaf package: the store, engine, proxy and API report into it, and it imports none of them.
"""

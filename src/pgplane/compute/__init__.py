"""Real Postgres: the compute driver contract and its local implementation.

Only the engine (through :class:`~pgplane.compute.driver.ComputeDriver`) and the process entry
points use this package; the API, proxy and scheduler never import it.
"""

"""Tenants: each project's OS user, its directories and their ownership, and the walls around
its computes (the sandbox, cgroups, and the one reader of files a tenant can write)."""

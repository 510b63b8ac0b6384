"""Read-only computes (read replicas): hot standbys of a branch, each on its own copy."""

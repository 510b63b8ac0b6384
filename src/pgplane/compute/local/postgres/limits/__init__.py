"""The branch size limit: a C library every compute preloads, built here, and its value."""

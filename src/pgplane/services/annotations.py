"""Branch annotations: a map of strings kept with a branch (Neon's ``annotation_value``).

Clients mark the branches they make with them (the create-branch-action writes
``github-pr-number``, ``github-commit-repo``, ``github-commit-ref``, …) and find them again by
listing the branches and reading ``annotations``. Neon allows 50 entries; it states no length,
so the lengths here are pgplane's, far above what the actions write (a commit message is the
longest). Set on create, replaced by a PATCH that names it (an empty map removes it), gone with
the branch.
"""

from __future__ import annotations

MAX_ENTRIES = 50
MAX_KEY = 256
MAX_VALUE = 16_384
OBJECT_TYPE = "console/branch"  # Neon's AnnotationObjectData.type for a branch

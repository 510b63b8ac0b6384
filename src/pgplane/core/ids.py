"""Identifiers in Neon's formats: ``{adj}-{noun}-{8 digits}``, ``br-…``, ``ep-…``, UUID v4."""

from __future__ import annotations

import re
import secrets
import string
import uuid

_ADJECTIVES = (
    "autumn",
    "hidden",
    "bitter",
    "misty",
    "silent",
    "empty",
    "dry",
    "dark",
    "summer",
    "icy",
    "delicate",
    "quiet",
    "white",
    "cool",
    "spring",
    "winter",
    "patient",
    "twilight",
    "dawn",
    "crimson",
    "wispy",
    "weathered",
    "blue",
    "billowing",
    "broken",
    "cold",
    "damp",
    "falling",
    "frosty",
    "green",
    "long",
    "late",
    "lingering",
    "bold",
    "little",
    "morning",
    "muddy",
    "old",
    "red",
    "rough",
    "still",
    "small",
    "sparkling",
    "shy",
    "wandering",
    "withered",
    "wild",
    "black",
    "young",
    "holy",
    "solitary",
    "fragrant",
    "aged",
    "snowy",
    "proud",
    "floral",
    "restless",
    "divine",
    "polished",
    "ancient",
    "purple",
    "lively",
    "nameless",
    "noisy",
    "steep",
    "calm",
    "royal",
    "square",
    "plain",
    "orange",
    "sweet",
    "tiny",
    "round",
    "raspy",
    "super",
    "rapid",
    "flat",
    "soft",
    "jolly",
    "fancy",
    "gentle",
    "odd",
    "mute",
    "lucky",
)
_NOUNS = (
    "waterfall",
    "river",
    "breeze",
    "moon",
    "rain",
    "wind",
    "sea",
    "morning",
    "snow",
    "lake",
    "sunset",
    "pine",
    "shadow",
    "leaf",
    "dawn",
    "glitter",
    "forest",
    "hill",
    "cloud",
    "meadow",
    "sun",
    "glade",
    "bird",
    "brook",
    "butterfly",
    "bush",
    "dew",
    "dust",
    "field",
    "fire",
    "flower",
    "firefly",
    "feather",
    "grass",
    "haze",
    "mountain",
    "night",
    "pond",
    "darkness",
    "snowflake",
    "silence",
    "sound",
    "sky",
    "shape",
    "surf",
    "thunder",
    "violet",
    "water",
    "wildflower",
    "wave",
    "resonance",
    "dream",
    "cherry",
    "tree",
    "fog",
    "frost",
    "voice",
    "paper",
    "frog",
    "smoke",
    "star",
    "hat",
    "band",
    "disk",
    "bar",
    "base",
    "block",
    "boat",
    "bread",
    "cake",
    "cell",
    "credit",
    "lab",
    "math",
    "mud",
    "queen",
    "scene",
    "unit",
    "union",
)

_DIGITS = string.digits
_ALNUM = string.ascii_lowercase + string.digits

# Path ids follow Neon's pattern; anything else cannot name an object of ours.
ID_PATTERN = re.compile(r"^[a-z0-9-]{1,60}$")


def _words() -> str:
    return f"{secrets.choice(_ADJECTIVES)}-{secrets.choice(_NOUNS)}"


def _suffix(alphabet: str, n: int = 8) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(n))


def new_project_id() -> str:
    """``old-violet-32930710``."""
    return f"{_words()}-{_suffix(_DIGITS)}"


def new_branch_id() -> str:
    """``br-noisy-breeze-a5e59rrb``."""
    return f"br-{_words()}-{_suffix(_ALNUM)}"


def new_endpoint_id() -> str:
    """``ep-misty-sea-a5833nbi``."""
    return f"ep-{_words()}-{_suffix(_ALNUM)}"


def new_snapshot_id() -> str:
    """``snap-quiet-lake-a5x8k2qd``."""
    return f"snap-{_words()}-{_suffix(_ALNUM)}"


def new_operation_id() -> str:
    """A UUID v4 string."""
    return str(uuid.uuid4())


def new_account_id() -> str:
    """Account (user) ids are UUIDs, as Neon's ``owner_id``."""
    return str(uuid.uuid4())


def new_password(length: int = 12) -> str:
    """A role password: ``npg_`` and ``length`` characters from ``[A-Za-z0-9]``, as Neon's."""
    alphabet = string.ascii_letters + string.digits
    return "npg_" + "".join(secrets.choice(alphabet) for _ in range(length))


def is_valid_id(value: str) -> bool:
    """Whether ``value`` can be a project, branch or endpoint id at all."""
    return ID_PATTERN.fullmatch(value) is not None


def is_valid_uuid(value: str) -> bool:
    """Whether ``value`` is a canonical UUID string."""
    try:
        return str(uuid.UUID(value)) == value.lower()
    except ValueError:
        return False

"""Machine paths cut from what tenants are told (issue 33, item 8)."""

from __future__ import annotations

from pathlib import Path

from pgplane.core import scrub


def test_the_data_directory_is_cut_from_a_message(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    link = tmp_path / "via-link"
    link.symlink_to(data)
    scrub.hide(link)  # as given and resolved
    said = f"could not open {data}/projects/p-1/branches/b/pgdata/PG_VERSION; see {link}"
    assert scrub.scrub(said) == (
        "could not open projects/p-1/branches/b/pgdata/PG_VERSION; see the data directory"
    )
    assert scrub.scrub("nothing of ours") == "nothing of ours"

"""Branch annotations through the HTTP API: kept with the branch, shown as Neon shows them
(``annotations`` by branch id on the list, ``annotation`` on get), replaced by a PATCH, refused
whole when malformed, and good for finding a pull request's branch as a cleanup job does."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support import Api

# On the SQLite and the PostgreSQL store: the tests that use the shared server run on each.
pytestmark = pytest.mark.both_stores

PR = {
    "github-commit-repo": "acme/shop",
    "github-pr-number": "12",
    "github-commit-ref": "feature/cart",
    "github-commit-message": "Cart: totals in cents\n\nLong body " + "x" * 2000,
}


def project(api: Api) -> tuple[str, str]:
    body = api.create_ready_project(name="annotated")
    return body["project"]["id"], body["branch"]["id"]


def create(api: Api, pid: str, name: str, annotation: dict[str, str] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"branch": {"name": name}}
    if annotation is not None:
        body["annotation_value"] = annotation
    return api.settled(pid, api.http.post(f"/projects/{pid}/branches", json=body))


def test_annotations_are_kept_and_shown_as_neon_shows_them(api: Api) -> None:
    pid, main = project(api)
    made = create(api, pid, "pr-12", PR)
    bid = made["branch"]["id"]
    got = api.http.get(f"/projects/{pid}/branches/{bid}").json()
    annotation = got["annotation"]
    assert annotation["object"] == {"type": "console/branch", "id": bid}
    assert annotation["value"] == PR
    assert annotation["created_at"] == annotation["updated_at"]
    assert annotation["created_at"].endswith("Z")

    # A branch with none: an empty map on get, and absent from the list's map.
    bare = api.http.get(f"/projects/{pid}/branches/{main}").json()["annotation"]
    assert bare == {"object": {"type": "console/branch", "id": main}, "value": {}}
    listed = api.http.get(f"/projects/{pid}/branches").json()
    assert listed["annotations"] == {bid: annotation}
    # neonctl sends {} with every create: that is no annotation.
    plain = create(api, pid, "plain", {})["branch"]["id"]
    assert set(api.http.get(f"/projects/{pid}/branches").json()["annotations"]) == {bid}

    # A page carries the annotations of its own branches only.
    page = api.http.get(
        f"/projects/{pid}/branches", params={"limit": 1, "sort_by": "name", "sort_order": "asc"}
    ).json()
    assert [b["name"] for b in page["branches"]] == ["main"] and page["annotations"] == {}
    page = api.http.get(
        f"/projects/{pid}/branches", params={"limit": 1, "sort_by": "name", "sort_order": "desc"}
    ).json()
    assert [b["id"] for b in page["branches"]] == [bid] and set(page["annotations"]) == {bid}
    assert plain not in page["annotations"]


def test_a_patch_replaces_or_removes_the_annotation(api: Api) -> None:
    pid, _ = project(api)
    bid = create(api, pid, "pr-7", {"github-pr-number": "7"})["branch"]["id"]
    url = f"/projects/{pid}/branches/{bid}"
    first = api.http.get(url).json()["annotation"]

    # A PATCH that does not name it leaves it.
    assert api.http.patch(url, json={"branch": {"name": "pr-7b"}}).status_code == 200
    assert api.http.get(url).json()["annotation"] == first

    time.sleep(1.1)  # shown to the second
    r = api.http.patch(url, json={"branch": {}, "annotation_value": {"github-pr-number": "8"}})
    assert r.status_code == 200, r.text
    second = api.http.get(url).json()["annotation"]
    assert second["value"] == {"github-pr-number": "8"}
    assert second["created_at"] == first["created_at"] < second["updated_at"]

    r = api.http.patch(url, json={"branch": {}, "annotation_value": {}})
    assert r.status_code == 200, r.text
    assert api.http.get(url).json()["annotation"]["value"] == {}
    assert api.http.get(f"/projects/{pid}/branches").json()["annotations"] == {}


def test_a_bad_annotation_is_a_400_naming_it_and_changes_nothing(api: Api) -> None:
    pid, _ = project(api)
    bid = create(api, pid, "steady", {"k": "v"})["branch"]["id"]
    before = (api.http.get(f"/projects/{pid}/branches").json(), api.operations(pid))
    for value, why in [
        ({str(i): "v" for i in range(51)}, "annotation_value: Expected `object` of length <= 50"),
        ({"": "v"}, "annotation_value: a key: Expected `str` of length >= 1"),
        ({"k" * 257: "v"}, "annotation_value: a key: Expected `str` of length <= 256"),
        ({"k": "v" * 16385}, "annotation_value[...]: Expected `str` of length <= 16384"),
        ({"k": 12}, "annotation_value[...]: Expected `str`, got `int`"),
        (["k", "v"], "annotation_value: Expected `object | null`, got `array`"),
    ]:
        r = api.http.post(
            f"/projects/{pid}/branches",
            json={"branch": {"name": "never"}, "annotation_value": value},
        )
        assert r.status_code == 400 and why in r.json()["message"], (why, r.text)
        r = api.http.patch(
            f"/projects/{pid}/branches/{bid}",
            json={"branch": {"name": "renamed"}, "annotation_value": value},
        )
        assert r.status_code == 400 and why in r.json()["message"], (why, r.text)
    assert (api.http.get(f"/projects/{pid}/branches").json(), api.operations(pid)) == before


def test_a_cleanup_job_finds_a_pull_requests_branch_by_its_annotation(api: Api) -> None:
    """As a job closing pull request 12 would: list every branch (no limit, as neonctl and the
    actions do), pick the one annotated with it, delete it; the others stay."""
    pid, _ = project(api)
    for n in ("11", "12", "13"):
        create(api, pid, f"preview/pr-{n}", {**PR, "github-pr-number": n})
    listed = api.http.get(f"/projects/{pid}/branches").json()
    (target,) = [
        branch_id
        for branch_id, a in listed["annotations"].items()
        if a["value"].get("github-pr-number") == "12"
        and a["value"].get("github-commit-repo") == "acme/shop"
    ]
    names = {b["id"]: b["name"] for b in listed["branches"]}
    assert names[target] == "preview/pr-12"
    api.settled(pid, api.http.delete(f"/projects/{pid}/branches/{target}"))
    after = api.http.get(f"/projects/{pid}/branches").json()
    assert sorted(a["value"]["github-pr-number"] for a in after["annotations"].values()) == [
        "11",
        "13",
    ]
    assert target not in {b["id"] for b in after["branches"]}

"""The store's usage records: kept per endpoint, summed, hourly, pruned (issue 23)."""

from __future__ import annotations

from pgplane.compute.model import ComputeUsage
from pgplane.core.usage import US, EndpointUsage, HourUsage, Totals
from pgplane.engine import usage
from pgplane.store import Store


async def test_hours_add_up_and_old_ones_are_pruned(any_store: Store) -> None:
    store = any_store
    a = EndpointUsage("ep-a", "p-1", "br-1", "1:1", 0, 5, 10, cpu_us=5, active_us=10, cu_us=20)
    b = EndpointUsage("ep-b", "p-1", "br-2", "2:2", 0, 1, 10, cpu_us=1, active_us=10, cu_us=3)
    async with store.write() as tx:
        await tx.put_endpoint_usage(a, [HourUsage("p-1", "br-1", 3600, cpu_us=5, cu_us=20)])
        await tx.put_endpoint_usage(b, [HourUsage("p-1", "br-2", 3600, cpu_us=1, cu_us=3)])
        await tx.put_endpoint_usage(a, [HourUsage("p-1", "br-1", 7200, cpu_us=2)])
        await tx.put_endpoint_usage(a, [HourUsage("p-1", "br-1", 3600, cpu_us=1)])
    async with store.read() as tx:
        assert await tx.get_endpoint_usage("ep-a") == a
        assert set(await tx.list_endpoint_usage("p-1")) == {"ep-a", "ep-b"}
        assert (await tx.project_usage(["p-1", "p-2"])) == {"p-1": Totals(6, 20, 23)}
        assert (await tx.branch_usage("p-1"))["br-2"] == Totals(1, 10, 3)
        hours = await tx.usage_hours("p-1", from_hour=0, to_hour=10_000)
        assert [(h.hour, h.branch_id, h.cpu_us) for h, _ in hours] == [
            (3600, "br-1", 6),
            (3600, "br-2", 1),
            (7200, "br-1", 2),
        ]
    async with store.write() as tx:
        assert await tx.prune_usage_hours(before_hour=7200) == 2
    async with store.read() as tx:
        assert len(await tx.usage_hours("p-1", from_hour=0, to_hour=10_000)) == 1


async def test_a_moved_endpoints_runs_count_for_the_branch_they_served(any_store: Store) -> None:
    """A finalized restore moves an endpoint to another branch: its run there counts for that
    branch, the one before for the branch it stopped on."""
    hour = 3600 * US
    before = ComputeUsage("1:1", hour, 2.0, "cgroup", ended_us=hour + 10 * US)
    after = ComputeUsage("2:2", hour + 20 * US, 3.0, "cgroup", ended_us=hour + 30 * US)
    for branch_id, run in (("br-old", before), ("br-new", after)):
        async with any_store.write() as tx:
            await usage.record(
                tx,
                [run],
                endpoint_id="ep-moved",
                project_id="p-1",
                branch_id=branch_id,
                default_cpus=1.0,
                now_us=hour + 40 * US,
            )
    async with any_store.read() as tx:
        hours = await tx.usage_hours("p-1", from_hour=0, to_hour=10_000)
    assert {h.branch_id: h.cpu_us for h, _ in hours} == {"br-old": 2 * US, "br-new": 3 * US}

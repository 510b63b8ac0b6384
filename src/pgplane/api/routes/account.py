"""What clients ask on start-up: who am I, my organizations, shared projects, regions; and the
connection URI of a role and database.
"""

from __future__ import annotations

from typing import Literal

from litestar import Controller, get
from litestar.params import FromPath, FromQuery, Parameter

from pgplane.api.auth import AnyRequest, authorized
from pgplane.api.presenters import EPOCH_ZERO
from pgplane.api.responses import error_responses
from pgplane.api.schemas import (
    AuthAccount,
    AuthInfo,
    BillingAccount,
    ConnectionURI,
    CurrentUser,
    Organizations,
    PaymentSource,
    ProjectsPage,
    Region,
    Regions,
)
from pgplane.services import connections


class Account(Controller):
    tags = ["Users"]  # noqa: RUF012 - Litestar reads it as an instance attribute

    @get("/auth", operation_id="getAuthDetails", responses=error_responses())
    async def auth(self, request: AnyRequest) -> AuthInfo:
        ctx = authorized(request)
        return AuthInfo(account_id=ctx.account_id, auth_method="api_key_user", auth_data="")

    @get("/users/me", operation_id="getCurrentUserInfo", responses=error_responses())
    async def me(self, request: AnyRequest) -> CurrentUser:
        ctx = authorized(request)
        async with ctx.store.read() as tx:
            account = await tx.get_account(ctx.account_id)
        email = account.email if account else ""
        name = account.name if account else ""
        # No billing here: an active account without a plan, in the shape clients parse.
        billing = BillingAccount(
            state="active",
            payment_source=PaymentSource(type="none"),
            subscription_type="UNKNOWN",
            payment_method="none",
            quota_reset_at_last=EPOCH_ZERO,
            name=name,
            email=email,
            address_city="",
            address_country="",
            address_line1="",
            address_line2="",
            address_postal_code="",
            address_state="",
        )
        return CurrentUser(
            active_seconds_limit=0,
            billing_account=billing,
            # Keys are issued by this platform's own identity provider (keycloak, in Neon's enum).
            auth_accounts=[
                AuthAccount(email=email, image="", login=email, name=name, provider="keycloak")
            ],
            email=email,
            id=ctx.account_id,
            image="",
            login=email,
            name=name,
            last_name="",
            projects_limit=ctx.settings.projects_per_account,
            branches_limit=ctx.settings.branches_per_project,
            max_autoscaling_limit=0,
            plan="self-hosted",
        )

    @get(
        "/users/me/organizations",
        operation_id="getCurrentUserOrganizations",
        responses=error_responses(),
    )
    async def organizations(self, request: AnyRequest) -> Organizations:
        """None: projects here belong to accounts, not organizations."""
        authorized(request)
        return Organizations(organizations=[])

    @get("/projects/shared", operation_id="listSharedProjects", responses=error_responses())
    async def shared_projects(
        self,
        request: AnyRequest,
        limit: int | None = Parameter(default=None, ge=1, le=400),
        cursor: str | None = Parameter(default=None, max_length=60),
    ) -> ProjectsPage:
        """Projects others shared with this account: sharing does not exist here, so none."""
        authorized(request)
        return ProjectsPage(projects=[], applications={}, integrations={})

    @get("/regions", operation_id="getActiveRegions", responses=error_responses())
    async def regions(self, request: AnyRequest) -> Regions:
        ctx = authorized(request)
        region = ctx.settings.region_id
        return Regions(
            regions=[Region(region_id=region, name=region, default=True, geo_lat="0", geo_long="0")]
        )

    @get(
        "/projects/{project_id:str}/connection_uri",
        operation_id="getConnectionURI",
        responses=error_responses(),
        tags=["Project"],
    )
    async def connection_uri(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        database_name: str = Parameter(min_length=1, max_length=63),
        role_name: str = Parameter(min_length=1, max_length=63),
        branch_id: str | None = Parameter(default=None, max_length=60),
        endpoint_id: str | None = Parameter(default=None, max_length=60),
        pooled: FromQuery[Literal["true", "false", "True", "False"] | None] = None,
    ) -> ConnectionURI:
        """A URI for ``psql`` and drivers, as it is."""
        ctx = authorized(request)
        async with ctx.store.read() as tx:
            found = await connections.find(
                tx,
                ctx.settings,
                account_id=ctx.account_id,
                project_id=project_id,
                database_name=database_name,
                role_name=role_name,
                branch_id=branch_id,
                endpoint_id=endpoint_id,
            )
        # No pooler yet: a pooled URI is the direct one (every client still connects).
        return ConnectionURI(uri=found.uri)

"""Who is asking, and where: the account, its organizations, the regions."""

from __future__ import annotations

from typing import Any

from msgspec import Struct


class AuthInfo(Struct, kw_only=True):
    account_id: str
    auth_method: str
    auth_data: str


class AuthAccount(Struct, kw_only=True):
    email: str
    image: str
    login: str
    name: str
    provider: str


class PaymentSource(Struct, kw_only=True):
    type: str


class BillingAccount(Struct, kw_only=True):
    state: str
    payment_source: PaymentSource
    subscription_type: str
    payment_method: str
    quota_reset_at_last: str
    name: str
    email: str
    address_city: str
    address_country: str
    address_line1: str
    address_line2: str
    address_postal_code: str
    address_state: str


class CurrentUser(Struct, kw_only=True):
    active_seconds_limit: int
    billing_account: BillingAccount
    auth_accounts: list[AuthAccount]
    email: str
    id: str
    image: str
    login: str
    name: str
    last_name: str
    projects_limit: int
    branches_limit: int
    max_autoscaling_limit: float
    plan: str


class Organizations(Struct, kw_only=True):
    organizations: list[dict[str, Any]]


class Region(Struct, kw_only=True):
    region_id: str
    name: str
    default: bool
    geo_lat: str
    geo_long: str


class Regions(Struct, kw_only=True):
    regions: list[Region]

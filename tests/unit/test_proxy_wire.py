"""The proxy's protocol pieces: startup packets, endpoint names, SCRAM on both sides."""

from __future__ import annotations

import base64
import struct

import pytest

from pgplane.proxy import scram, wire
from pgplane.proxy.login import check_cleartext
from pgplane.proxy.seam import Known, Password


def test_startup_round_trip_and_endpoint_option() -> None:
    startup = wire.Startup(
        wire.PROTOCOL_3,
        {"user": "u", "database": "d", "options": "-c search_path=x endpoint=ep-a-b-12 -c a=b"},
    )
    encoded = startup.encode()
    (length,) = struct.unpack("!I", encoded[:4])
    assert length == len(encoded)
    parsed = wire.parse_startup(*struct.unpack("!I", encoded[4:8]), encoded[8:])
    assert parsed == startup
    endpoint, rest = wire.take_endpoint_option(parsed)
    assert endpoint == "ep-a-b-12"
    assert rest.params["options"].split() == ["-c", "search_path=x", "-c", "a=b"]
    alone, bare = wire.take_endpoint_option(wire.Startup(wire.PROTOCOL_3, {"user": "u",
                                                          "options": "endpoint=ep-x"}))  # fmt: skip
    assert alone == "ep-x" and "options" not in bare.params


@pytest.mark.parametrize(
    "payload",
    [b"user\0u\0", b"user\0u\0database\0\0", b"\xff\0u\0\0", b"database\0d\0\0", b"\0"],
)
def test_malformed_startups_are_refused(payload: bytes) -> None:
    with pytest.raises(wire.ProtocolViolation):
        wire.parse_startup(wire.PROTOCOL_3, payload)


def test_sni_names_an_endpoint_only_under_the_proxy_host() -> None:
    assert wire.endpoint_from_sni("ep-cool-1.localhost", "localhost") == "ep-cool-1"
    assert wire.endpoint_from_sni("EP-COOL-1.LocalHost", "localhost") == "ep-cool-1"
    assert wire.endpoint_from_sni("ep-cool-1-pooler.localhost", "localhost") == "ep-cool-1"
    assert wire.endpoint_from_sni("ep-cool-1.elsewhere", "localhost") is None
    assert wire.endpoint_from_sni("localhost", "localhost") is None
    assert wire.endpoint_from_sni("../x.localhost", "localhost") is None
    assert wire.endpoint_from_sni(None, "localhost") is None


def _exchange(server: scram.ServerExchange, password: str, gs2: str, binding: bytes) -> str:
    """A client of ``server`` (as libpq would be), returning server-final-message."""
    mechanism = scram.MECHANISM_PLUS if gs2.startswith("p=") else scram.MECHANISM
    client = scram.ClientExchange(password, gs2=gs2, binding=binding)
    server_first = server.first(mechanism, client.first())
    return server.final(client.final(server_first))


def test_scram_with_and_without_channel_binding() -> None:
    cert_hash = b"\x01" * 32
    server = scram.ServerExchange(scram.derive_verifier("s3cret"), cert_hash)
    assert server.mechanisms() == [scram.MECHANISM_PLUS, scram.MECHANISM]
    assert _exchange(server, "s3cret", "p=tls-server-end-point,,", cert_hash).startswith("v=")
    plain = scram.ServerExchange(scram.derive_verifier("s3cret"), None)
    assert plain.mechanisms() == [scram.MECHANISM]
    assert _exchange(plain, "s3cret", "n,,", b"").startswith("v=")


def test_scram_refuses_wrong_password_binding_and_downgrade() -> None:
    cert_hash = b"\x01" * 32
    with pytest.raises(scram.ScramError, match="password authentication failed"):
        _exchange(scram.ServerExchange(scram.derive_verifier("s3cret"), None), "wrong", "n,,", b"")
    with pytest.raises(scram.ScramError, match="channel binding"):
        _exchange(scram.ServerExchange(scram.derive_verifier("s3cret"), cert_hash), "s3cret",
                  "p=tls-server-end-point,,", b"\x02" * 32)  # fmt: skip
    # The client could bind ("y") but we offered PLUS: someone removed it on the way.
    with pytest.raises(scram.ScramError, match="negotiation"):
        _exchange(
            scram.ServerExchange(scram.derive_verifier("s3cret"), cert_hash), "s3cret", "y,,", b""
        )


def test_client_checks_the_server_signature() -> None:
    server = scram.ServerExchange(scram.derive_verifier("pw"), None)
    client = scram.ClientExchange("pw")
    server_first = server.first(scram.MECHANISM, client.first())
    final = server.final(client.final(server_first))
    client.check(final)
    with pytest.raises(scram.ScramError):
        client.check("v=" + base64.b64encode(b"x" * 32).decode())


def test_a_verifier_as_postgres_stores_it_checks_the_password() -> None:
    made = scram.derive_verifier("s3cret")
    b64 = base64.b64encode
    text = (
        f"SCRAM-SHA-256${made.iterations}:{b64(made.salt).decode()}"
        f"${b64(made.stored_key).decode()}:{b64(made.server_key).decode()}"
    )
    verifier = scram.parse_verifier(text)
    assert verifier == made
    assert _exchange(scram.ServerExchange(verifier, None), "s3cret", "n,,", b"").startswith("v=")
    with pytest.raises(scram.ScramError, match="password authentication failed"):
        _exchange(scram.ServerExchange(verifier, None), "wrong", "n,,", b"")


@pytest.mark.parametrize(
    "text",
    [
        "md5abcdef",
        "SCRAM-SHA-256$0:c2FsdA==$" + "A" * 44 + ":" + "A" * 44,
        "SCRAM-SHA-256$4096:c2FsdA==$c2hvcnQ=:c2hvcnQ=",  # keys of the wrong length
        "SCRAM-SHA-256$4096:!!!$x:y",
        "",
    ],
)
def test_anything_but_a_scram_verifier_is_none(text: str) -> None:
    assert scram.parse_verifier(text) is None


def test_no_password_matches_a_mock_verifier() -> None:
    mock = scram.mock_verifier("nobody")
    assert mock.salt == scram.mock_verifier("nobody").salt  # stable: existence is not revealed
    with pytest.raises(scram.ScramError, match="password authentication failed"):
        _exchange(scram.ServerExchange(mock, None), "", "n,,", b"")


def test_the_client_refuses_an_iteration_count_above_the_cap() -> None:
    client = scram.ClientExchange("pw")
    nonce = client.first().split("r=", 1)[1]
    server_first = f"r={nonce}xyz,s=c2FsdA==,i={scram.MAX_ITERATIONS + 1}"
    with pytest.raises(scram.ScramError, match="iteration count"):
        client.final(server_first)


def test_error_response_fields() -> None:
    message = wire.error_response("08004", "endpoint x not found")
    assert message[:1] == b"E"
    assert wire.error_fields(message[5:]) == {
        "S": "FATAL", "V": "FATAL", "C": "08004", "M": "endpoint x not found",
    }  # fmt: skip


async def test_a_cleartext_password_is_checked_against_the_verifier() -> None:
    await check_cleartext("app", Password("s3cret"), "s3cret")
    await check_cleartext("app", Known(scram.derive_verifier("s3cret")), "s3cret")
    for secret in (Password("s3cret"), Known(scram.derive_verifier("s3cret")), None):
        with pytest.raises(scram.ScramError, match='for user "app"'):
            await check_cleartext("app", secret, "wrong")


async def test_a_password_checked_without_the_thread_is_still_checked_against_the_verifier() -> (
    None
):
    # The second check of a password finds its keys derived and skips the thread: it must
    # still be decided by the verifier of the moment. A password changed (another salt and
    # stored key) or replaced by a different one stops working at once.
    old = Known(scram.derive_verifier("s3cret"))
    await check_cleartext("app", old, "s3cret")
    assert scram.check_password_derived(old.verifier, "s3cret") is True
    new = Known(scram.derive_verifier("n3w"))
    assert scram.check_password_derived(new.verifier, "s3cret") is None  # another salt
    with pytest.raises(scram.ScramError, match='for user "app"'):
        await check_cleartext("app", new, "s3cret")
    # The same salt with other keys (a verifier rewritten in place) refuses the old password.
    rewritten = Known(
        scram.Verifier(old.verifier.iterations, old.verifier.salt, b"\0" * 32, b"\0" * 32)
    )
    assert scram.check_password_derived(rewritten.verifier, "s3cret") is False
    with pytest.raises(scram.ScramError, match='for user "app"'):
        await check_cleartext("app", rewritten, "s3cret")


def test_a_wrong_password_is_refused_with_the_hint_and_a_malformed_exchange_without() -> None:
    said = wire.error_fields(
        wire.error_response(
            wire.INVALID_PASSWORD,
            'password authentication failed for user "u"',
            hint=wire.hint_for('password authentication failed for user "u"'),
        )[5:]
    )
    assert said["H"] == wire.MISTYPED_HOST_HINT and "mistyped" in said["H"]
    assert wire.hint_for("malformed SCRAM message") == ""
    assert "H" not in wire.error_fields(wire.error_response("08P01", "x")[5:])

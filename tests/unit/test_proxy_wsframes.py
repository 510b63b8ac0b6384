"""The WebSocket door's frame reader (proxy/doors/wsframes.py), against frames made by the
``websockets`` library as a client makes them: payloads streamed through in any split, control
frames answered, and every frame a server must refuse refused with its close code."""

from __future__ import annotations

import struct

import pytest
from websockets.frames import Close, Frame, Opcode
from websockets.streams import StreamReader

from pgplane.proxy.doors import wsframes
from pgplane.proxy.doors.wsframes import FrameError, Frames


def _client(opcode: Opcode, data: bytes, *, fin: bool = True, mask: bool = True) -> bytes:
    return Frame(opcode, data, fin=fin).serialize(mask=mask, extensions=[])


def _read_all(frames: Frames, data: bytes, step: int) -> tuple[bytes, list[tuple[int, bytes]]]:
    payload, control = b"", []
    for at in range(0, len(data), step):
        got, ctl = frames.receive(data[at : at + step])
        payload += b"".join(got)
        control += ctl
    return payload, control


@pytest.mark.parametrize("step", [1, 3, 7, 100, 1 << 20])
def test_payloads_pass_through_whatever_the_reads_split(step: int) -> None:
    big = bytes(range(256)) * 300  # a 64-bit length, and a mask offset at every split
    data = (
        _client(Opcode.BINARY, b"Q\0\0\0\x0dselect 1\0")
        + _client(Opcode.PING, b"hi")
        + _client(Opcode.BINARY, b"first", fin=False)
        + _client(Opcode.CONT, b"-second", fin=False)
        + _client(Opcode.CONT, b"", fin=True)
        + _client(Opcode.BINARY, b"x" * 300)  # a 16-bit length
        + _client(Opcode.BINARY, big)
        + _client(Opcode.PONG, b"")
    )
    payload, control = _read_all(Frames(max_frame=1 << 20), data, step)
    assert payload == b"Q\0\0\0\x0dselect 1\0first-second" + b"x" * 300 + big
    assert control == [(wsframes.PING, b"hi"), (wsframes.PONG, b"")]


def test_a_closing_frame_ends_the_reading() -> None:
    frames = Frames(max_frame=1024)
    closing = _client(Opcode.CLOSE, Close(1000, "bye").serialize())
    payload, control = frames.receive(closing + _client(Opcode.BINARY, b"after"))
    assert (payload, control) == ([], [(wsframes.CLOSE, struct.pack("!H", 1000) + b"bye")])
    assert frames.closed
    assert frames.receive(_client(Opcode.BINARY, b"more")) == ([], [])


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (_client(Opcode.BINARY, b"x", mask=False), wsframes.PROTOCOL_ERROR),  # unmasked
        (_client(Opcode.TEXT, b"select 1"), wsframes.UNSUPPORTED_DATA),  # text is no Postgres
        (_client(Opcode.CONT, b"x"), wsframes.PROTOCOL_ERROR),  # nothing to continue
        (
            _client(Opcode.BINARY, b"a", fin=False) + _client(Opcode.BINARY, b"b"),
            wsframes.PROTOCOL_ERROR,  # a new message inside a fragmented one
        ),
        (_client(Opcode.BINARY, b"x" * 1025), wsframes.MESSAGE_TOO_BIG),
        (b"\x09\x81" + b"\0" * 4 + b"x", wsframes.PROTOCOL_ERROR),  # a fragmented ping
        (b"\x89\xfe\x00\x7e" + b"\0" * 4 + b"x" * 126, wsframes.PROTOCOL_ERROR),  # ping > 125
        (b"\xc2\x81" + b"\0" * 5, wsframes.PROTOCOL_ERROR),  # RSV1 without an extension
        (b"\x83\x80" + b"\0" * 4, wsframes.PROTOCOL_ERROR),  # a reserved opcode
        (b"\x8b\x80" + b"\0" * 4, wsframes.PROTOCOL_ERROR),  # a reserved control opcode
        (b"\x82\xff" + b"\x80" + b"\0" * 7 + b"\0" * 4, wsframes.PROTOCOL_ERROR),  # length 2^63
        (_client(Opcode.CLOSE, b"\x03"), wsframes.PROTOCOL_ERROR),  # a 1-byte close body
        (_client(Opcode.CLOSE, struct.pack("!H", 1005)), wsframes.PROTOCOL_ERROR),  # not sent
        (_client(Opcode.CLOSE, struct.pack("!H", 1000) + b"\xff"), wsframes.INVALID_DATA),
    ],
    # Named, not shown: a client's frames carry a random mask, and pytest-xdist needs every
    # worker to collect the same ids.
    ids=[
        "unmasked",
        "text",
        "nothing-to-continue",
        "message-inside-fragmented",
        "too-big",
        "fragmented-ping",
        "long-ping",
        "rsv1",
        "reserved-opcode",
        "reserved-control-opcode",
        "length-2^63",
        "one-byte-close",
        "close-1005",
        "close-bad-utf8",
    ],
)
def test_frames_a_server_must_refuse(data: bytes, code: int) -> None:
    with pytest.raises(FrameError) as refused:
        _read_all(Frames(max_frame=1024), data, len(data))
    assert refused.value.code == code


def test_the_frame_limit_is_per_frame_and_can_grow() -> None:
    frames = Frames(max_frame=4)
    assert frames.receive(_client(Opcode.BINARY, b"abcd")) == ([b"abcd"], [])
    frames.max_frame = 8  # logged in
    assert frames.receive(_client(Opcode.BINARY, b"abcdefgh")) == ([b"abcdefgh"], [])


def test_the_servers_frames_are_what_a_client_reads() -> None:
    for size in (0, 125, 126, 65535, 65536):
        data = bytes(range(256)) * (size // 256) + bytes(size % 256)
        reader = StreamReader()
        reader.feed_data(wsframes.frame(wsframes.BINARY, data))
        reader.feed_eof()
        parsing = Frame.parse(reader.read_exact, mask=False)
        with pytest.raises(StopIteration) as parsed:
            next(parsing)
        assert (parsed.value.value.opcode, parsed.value.value.data) == (Opcode.BINARY, data)
        assert parsed.value.value.fin

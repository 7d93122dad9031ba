"""The rules of one server session (decree._session), which the blocking and the asyncio
transports share, checked without a server, a socket or an event loop: a state is built, a
rule is called, and what it returned, raised and closed is compared."""

from __future__ import annotations

import logging

import pytest

import decree
from decree import _session as s
from decree import protocol as p
from decree.errors import NotSent

ENDPOINT = decree.Endpoint.parse("unix:/nonexistent")


class Recorded(s.SessionState):
    """A session with no transport: ``close_now`` only records why."""

    def __init__(self, version: int = 3, options: decree.Options | None = None) -> None:
        super().__init__(ENDPOINT, options or decree.Options(client_name="rules"), p.FrameDecoder())
        self.closed: list[str] = []
        self.node, self.incarnation, self.session, self.version = 7, 1, 5, version

    def close_now(self, why: str) -> None:
        self.closed.append(why)
        self._broken = self._broken or why


def hello_ok(version: int | None = 3, session: int = 9, frame_bytes_max: int = 1 << 20) -> p.HelloOk:
    negotiated = None if version is None else p.Negotiated(version, 300)
    return p.HelloOk(2, 3, session, frame_bytes_max, 8, negotiated)


def frames(data: bytes, version: int = 3) -> list[p.Message]:
    decoder = p.FrameDecoder(version=version)
    decoder.feed(data)
    out = []
    while (frame := decoder.next()) is not None:
        out.append(frame.message)
    return out


# --- the greeting -------------------------------------------------------------------------


def test_hello_offers_the_options_versions_and_names_the_client() -> None:
    assert Recorded()._hello((1, 2, 3)) == p.Hello(0, "rules", (1, 2, 3))


def test_a_negotiated_hello_ok_sets_the_version_the_idle_bound_and_the_decoder() -> None:
    conn = Recorded(version=1)
    conn._agree(hello_ok(3), (1, 2, 3))
    assert (conn.node, conn.incarnation, conn.session, conn.version) == (2, 3, 9, 3)
    assert conn.idle_timeout_ms == 300 and conn.inflight_max == 8
    assert conn._decoder.version == 3, "a version-3 session reads field trailers"
    assert conn.frame_bytes_max == p.FRAME_BYTES_MAX, "never above the client's own limit"
    assert conn.closed == []


def test_a_plain_hello_ok_means_version_1() -> None:
    conn = Recorded(version=3)
    conn._agree(hello_ok(None, frame_bytes_max=1000), ())
    assert conn.version == 1 and conn.idle_timeout_ms == 0 and conn.frame_bytes_max == 1000


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (hello_ok(3), "the server chose protocol version 3, not offered"),
        (hello_ok(2, session=0), "HelloOk with session 0"),
        (p.Pong(), "expected HelloOk, got Pong"),
    ],
)
def test_a_hello_ok_that_breaks_the_rules_is_a_violation_that_closes(reply: p.Message, why: str) -> None:
    conn = Recorded()
    with pytest.raises(decree.ProtocolError, match=why):
        conn._agree(reply, (1, 2))
    assert conn.closed == [f"protocol violation: {why}"]


def test_a_refused_hello_is_a_server_error_that_closes() -> None:
    conn = Recorded()
    with pytest.raises(decree.ServerError) as refused:
        conn._agree(p.Error(p.ErrorCode.NOT_ALLOWED, "no"), (1, 2, 3))
    assert refused.value.code == p.ErrorCode.NOT_ALLOWED and conn.closed == ["refused: no"]


def test_only_a_malformed_version_list_falls_back_to_version_1() -> None:
    malformed = decree.ServerError(p.ErrorCode.MALFORMED, "versions")
    assert s.falls_back_to_version_1(malformed, ENDPOINT, (1, 2, 3))
    assert not s.falls_back_to_version_1(malformed, ENDPOINT, ()), "a plain Hello was refused: nothing older"
    assert not s.falls_back_to_version_1(decree.ServerError(p.ErrorCode.BUSY, "busy"), ENDPOINT, (1, 2, 3))


# --- requests -----------------------------------------------------------------------------


def test_requests_take_increasing_ids_and_xids_increasing_sequences() -> None:
    conn = Recorded()
    first, _ = conn._request_frame(p.Ping(), transport=object())
    second, frame = conn._request_frame(p.Ping(), transport=object())
    assert (first, second) == (1, 2) and frames(frame) == [p.Ping()]
    a, b = conn.next_xid(), conn.next_xid()
    assert a.origin is not None and b.origin is not None
    assert (a.origin.node, a.origin.session, a.origin.sequence, b.origin.sequence) == (7, 5, 1, 2)


def test_a_request_on_a_broken_session_or_without_a_transport_is_not_sent() -> None:
    conn = Recorded()
    with pytest.raises(NotSent, match="is broken: None"):
        conn._request_frame(p.Ping(), transport=None)
    conn.close_now("read failed")
    with pytest.raises(NotSent, match="is broken: read failed"):
        conn._request_frame(p.Ping(), transport=object())
    assert conn._next_id == 1, "no id is spent on a request that is not sent"


def test_a_request_over_the_servers_frame_limit_is_refused_before_it_is_sent() -> None:
    conn = Recorded()
    conn.frame_bytes_max = 20
    with pytest.raises(decree.UsageError, match="exceeds the server's frame limit"):
        conn._request_frame(p.OutcomeQuery(conn.next_xid().global_xid()), transport=object())


@pytest.mark.parametrize(("version", "told"), [(1, False), (2, False), (3, True)])
def test_a_one_phase_commit_is_announced_from_version_3_on(version: int, told: bool) -> None:
    conn = Recorded(version)
    assert conn._tells_one_phase is told
    xid = conn.next_xid()
    assert frames(conn._one_phase_frame(xid, object())) == [p.OnePhase(xid.global_xid())]


def test_completions_are_buffered_and_written_in_front_of_the_next_frame() -> None:
    conn = Recorded()
    done, ping = conn.next_xid(), p.encode_frame(99, p.Ping())
    assert conn._buffer_complete(done, None) is False
    data = conn._with_completes(ping)
    assert frames(data) == [p.Complete(done.global_xid()), p.Ping()]
    assert conn._completes == [] and conn._with_completes() == b""


def test_a_heuristic_completion_is_complete_heuristic_from_version_2_and_plain_before() -> None:
    xid = Recorded().next_xid()
    for version, expected in (
        (1, p.Complete(xid.global_xid())),
        (2, p.CompleteHeuristic(xid.global_xid(), p.Heuristic.MIXED)),
    ):
        conn = Recorded(version)
        conn._buffer_complete(xid, p.Heuristic.MIXED)
        assert frames(conn._with_completes(), version) == [expected]


def test_the_buffer_is_full_at_its_limit_and_a_broken_session_buffers_nothing() -> None:
    conn = Recorded()
    full = [conn._buffer_complete(conn.next_xid(), None) for _ in range(s.COMPLETES_BUFFERED_MAX)]
    assert full == [False] * (s.COMPLETES_BUFFERED_MAX - 1) + [True]
    broken = Recorded()
    broken.close_now("gone")
    assert broken._buffer_complete(broken.next_xid(), None) is False and broken._completes == []


def test_only_a_session_the_server_closed_gets_its_completions_before_the_close() -> None:
    conn = Recorded()
    assert not conn._flushes_before_close(s.CLOSED_BY_SERVER), "nothing buffered"
    conn._buffer_complete(conn.next_xid(), None)
    assert conn._flushes_before_close(s.CLOSED_BY_SERVER)
    assert not conn._flushes_before_close(s.UNSOLICITED)
    assert not conn._flushes_before_close("connection check failed: reset")


# --- replies ------------------------------------------------------------------------------


def frame(rid: int, message: p.Message, trailer: tuple[p.Field, ...] = ()) -> p.Frame:
    return p.Frame(rid, message, 0, trailer)


def test_the_reply_to_the_request_is_returned() -> None:
    assert Recorded()._answer(frame(4, p.Pong()), 4) == p.Pong()


def test_an_error_for_a_buffered_completion_is_logged_and_the_session_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    conn = Recorded()
    with caplog.at_level(logging.WARNING, logger="decree"):
        assert conn._answer(frame(2, p.Error(p.ErrorCode.UNKNOWN_RM, "x")), 4) is None
    assert "refused a completion (request 2)" in caplog.text and conn.closed == []


def test_an_error_that_closes_the_session_or_answers_the_connection_raises_and_closes() -> None:
    conn = Recorded()
    with pytest.raises(decree.ServerError):
        conn._answer(frame(2, p.Error(p.ErrorCode.BUSY, "busy")), 4)
    assert conn.closed == ["the server closed the session"]
    conn = Recorded()
    with pytest.raises(decree.ServerError):
        conn._answer(frame(0, p.Error(p.ErrorCode.NOT_PRIMARY, "backup")), 4)
    assert conn.closed == [f"error {p.ErrorCode.NOT_PRIMARY}: backup"]


def test_another_message_for_another_request_is_a_violation() -> None:
    conn = Recorded()
    with pytest.raises(decree.ProtocolError, match="a Pong for request 3, not 4"):
        conn._answer(frame(3, p.Pong()), 4)
    assert conn.broken


def test_what_the_answers_to_decide_outcome_and_ping_mean() -> None:
    conn = Recorded()
    conn._decided(p.DecideOk())
    with pytest.raises(decree.ServerError) as refused:
        conn._decided(p.Error(p.ErrorCode.UNKNOWN_RM, "x"))
    assert refused.value.code == p.ErrorCode.UNKNOWN_RM and conn.closed == [], "a refusal keeps the session"
    assert conn._outcome_of(p.OutcomeIs(p.Outcome.COMMITTED)) == p.Outcome.COMMITTED
    assert conn._outcome_of(p.Error(p.ErrorCode.OUTCOME_UNKNOWN)) == p.Outcome.UNKNOWN, "version 1's error 15"
    assert conn._outcome_of(p.Error(p.ErrorCode.OUTCOME_HEURISTIC)) == p.Outcome.HEURISTIC, "version 1's error 16"
    with pytest.raises(decree.ServerError):
        conn._outcome_of(p.Error(p.ErrorCode.MALFORMED))
    conn._ponged(p.Pong())
    with pytest.raises(decree.ProtocolError, match="expected Pong, got DecideOk"):
        conn._ponged(p.DecideOk())


def test_a_frame_with_an_unknown_must_understand_field_is_a_violation() -> None:
    conn = Recorded()
    optional = frame(1, p.Pong(), (p.Field(0x0123, b"x"),))
    assert conn._understood(optional) is optional
    with pytest.raises(decree.ProtocolError, match="must-understand field 0x8123"):
        conn._understood(frame(1, p.Pong(), (p.Field(0x8123, b"x"),)))


def test_a_bad_header_before_the_greeting_names_a_peer_that_is_not_decree() -> None:
    conn = Recorded()
    conn.session = 0
    error = conn._frame_error(p.FrameError("TooLarge", "frame of 1213486164 bytes"), b"HTTP/1.1 400")
    assert "did not answer as a decree server (an HTTP server?)" in str(error)
    assert conn.closed == ["not a decree server"]
    agreed = Recorded()
    assert "TooLarge" in str(agreed._frame_error(p.FrameError("TooLarge", "big"), b"")), "after HelloOk: a violation"


@pytest.mark.parametrize(
    ("head", "guess"),
    [
        (b"HTTP/1.1 400", "an HTTP server?"),
        (bytes([0x15, 3, 3, 0, 2]), "a TLS server? only a tls: endpoint speaks TLS"),
        (bytes([0x4A, 0, 0, 0, 10]) + b"5.5", "a MySQL or MariaDB server?"),
        (b"E\x00\x00\x00\x10", "a PostgreSQL server?"),
        (b"hello", ""),
    ],
)
def test_a_peer_is_guessed_from_its_first_bytes(head: bytes, guess: str) -> None:
    assert s.peer_guess(head) == (f" ({guess})" if guess else "")


def test_the_first_bytes_are_kept_up_to_their_limit() -> None:
    kept = s.first_bytes(b"", b"x" * 10)
    assert s.first_bytes(kept, b"y" * 100) == b"x" * 10 + b"y" * (s.FIRST_BYTES_SHOWN - 10)
    assert s.first_bytes(b"z" * s.FIRST_BYTES_SHOWN, b"more") == b"z" * s.FIRST_BYTES_SHOWN


# --- the look at an idle session ----------------------------------------------------------


def test_a_session_is_gone_when_its_stream_ended_or_bytes_came_unasked() -> None:
    assert s.gone_because(None, False) is None
    assert s.gone_because(s.CLOSED_BY_SERVER, False) == s.CLOSED_BY_SERVER
    assert s.gone_because("connection lost: reset", True) == "connection lost: reset", "the end says more"
    assert s.gone_because(None, True) == s.UNSOLICITED


def test_a_session_is_pinged_once_it_sent_nothing_for_the_interval() -> None:
    assert not s.due_for_ping(now=10.0, last_sent=9.5, idle_for=1.0)
    assert s.due_for_ping(now=10.0, last_sent=9.0, idle_for=1.0)

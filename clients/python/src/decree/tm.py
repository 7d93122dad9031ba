"""The coordinator: transactions over the application's database connections.

::

    tm = decree.connect("unix:/run/decree/decree.sock")
    with tm.transaction() as tx:
        tx.enlist(pg_a, "pg-a")        # psycopg 3 connection, autocommit off
        tx.enlist(maria, "orders")     # PyMySQL connection, autocommit on
        ... SQL on both ...
    # committed here; an exception inside the block rolls both back and propagates

The protocol is docs/protocol.md's "What a client does": one branch commits in one phase
(on a version-3 session only once ``OnePhase`` is written, and ``Complete`` follows); two
or more are prepared, the decision is sent (``Decide``, after a check that the session is
still there: a decision that could not be written rolls back), every branch is committed
and the server is told (``Complete``). A lost
answer to ``Decide`` is resolved with ``Outcome`` on a new connection, never guessed. A
branch that phase two cannot commit is left to the server, which commits it once this
client's session is closed (the client closes it at once), and reported in
:attr:`CommitReport.phase_two_pending`.

Each transaction holds one server session (connection) from a pool for its duration, so
threads may share one :class:`TransactionManager`; a broken session is dropped and the
next transaction connects again.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Concatenate, ParamSpec, TypeVar

from . import protocol as p
from .branches import BranchAdapter, BranchEnded, BranchFailed, BranchInDoubt, PhaseTwo, Step, adapter_for
from .connection import Endpoint, NotSent, Options, ServerConnection, TlsConfig
from .errors import (
    BranchEndedByApplication,
    DecreeError,
    HeuristicError,
    HeuristicReport,
    OutcomeUnknown,
    ProtocolError,
    RolledBack,
    ServerError,
    Unavailable,
    UsageError,
)

log = logging.getLogger("decree")

T = TypeVar("T")
P = ParamSpec("P")

_REFUSED_BEFORE_WRITING = frozenset(
    {
        p.ErrorCode.WRONG_SESSION,
        p.ErrorCode.UNKNOWN_RM,
        p.ErrorCode.BRANCH_QUALIFIER,
        p.ErrorCode.DUPLICATE_BRANCH,
        p.ErrorCode.NO_BRANCHES,
    }
)


@dataclass(frozen=True)
class CommitReport:
    """How a commit went. ``kind`` is ``"empty"``, ``"one_phase"`` or ``"two_phase"``."""

    xid: p.Xid
    kind: str
    phase_two_pending: tuple[str, ...] = ()
    """Branches (RM names) phase two could not commit: the transaction IS committed, and the
    server commits them (their locks are held until then)."""
    heuristics: tuple[HeuristicReport, ...] = ()
    """Branches that committed on their own (agreeing with the decision)."""
    resolved_by_outcome: bool = False
    """The answer to ``Decide`` was lost and ``Outcome`` said committed."""


def connect(
    endpoint: str,
    *,
    tls: TlsConfig | None = None,
    node_expected: int = 0,
    client_name: str | None = None,
    connect_timeout: float = 5.0,
    reply_timeout: float | None = 30.0,
    outcome_timeout: float = 30.0,
) -> TransactionManager:
    """A transaction manager on the state server at ``endpoint`` (``unix:/path``,
    ``tcp:host:port`` or ``tls:host:port``; a comma-separated list names the two members
    of a pair, and whichever serves is used). Opens one session at once, so that a wrong
    address or a refused certificate fails here."""
    options = Options(node_expected=node_expected, connect_timeout=connect_timeout, reply_timeout=reply_timeout, tls=tls)
    if client_name is not None:
        options = dataclasses.replace(options, client_name=client_name)
    endpoints = [Endpoint.parse(e.strip()) for e in endpoint.split(",")]
    tm = TransactionManager(endpoints, options, outcome_timeout=outcome_timeout)
    tm._release(tm._acquire())
    return tm


_MANAGERS: weakref.WeakSet[TransactionManager] = weakref.WeakSet()
"""The live managers, for the child of ``os.fork()``; weakly, so that none is kept alive."""


def _after_fork_in_child() -> None:
    for tm in list(_MANAGERS):
        tm._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class TransactionManager:
    """Opens transactions; keeps a pool of server sessions, one per running transaction.

    A manager created before ``os.fork()`` (a pre-fork web server imports the application
    first) serves the child too: the child drops the sessions it inherited without writing
    to them, and opens one of its own on first use, so that parent and child never mint
    the same Xid. A transaction begun before the fork belongs to the parent."""

    def __init__(
        self, endpoint: Endpoint | list[Endpoint], options: Options, *, outcome_timeout: float = 30.0
    ) -> None:
        self.endpoints = endpoint if isinstance(endpoint, list) else [endpoint]
        if not self.endpoints:
            raise UsageError("no endpoint to connect to")
        self._preferred = 0
        self.options = options
        self.outcome_timeout = outcome_timeout
        self._pool: list[ServerConnection] = []
        self._sessions: weakref.WeakSet[ServerConnection] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._closed = False
        self._stop = threading.Event()
        self._keepalive: threading.Thread | None = None
        self._generation = 0
        """How many forks this process is away from the manager's creation."""
        _MANAGERS.add(self)

    # --- sessions ---------------------------------------------------------------------------

    @property
    def endpoint(self) -> Endpoint:
        """The endpoint that served last (of a pair's two, the primary)."""
        return self.endpoints[self._preferred % len(self.endpoints)]

    def _open(self) -> ServerConnection:
        conn = self._open_any()
        with self._lock:
            self._sessions.add(conn)
            if conn.idle_timeout_ms and self._keepalive is None:
                self._keepalive = threading.Thread(
                    target=self._keep_alive, args=(conn.idle_timeout_ms / 1000.0,), name="decree-keepalive", daemon=True
                )
                self._keepalive.start()
        return conn

    def _open_any(self) -> ServerConnection:
        """A session on the first endpoint that serves, starting with the one that served
        last: a pair's backup answers NotPrimary (error 19), an unreachable member fails to
        connect, and the next endpoint is tried."""
        failures = []
        for i in range(len(self.endpoints)):
            index = (self._preferred + i) % len(self.endpoints)
            try:
                conn = ServerConnection.open(self.endpoints[index], self.options)
            except ServerError as e:
                if e.code != p.ErrorCode.NOT_PRIMARY or len(self.endpoints) == 1:
                    raise
                failures.append(str(e))
                continue
            except Unavailable as e:
                if len(self.endpoints) == 1:
                    raise
                failures.append(str(e))
                continue
            self._preferred = index
            return conn
        raise Unavailable("no member of the pair serves: " + "; ".join(failures))

    def _acquire(self) -> ServerConnection:
        if self._closed:
            raise UsageError("this TransactionManager is closed")
        while True:
            with self._lock:
                conn = self._pool.pop() if self._pool else None
            if conn is None:
                return self._open()
            if conn.alive():
                return conn
            conn.close()

    def _release(self, conn: ServerConnection) -> None:
        if conn.broken or self._closed:
            conn.close()
            return
        with self._lock:
            self._pool.append(conn)

    def _keep_alive(self, idle: float) -> None:
        # Every sixth of the server's idle bound, ping each session nobody is using that has
        # sent nothing for a third of it (docs/protocol.md, "Timeouts").
        while not self._stop.wait(idle / 6):
            for conn in list(self._sessions):
                conn.ping_if_idle(idle / 3)

    def _after_fork(self) -> None:
        """In the child of ``os.fork()``: the inherited sessions are the parent's, so they
        are dropped unwritten (their buffered completions too), locks another thread held
        are made anew, and the keep-alive thread, which the child does not have, starts
        again with the child's first session. Transactions begun before stop working."""
        self._generation += 1
        self._lock = threading.Lock()
        self._stop = threading.Event()
        if self._closed:
            self._stop.set()
        self._keepalive = None
        inherited = list(self._sessions) + self._pool
        self._sessions = weakref.WeakSet()
        self._pool = []
        for conn in inherited:
            conn.drop_after_fork()

    def close(self) -> None:
        """Closes the pooled sessions (buffered completions are sent first)."""
        self._closed = True
        self._stop.set()
        with self._lock:
            pool, self._pool = self._pool, []
        for conn in pool:
            conn.close()

    def __enter__(self) -> TransactionManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- transactions -----------------------------------------------------------------------

    def transaction(self) -> Transaction:
        """Begins a transaction (nothing is sent yet); use it as a context manager."""
        return Transaction(self, self._acquire())

    def transactional(self, fn: Callable[Concatenate[Transaction, P], T]) -> Callable[P, T]:
        """Decorator: runs ``fn(tx, *args, **kwargs)`` in a transaction, committed when it
        returns and rolled back when it raises. The decorated function takes ``fn``'s
        parameters after ``tx``, with their types."""

        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> T:
            with self.transaction() as tx:
                return fn(tx, *args, **kwargs)

        return run

    def outcome(self, xid: p.Xid) -> p.Outcome:
        """Asks the server what became of ``xid`` (docs/protocol.md, session rule 6)."""
        conn = self._acquire()
        try:
            return conn.outcome(xid)
        finally:
            self._release(conn)

    def ping(self) -> None:
        conn = self._acquire()
        try:
            conn.ping()
        finally:
            self._release(conn)

    def _resolve(self, xid: p.Xid, cause: BaseException, release: Callable[[], bool] | None = None) -> p.Outcome:
        """The answer to a Decide whose reply was lost: Outcome on new connections, asked
        again while the server says in progress or cannot be reached, up to the deadline.
        On a first "unknown", ``release`` lets go of branches the server cannot reach (it
        returns whether there were any), and the question is asked again until the
        deadline, since the server may then finish them and remember the outcome."""
        deadline = time.monotonic() + self.outcome_timeout
        delay = 0.05
        last: BaseException = cause
        released = False
        while True:
            conn: ServerConnection | None = None
            try:
                conn = self._open()
                answer = conn.outcome(xid)
                log.info("%s: the answer to Decide was lost (%s); Outcome says %s", xid, cause, answer.name)
                if answer == p.Outcome.UNKNOWN and not released and release is not None and release():
                    released = True
                    log.info("%s: released the branches the server could not reach; asking again", xid)
                elif answer == p.Outcome.UNKNOWN and released and time.monotonic() + delay <= deadline:
                    pass  # the server may still finish the released branches.
                elif answer != p.Outcome.IN_PROGRESS:
                    return answer
            except (Unavailable, ProtocolError, ServerError) as e:
                log.info("%s: Outcome not answered yet: %s", xid, e)
                last = e
            finally:
                if conn is not None:
                    self._release(conn)
            if time.monotonic() + delay > deadline:
                raise OutcomeUnknown(
                    f"{xid}: the answer to Decide was lost ({cause}) and the server gave no final answer "
                    f"within {self.outcome_timeout} s (last: {last})",
                    xid=xid,
                    cause=cause,
                )
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


@dataclass
class _Enlisted:
    adapter: BranchAdapter
    number: int
    prepared: bool = False
    in_doubt: bool = False


class Transaction:
    """One global transaction. Enlist connections, run SQL on them, then commit (or leave
    the ``with`` block); an exception in the block rolls back and propagates."""

    def __init__(self, tm: TransactionManager, session: ServerConnection) -> None:
        self.tm = tm
        self._session: ServerConnection | None = session
        self.xid = session.next_xid()
        self._branches: list[_Enlisted] = []
        self.state = "active"
        self.report: CommitReport | None = None
        self.rollback_errors: list[BaseException] = []
        self._close_session = False
        self._generation = tm._generation
        log.debug("%s: begun", self.xid)

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self.state != "active":
            return
        if exc is None:
            self.commit()
        else:
            self.rollback()

    # --- enlisting --------------------------------------------------------------------------

    def enlist(self, connection: Any, rm: str) -> int:
        """Makes ``connection``'s work a branch of this transaction; ``rm`` is the name of the
        server's ``[[rm]]`` entry for its database. Enlist before the connection's first
        statement. Returns the branch number (the same when enlisted again)."""
        self._check_active("enlist")
        for b in self._branches:
            if b.adapter.connection is connection or b.adapter is connection:
                return b.number
        if len(self._branches) >= p.BRANCHES_MAX:
            raise UsageError(f"a transaction has at most {p.BRANCHES_MAX} branches")
        adapter = adapter_for(connection, rm)
        number = len(self._branches)
        adapter.start(self.xid.branch(number))
        self._branches.append(_Enlisted(adapter, number))
        log.debug("%s: branch %d on %s", self.xid, number, adapter.rm)
        return number

    def _check_active(self, call: str) -> None:
        if self._generation != self.tm._generation:
            raise UsageError(
                f"{call}: transaction {self.xid} was begun before os.fork(), in the parent process; the "
                "child cannot use it (its server session and database connections are the parent's): "
                "begin a new transaction in the child"
            )
        if self.state != "active":
            raise UsageError(f"{call}: the transaction is {self.state.replace('_', ' ')}")

    # --- ending -----------------------------------------------------------------------------

    def rollback(self) -> None:
        """Rolls every branch back; nothing is sent to the server (presumed abort)."""
        self._check_active("rollback")
        try:
            self._roll_back_all()
            self.state = "rolled_back"
        finally:
            self._end()

    def commit(self) -> CommitReport:
        """Commits; returns how, or raises RolledBack, OutcomeUnknown or HeuristicError."""
        self._check_active("commit")
        self.state = "committing"
        try:
            if not self._branches:
                self.report = CommitReport(self.xid, "empty")
            elif len(self._branches) == 1:
                self.report = self._one_phase(self._branches[0])
            else:
                self.report = self._two_phase()
            self.state = "committed"
            return self.report
        except RolledBack:
            self.state = "rolled_back"
            raise
        except OutcomeUnknown:
            self.state = "unknown"
            raise
        except HeuristicError:
            self.state = "heuristic"
            raise
        except BaseException:
            self.state = "failed"
            raise
        finally:
            self._end()

    def _end(self) -> None:
        session, self._session = self._session, None
        if session is None:
            return
        if self._close_session:
            session.close()
        else:
            self.tm._release(session)

    def _one_phase(self, b: _Enlisted) -> CommitReport:
        session = self._session
        assert session is not None
        told = self._tell_one_phase(session, b)
        try:
            b.adapter.commit_one_phase()
        except BranchEnded as e:
            self._close_session = self._close_session or told  # a told server then answers unknown.
            raise self._ended_by_application(b, e) from e
        except BranchFailed as e:
            raise RolledBack(
                f"{self.xid}: the one-phase commit on {b.adapter.rm} failed: {e}",
                xid=self.xid, rm=b.adapter.rm, branch=b.number, cause=e,
            ) from e
        except BranchInDoubt as e:
            raise self._one_phase_unknown(session, told, b, e) from e
        if told:
            session.complete(self.xid)  # the server now remembers it committed (rule 8).
        log.debug("%s: committed in one phase on %s", self.xid, b.adapter.rm)
        return CommitReport(self.xid, "one_phase")

    def _tell_one_phase(self, session: ServerConnection, b: _Enlisted) -> bool:
        """OnePhase on a version-3 session (rule 8): the branch may commit only once the
        whole frame is written. Whether the server was told (older sessions are not)."""
        try:
            return session.one_phase(self.xid)
        except NotSent as e:
            self._close_session = True
            errors = self._roll_back_all()
            raise RolledBack(
                f"{self.xid}: the OnePhase notice could not be written ({e}); the branch on {b.adapter.rm} "
                "is rolled back",
                xid=self.xid, rm=b.adapter.rm, branch=b.number, cause=e, rollback_errors=errors,
            ) from e

    def _one_phase_unknown(
        self, session: ServerConnection, told: bool, b: _Enlisted, cause: BranchInDoubt
    ) -> OutcomeUnknown:
        """The one-phase commit lost its answer: only the database knows. A told server
        answers unknown for the Xid once this session is closed (in progress before)."""
        if told:
            self._close_session = True
            why = "one-phase: only the database knows"
        else:
            why = (
                "one-phase: only the database knows (the server speaks protocol version "
                f"{session.version} and was not told of this transaction)"
            )
        return OutcomeUnknown(
            f"{self.xid}: {why}; the commit on {b.adapter.rm} lost its answer: {cause}", xid=self.xid, cause=cause
        )

    def _two_phase(self) -> CommitReport:
        session = self._session
        assert session is not None
        for b in self._branches:
            try:
                b.adapter.prepare()
                b.prepared = True
            except BranchEnded as e:
                raise self._ended_by_application(b, e) from e
            except (BranchFailed, BranchInDoubt, Exception) as e:
                b.in_doubt = not isinstance(e, BranchFailed)
                errors = self._roll_back_all()
                raise RolledBack(
                    f"{self.xid}: branch {b.number} on {b.adapter.rm} did not prepare, every branch is "
                    f"rolled back: {e}",
                    xid=self.xid, rm=b.adapter.rm, branch=b.number, cause=e, rollback_errors=errors,
                ) from e
        decision = tuple(p.Branch(b.number, b.adapter.rm) for b in self._branches)
        try:
            session.decide(self.xid, decision)
        except NotSent as e:
            # Never sent again elsewhere: the session is closed, so nothing decides it.
            self._close_session = True
            errors = self._roll_back_all()
            raise RolledBack(
                f"{self.xid}: the decision was not sent ({e}); every branch is rolled back",
                xid=self.xid, cause=e, rollback_errors=errors,
            ) from e
        except ServerError as e:
            if e.code == p.ErrorCode.LOG_FAILED:
                self._close_session = True
                self._abandon_prepared()
                raise OutcomeUnknown(
                    f"{self.xid}: the server's log failed while writing the decision; it may or may not "
                    f"be durable, and no branch is touched until the server restarts: {e.server_message}",
                    xid=self.xid, cause=e,
                ) from e
            if e.code in _REFUSED_BEFORE_WRITING:
                errors = self._roll_back_all()
                raise RolledBack(
                    f"{self.xid}: the server refused the decision, every branch is rolled back: {e}",
                    xid=self.xid, cause=e, rollback_errors=errors,
                ) from e
            return self._after_lost_reply(e)
        except (Unavailable, ProtocolError) as e:
            return self._after_lost_reply(e)
        log.debug("%s: decided", self.xid)
        return self._phase_two(send_complete=True)

    def _ended_by_application(self, b: _Enlisted, e: BranchEnded) -> BranchEndedByApplication:
        """Rolls the other branches back and says that ``b`` ended outside decree."""
        errors = self._roll_back_all()
        return BranchEndedByApplication(
            f"{self.xid}: branch {b.number} on {b.adapter.rm} was committed or rolled back by the "
            f"application itself, which way is unknown, and every other branch is rolled back: the "
            f"transaction is not safe to retry; check {b.adapter.rm} first ({e})",
            xid=self.xid, rm=b.adapter.rm, branch=b.number, cause=e, rollback_errors=errors,
        )

    def _after_lost_reply(self, cause: DecreeError) -> CommitReport:
        session = self._session
        assert session is not None
        # The old session must end for the server to answer; it is never used again.
        session.close_now(f"the answer to Decide was lost: {cause}")

        def release_attached() -> bool:
            # A MariaDB branch stays attached to the connection that prepared it, where the
            # server can neither commit nor roll it back; "unknown" may be only that.
            held = [b for b in self._branches if b.adapter.holds_prepared]
            for b in held:
                b.adapter.abandon()
            return bool(held)

        answer = self.tm._resolve(self.xid, cause, release_attached)
        if answer == p.Outcome.COMMITTED:
            report = self._phase_two(send_complete=False)
            return CommitReport(
                self.xid, "two_phase", report.phase_two_pending, report.heuristics, resolved_by_outcome=True
            )
        if answer == p.Outcome.ROLLED_BACK:
            errors = self._roll_back_all(quiet=True)
            raise RolledBack(
                f"{self.xid}: the answer to Decide was lost ({cause}); the server says the transaction is "
                "rolled back",
                xid=self.xid, cause=cause, rollback_errors=errors,
            ) from cause
        self._abandon_prepared()
        if answer == p.Outcome.HEURISTIC:
            raise HeuristicError(
                f"{self.xid}: the answer to Decide was lost ({cause}); the server says a branch decided "
                "on its own: check the branches",
                xid=self.xid,
            ) from cause
        raise OutcomeUnknown(
            f"{self.xid}: the answer to Decide was lost ({cause}) and the server cannot prove the outcome; "
            "its branches are left to the server (or to `decree recover`)",
            xid=self.xid, cause=cause,
        ) from cause

    def _phase_two(self, *, send_complete: bool) -> CommitReport:
        pending: list[str] = []
        heuristics: list[HeuristicReport] = []
        for b in self._branches:
            try:
                result = b.adapter.commit_prepared()
            except Exception as e:  # an adapter bug must not hide that the decision is durable.
                result = PhaseTwo(Step.PENDING, f"{b.adapter.rm}: {e!r}")
            if result.step == Step.PENDING:
                log.warning("%s: phase two of branch %d on %s not done, left to the server: %s",
                            self.xid, b.number, b.adapter.rm, result.detail)
                pending.append(b.adapter.rm)
                b.adapter.abandon()
            elif result.step == Step.HEURISTIC:
                assert result.heuristic is not None
                log.error("%s: heuristic outcome on %s: %s", self.xid, b.adapter.rm, result.detail)
                heuristics.append(HeuristicReport(b.adapter.rm, b.number, result.heuristic, result.detail))
        combined: p.Heuristic | None = None
        for h in heuristics:
            combined = h.outcome.combine(combined)
        session = self._session
        if pending:
            # The server finishes phase two once this session is closed (rule 7).
            self._close_session = True
        elif send_complete and session is not None:
            session.complete(self.xid, combined)
        if combined is not None and combined != p.Heuristic.COMMITTED:
            raise HeuristicError(
                f"{self.xid}: committed, but branches decided on their own: "
                + "; ".join(f"{h.rm} {h.outcome.name.lower()}: {h.detail}" for h in heuristics),
                xid=self.xid, reports=heuristics,
            )
        return CommitReport(self.xid, "two_phase", tuple(pending), tuple(heuristics))

    def _abandon_prepared(self) -> None:
        """Leaves the prepared branches to the server, touching none (outcome unknown)."""
        for b in self._branches:
            b.adapter.abandon()

    def _roll_back_all(self, quiet: bool = False) -> list[BaseException]:
        """Rolls back every branch; a rollback that cannot be confirmed closes the session, so
        that the server's presumed abort rolls the branch back."""
        errors: list[BaseException] = []
        for b in self._branches:
            try:
                b.adapter.rollback()
            except Exception as e:
                errors.append(e)
                self._close_session = True
                (log.debug if quiet else log.warning)(
                    "%s: rollback of branch %d on %s not confirmed (%s); the server rolls it back once "
                    "this session is closed", self.xid, b.number, b.adapter.rm, e,
                )
        self.rollback_errors.extend(errors)
        return errors

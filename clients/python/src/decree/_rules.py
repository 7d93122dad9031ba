"""The coordinator's rules, written once for the blocking API (:mod:`decree.tm`) and the
asyncio API (:mod:`decree.aio`), with no IO in them.

A transaction's commit and rollback, the resolution of a lost answer to ``Decide`` and the
choice of a pair's member are generators here (an engine, as in openraft): each yields a
:class:`Call`, "prepare this branch", "send Decide on the session", "ask Outcome on a new
session", "sleep", and is sent the call's result back, or has its exception thrown back in.
A runtime carries the calls out, blocking (:func:`decree.tm._run`) or awaited
(:func:`decree.aio._run`), and decides nothing: what an answer to ``Decide`` or ``Outcome``
means, which refusals came before the decision was written, what each phase-two step does,
the one-phase notice, the messages and the :class:`CommitReport` are decided here only.
tests/test_rules.py drives the engines with scripted answers and a virtual clock and
compares the calls they made.

Not for: sockets, database connections, threads, event loops, pools; the engine holds the
objects it names in its calls (adapters, the session, the manager, a clock) and never calls
them itself, except to read ``rm``, ``holds_prepared`` and the session's ``version``.

Invariants (asserted where they are cheap): phase two starts only once every branch is
prepared and ``Decide`` was answered or ``Outcome`` said committed; a lone branch commits in
one phase only once the ``OnePhase`` notice was written (or the session is older than
version 3); after a ``Decide`` the server may have made durable, nothing is rolled back
unless ``Outcome`` said rolled back; a branch that phase two left undone is given up and its
session closed, so that the server finishes it.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from . import _tracing
from . import protocol as p
from ._engine import Call as Call
from ._engine import Driven as Driven
from ._engine import Steps as Steps
from ._session import SessionState
from .branches import BranchEnded, BranchFailed, BranchInDoubt, PhaseTwo, Step
from .connection import Endpoint, Options, TlsConfig
from .errors import BranchEndedByApplication, DecreeError, HeuristicError, HeuristicReport, NotSent, OutcomeUnknown
from .errors import ProtocolError, RolledBack, ServerError, Unavailable, UsageError

log = logging.getLogger("decree")

T = TypeVar("T")
S = TypeVar("S", bound=SessionState)

REFUSED_BEFORE_WRITING = frozenset(
    {
        p.ErrorCode.WRONG_SESSION,
        p.ErrorCode.UNKNOWN_RM,
        p.ErrorCode.BRANCH_QUALIFIER,
        p.ErrorCode.DUPLICATE_BRANCH,
        p.ErrorCode.NO_BRANCHES,
    }
)
"""Refusals of a Decide that the server makes before it writes anything: no decision
exists, so every branch is rolled back. Any other Error leaves the decision unknown."""

OUTCOME_DELAY_FIRST = 0.05
OUTCOME_DELAY_MAX = 1.0
"""Seconds between two ``Outcome`` questions: doubled after each, up to the maximum."""


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


# --- a transaction ------------------------------------------------------------------------


@dataclass
class Enlisted:
    """A branch of the transaction: its adapter (blocking or asyncio; the engine reads its
    ``rm`` and ``holds_prepared`` only), its number and its RM name."""

    adapter: Any
    number: int
    rm: str
    prepared: bool = False

    def call(self, method: str) -> Call:
        return Call(self.adapter, method)


def state_after(e: BaseException) -> str:
    """The state of a transaction whose commit raised ``e``."""
    for kind, state in ((RolledBack, "rolled_back"), (OutcomeUnknown, "unknown"), (HeuristicError, "heuristic")):
        if isinstance(e, kind):
            return state
    return "failed"


def combined(heuristics: list[HeuristicReport]) -> p.Heuristic | None:
    """The heuristic outcome of the whole transaction (``None``: no branch decided on its own)."""
    outcome: p.Heuristic | None = None
    for h in heuristics:
        outcome = h.outcome.combine(outcome)
    return outcome


class TransactionRules:
    """One global transaction's state and the engines of its commit and rollback. The API's
    transaction class adds the IO: it sets ``_session`` (the server session the engine names
    in its calls), ``_clock`` (``monotonic()`` and ``sleep()``) and ``tm`` (the manager, whose
    ``_ask_outcome(xid)`` asks on a new session and whose ``outcome_timeout`` bounds that),
    and runs :meth:`_commit_steps` and :meth:`_rollback_steps`."""

    xid: p.Xid | None
    tm: Any
    _session: Any
    _clock: Any

    def __init__(self) -> None:
        self._branches: list[Enlisted] = []
        self.state = "new"
        self.report: CommitReport | None = None
        self.rollback_errors: list[BaseException] = []
        self._close_session = False
        """Whether the session ends with the transaction: the server then finishes (or rolls
        back, by presumed abort) what the client could not."""

    @property
    def _xid(self) -> p.Xid:
        assert self.xid is not None
        return self.xid

    # --- enlisting and states ---------------------------------------------------------------

    def _state_error(self, call: str) -> UsageError:
        return UsageError(f"{call}: the transaction is {self.state.replace('_', ' ')}")

    def _check_active(self, call: str) -> None:
        if self.state != "active":
            raise self._state_error(call)

    def _enlisted(self, connection: Any) -> int | None:
        """The number of the branch ``connection`` (or its adapter) already is, or ``None``
        when there is room for it as a new one."""
        for b in self._branches:
            if b.adapter.connection is connection or b.adapter is connection:
                return b.number
        if len(self._branches) >= p.BRANCHES_MAX:
            raise UsageError(f"a transaction has at most {p.BRANCHES_MAX} branches")
        return None

    def _next_branch_xid(self) -> p.Xid:
        """The branch Xid the next enlisted connection starts with."""
        return self._xid.branch(len(self._branches))

    def _add(self, adapter: Any) -> int:
        """Records ``adapter``, started with :meth:`_next_branch_xid`, as the next branch."""
        number = len(self._branches)
        self._branches.append(Enlisted(adapter, number, adapter.rm))
        log.debug("%s: branch %d on %s", self.xid, number, adapter.rm)
        return number

    def _branch_span(self, operation: str, b: Enlisted) -> Any:
        """The span of branch ``b``'s ``operation`` (database semantic conventions)."""
        return _tracing.span(
            f"{operation} {b.rm}", self._xid, db__system__name=_tracing.db_system(b.adapter),
            db__operation__name=operation, decree__rm=b.rm, decree__branch=b.number,
        )

    def _on_session(self, method: str, *args: Any) -> Call:
        return Call(self._session, method, args)

    # --- ending -----------------------------------------------------------------------------

    def _rollback_steps(self) -> Steps[None]:
        """Rolls every branch back; nothing is sent to the server (presumed abort)."""
        with _tracing.span("decree.transaction", self._xid, decree__outcome="rolled_back"):
            yield from self._roll_back_all()
        self.state = "rolled_back"

    def _commit_steps(self) -> Steps[CommitReport]:
        """Commits: no branch, one (one phase) or more (two phases); sets ``state`` and
        ``report``, or the state that the exception raised means."""
        with _tracing.span("decree.transaction", self._xid) as span:
            try:
                if not self._branches:
                    report = CommitReport(self._xid, "empty")
                elif len(self._branches) == 1:
                    report = yield from self._one_phase(self._branches[0])
                else:
                    report = yield from self._two_phase()
            except BaseException as e:
                self.state = state_after(e)
                if span is not None:
                    span.set_attribute("decree.outcome", self.state)
                raise
            if span is not None:
                span.set_attribute("decree.outcome", "committed")
        self.report = report
        self.state = "committed"
        return report

    def _one_phase(self, b: Enlisted) -> Steps[CommitReport]:
        assert self._branches == [b], "one phase is for a lone branch"
        told = yield from self._tell_one_phase(b)
        try:
            with self._branch_span("commit", b):
                yield b.call("commit_one_phase")
        except BranchEnded as e:
            self._close_session = self._close_session or told  # a told server then answers unknown.
            raise (yield from self._ended_by_application(b, e)) from e
        except BranchFailed as e:
            raise RolledBack(
                f"{self.xid}: the one-phase commit on {b.rm} failed: {e}",
                xid=self.xid, rm=b.rm, branch=b.number, cause=e,
            ) from e
        except BranchInDoubt as e:
            raise self._one_phase_unknown(told, b, e) from e
        if told:
            yield self._on_session("complete", self._xid)  # the server now remembers it committed (rule 8).
        log.debug("%s: committed in one phase on %s", self.xid, b.rm)
        return CommitReport(self._xid, "one_phase")

    def _tell_one_phase(self, b: Enlisted) -> Steps[bool]:
        """OnePhase on a version-3 session (rule 8): the branch may commit only once the
        whole frame is written. Whether the server was told (older sessions are not)."""
        try:
            told: bool = yield self._on_session("one_phase", self._xid)
        except NotSent as e:
            self._close_session = True
            errors = yield from self._roll_back_all()
            raise RolledBack(
                f"{self.xid}: the OnePhase notice could not be written ({e}); the branch on {b.rm} "
                "is rolled back",
                xid=self.xid, rm=b.rm, branch=b.number, cause=e, rollback_errors=errors,
            ) from e
        return told

    def _one_phase_unknown(self, told: bool, b: Enlisted, cause: BranchInDoubt) -> OutcomeUnknown:
        """The one-phase commit lost its answer: only the database knows. A told server
        answers unknown for the Xid once this session is closed (in progress before)."""
        why = "one-phase: only the database knows"
        if told:
            self._close_session = True
        else:
            why += f" (the server speaks protocol version {self._session.version} and was not told of this transaction)"
        return OutcomeUnknown(
            f"{self.xid}: {why}; the commit on {b.rm} lost its answer: {cause}", xid=self.xid, cause=cause
        )

    def _two_phase(self) -> Steps[CommitReport]:
        yield from self._prepare_all()
        decision = tuple(p.Branch(b.number, b.rm) for b in self._branches)
        try:
            with _tracing.span("decree.decide", self._xid):
                yield self._on_session("decide", self._xid, decision)
        except NotSent as e:
            return (yield from self._not_sent(e))
        except ServerError as e:
            return (yield from self._refused(e))
        except (Unavailable, ProtocolError) as e:
            return (yield from self._after_lost_reply(e))
        log.debug("%s: decided", self.xid)
        return (yield from self._phase_two(send_complete=True))

    def _prepare_all(self) -> Steps[None]:
        for b in self._branches:
            try:
                with self._branch_span("prepare", b):
                    yield b.call("prepare")
                b.prepared = True
            except BranchEnded as e:
                raise (yield from self._ended_by_application(b, e)) from e
            except Exception as e:
                errors = yield from self._roll_back_all()
                raise RolledBack(
                    f"{self.xid}: branch {b.number} on {b.rm} did not prepare, every branch is "
                    f"rolled back: {e}",
                    xid=self.xid, rm=b.rm, branch=b.number, cause=e, rollback_errors=errors,
                ) from e

    def _ended_by_application(self, b: Enlisted, e: BranchEnded) -> Steps[BranchEndedByApplication]:
        """Rolls the other branches back and says that ``b`` ended outside decree."""
        errors = yield from self._roll_back_all()
        return BranchEndedByApplication(
            f"{self.xid}: branch {b.number} on {b.rm} was committed or rolled back by the "
            f"application itself, which way is unknown, and every other branch is rolled back: the "
            f"transaction is not safe to retry; check {b.rm} first ({e})",
            xid=self.xid, rm=b.rm, branch=b.number, cause=e, rollback_errors=errors,
        )

    def _not_sent(self, e: NotSent) -> Steps[CommitReport]:
        """The Decide was never written whole: not a decision (docs/protocol.md step 5). It
        is never sent again elsewhere: the session is closed, so nothing decides it."""
        self._close_session = True
        errors = yield from self._roll_back_all()
        raise RolledBack(
            f"{self.xid}: the decision was not sent ({e}); every branch is rolled back",
            xid=self.xid, cause=e, rollback_errors=errors,
        ) from e

    def _refused(self, e: ServerError) -> Steps[CommitReport]:
        """An Error answered the Decide: a log that failed (unknown, the branches stay), a
        refusal before writing (rolled back), or anything else (as a lost answer)."""
        if e.code == p.ErrorCode.LOG_FAILED:
            self._close_session = True
            yield from self._abandon_prepared()
            raise OutcomeUnknown(
                f"{self.xid}: the server's log failed while writing the decision; it may or may not "
                f"be durable, and no branch is touched until the server restarts: {e.server_message}",
                xid=self.xid, cause=e,
            ) from e
        if e.code in REFUSED_BEFORE_WRITING:
            errors = yield from self._roll_back_all()
            raise RolledBack(
                f"{self.xid}: the server refused the decision, every branch is rolled back: {e}",
                xid=self.xid, cause=e, rollback_errors=errors,
            ) from e
        return (yield from self._after_lost_reply(e))

    def _after_lost_reply(self, cause: DecreeError) -> Steps[CommitReport]:
        """The Decide may have been written and its answer is lost: ``Outcome`` says."""
        # The old session must end for the server to answer; it is never used again.
        yield self._on_session("close_now", f"the answer to Decide was lost: {cause}")
        answer = yield from self._resolve(cause)
        if answer == p.Outcome.COMMITTED:
            report = yield from self._phase_two(send_complete=False)
            return dataclasses.replace(report, resolved_by_outcome=True)
        if answer == p.Outcome.ROLLED_BACK:
            errors = yield from self._roll_back_all(quiet=True)
            raise RolledBack(
                f"{self.xid}: the answer to Decide was lost ({cause}); the server says the transaction is "
                "rolled back",
                xid=self.xid, cause=cause, rollback_errors=errors,
            ) from cause
        yield from self._abandon_prepared()
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

    def _resolve(self, cause: BaseException) -> Steps[p.Outcome]:
        """The answer to a Decide whose reply was lost: Outcome on new sessions, asked again
        while the server says in progress or cannot be reached, up to the manager's
        ``outcome_timeout``. On a first "unknown", the branches the server cannot reach are
        released (:meth:`_release_attached`), and the question is asked again until the
        deadline, since the server may then finish them and remember the outcome."""
        xid, timeout, clock = self._xid, self.tm.outcome_timeout, self._clock
        deadline = (yield Call(clock, "monotonic")) + timeout
        delay, last, released = OUTCOME_DELAY_FIRST, cause, False
        while True:
            try:
                answer: p.Outcome = yield Call(self.tm, "_ask_outcome", (xid,))
                log.info("%s: the answer to Decide was lost (%s); Outcome says %s", xid, cause, answer.name)
                if answer == p.Outcome.UNKNOWN and not released and (yield from self._release_attached()):
                    released = True
                    log.info("%s: released the branches the server could not reach; asking again", xid)
                elif answer == p.Outcome.UNKNOWN and released and (yield Call(clock, "monotonic")) + delay <= deadline:
                    pass  # the server may still finish the released branches.
                elif answer != p.Outcome.IN_PROGRESS:
                    return answer
            except (Unavailable, ProtocolError, ServerError) as e:
                log.info("%s: Outcome not answered yet: %s", xid, e)
                last = e
            if (yield Call(clock, "monotonic")) + delay > deadline:
                raise OutcomeUnknown(
                    f"{xid}: the answer to Decide was lost ({cause}) and the server gave no final answer "
                    f"within {timeout} s (last: {last})",
                    xid=xid, cause=cause,
                )
            yield Call(clock, "sleep", (delay,))
            delay = min(delay * 2, OUTCOME_DELAY_MAX)

    def _release_attached(self) -> Steps[bool]:
        """Lets go of the branches whose connection holds them prepared (MariaDB's stay
        attached to it, where the server can neither commit nor roll them back: "unknown"
        may be only that). Whether there were any."""
        held = [b for b in self._branches if b.adapter.holds_prepared]
        for b in held:
            yield b.call("abandon")
        return bool(held)

    def _phase_two(self, *, send_complete: bool) -> Steps[CommitReport]:
        """Commits every prepared branch. A branch not done is left to the server, which
        finishes it once this session is closed (rule 7); a heuristic one is reported."""
        assert all(b.prepared for b in self._branches), "phase two of a branch that is not prepared"
        pending: list[str] = []
        heuristics: list[HeuristicReport] = []
        for b in self._branches:
            try:
                with self._branch_span("commit", b):
                    result: PhaseTwo = yield b.call("commit_prepared")
            except Exception as e:  # an adapter bug must not hide that the decision is durable.
                result = PhaseTwo(Step.PENDING, f"{b.rm}: {e!r}")
            if result.step == Step.PENDING:
                log.warning("%s: phase two of branch %d on %s not done, left to the server: %s",
                            self.xid, b.number, b.rm, result.detail)
                pending.append(b.rm)
                yield b.call("abandon")
            elif result.step == Step.HEURISTIC:
                assert result.heuristic is not None
                log.error("%s: heuristic outcome on %s: %s", self.xid, b.rm, result.detail)
                heuristics.append(HeuristicReport(b.rm, b.number, result.heuristic, result.detail))
        outcome = combined(heuristics)
        if pending:
            self._close_session = True
        elif send_complete:
            with _tracing.span("decree.complete", self._xid):
                yield self._on_session("complete", self._xid, outcome)
        if outcome is not None and outcome != p.Heuristic.COMMITTED:
            raise HeuristicError(
                f"{self.xid}: committed, but branches decided on their own: "
                + "; ".join(f"{h.rm} {h.outcome.name.lower()}: {h.detail}" for h in heuristics),
                xid=self.xid, reports=heuristics,
            )
        return CommitReport(self._xid, "two_phase", tuple(pending), tuple(heuristics))

    def _abandon_prepared(self) -> Steps[None]:
        """Leaves the prepared branches to the server, touching none (outcome unknown)."""
        for b in self._branches:
            yield b.call("abandon")

    def _roll_back_all(self, quiet: bool = False) -> Steps[list[BaseException]]:
        """Rolls back every branch; a rollback that cannot be confirmed closes the session, so
        that the server's presumed abort rolls the branch back."""
        errors: list[BaseException] = []
        for b in self._branches:
            try:
                with self._branch_span("rollback", b):
                    yield b.call("rollback")
            except Exception as e:
                errors.append(e)
                self._close_session = True
                (log.debug if quiet else log.warning)(
                    "%s: rollback of branch %d on %s not confirmed (%s); the server rolls it back once "
                    "this session is closed", self.xid, b.number, b.rm, e,
                )
        self.rollback_errors.extend(errors)
        return errors


# --- a manager ----------------------------------------------------------------------------


def settings(
    endpoint: str,
    tls: TlsConfig | None,
    node_expected: int,
    client_name: str | None,
    connect_timeout: float,
    reply_timeout: float | None,
) -> tuple[list[Endpoint], Options]:
    """The endpoints and options of ``decree.connect`` and ``decree.aconnect``'s arguments
    (a comma-separated ``endpoint`` names a pair's two members)."""
    options = Options(
        node_expected=node_expected, connect_timeout=connect_timeout, reply_timeout=reply_timeout, tls=tls
    )
    if client_name is not None:
        options = dataclasses.replace(options, client_name=client_name)
    return [Endpoint.parse(e.strip()) for e in endpoint.split(",")], options


class ManagerRules(Generic[S]):
    """What a transaction manager decides about its endpoints and sessions, for both APIs:
    which member of a pair to open a session on, and which sessions go back to the pool.
    The API's manager sets ``_connection`` (the class whose ``open(endpoint, options)`` opens
    a session), runs :meth:`_open_any_steps` and keeps the pool."""

    _connection: Any

    def __init__(self, endpoint: Endpoint | list[Endpoint], options: Options, outcome_timeout: float) -> None:
        self.endpoints = endpoint if isinstance(endpoint, list) else [endpoint]
        if not self.endpoints:
            raise UsageError("no endpoint to connect to")
        self._preferred = 0
        self.options = options
        self.outcome_timeout = outcome_timeout
        self._pool: list[S] = []
        """Sessions no transaction holds; the last released is taken first."""
        self._sessions: weakref.WeakSet[S] = weakref.WeakSet()
        """Every session this manager opened and nobody has dropped, for the keep-alive."""
        self._closed = False

    def _pools(self, conn: S) -> bool:
        """Whether a session a transaction let go of goes back to the pool: not when it is
        broken (the next transaction connects again) or the manager is closed."""
        return not (conn.broken or self._closed)

    @property
    def endpoint(self) -> Endpoint:
        """The endpoint that served last (of a pair's two, the primary)."""
        return self.endpoints[self._preferred % len(self.endpoints)]

    def _open_any_steps(self) -> Steps[Any]:
        """A session on the first endpoint that serves, starting with the one that served
        last: a pair's backup answers NotPrimary (error 19), an unreachable member fails to
        connect, and the next endpoint is tried; with one endpoint, its failure is raised."""
        failures = []
        for i in range(len(self.endpoints)):
            index = (self._preferred + i) % len(self.endpoints)
            try:
                conn = yield Call(self._connection, "open", (self.endpoints[index], self.options))
            except (ServerError, Unavailable) as e:
                next_member = isinstance(e, Unavailable) or e.code == p.ErrorCode.NOT_PRIMARY
                if not next_member or len(self.endpoints) == 1:
                    raise
                failures.append(str(e))
                continue
            self._preferred = index
            return conn
        raise Unavailable("no member of the pair serves: " + "; ".join(failures))

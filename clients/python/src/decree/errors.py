"""The exceptions of the decree client: what became of a transaction, and why.

::

    DecreeError
     ├── RolledBack          the transaction is rolled back; nothing of it is committed
     ├── OutcomeUnknown      it may be committed or not; never retry it blindly
     ├── HeuristicError      a branch decided on its own; an operator must look
     ├── BranchEndedByApplication  the application ended a branch itself; not safe to retry
     ├── ProtocolError       the server's bytes broke the protocol (a bug, or not decree)
     ├── ServerError         the server answered an Error frame (``code``, ``message``)
     ├── Unavailable         the server cannot be reached (nothing was decided)
     │    └── NotSent        a request was not written whole: the server never got it
     └── UsageError          the API was used wrongly (nothing was sent)

The first four are the answers a transaction can end with; each carries the global
``xid`` (``None`` when the transaction never got that far). Nothing is swallowed: a failure
of a rollback that follows a failure is attached as ``rollback_errors``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .protocol import Heuristic, Xid


class DecreeError(Exception):
    """The base of every exception this package raises."""


class _BranchNamed(DecreeError):
    """The fields :class:`RolledBack` and :class:`BranchEndedByApplication` share: the branch
    that caused the ending (``rm``, ``branch``; ``None`` when the cause was not a branch), the
    underlying exception (``cause``) and the rollbacks of the other branches that could not
    be confirmed (``rollback_errors``). Never raised itself, and neither of the two is a kind
    of the other, so that ``except RolledBack: retry`` lets BranchEndedByApplication through."""

    def __init__(
        self,
        message: str,
        *,
        xid: Xid | None = None,
        rm: str | None = None,
        branch: int | None = None,
        cause: BaseException | None = None,
        rollback_errors: list[BaseException] | None = None,
    ) -> None:
        super().__init__(message)
        self.xid = xid
        self.rm = rm
        self.branch = branch
        self.cause = cause
        self.rollback_errors = rollback_errors or []


class RolledBack(_BranchNamed):
    """The transaction is rolled back: no branch of it is committed.

    ``rm`` and ``branch`` name the branch whose failure caused it (``None`` when the cause
    was not a branch, e.g. the server refused the decision or answered "rolled back" to
    ``Outcome``); ``cause`` is the underlying exception, also chained as ``__cause__``.
    Retrying the work as a new transaction is safe.
    """


class OutcomeUnknown(DecreeError):
    """The transaction may have committed or not, and the client could not find out.

    Its branches are left as they are: the server settles them by its rules (or an
    operator with ``decree recover``). Ask again later with ``TransactionManager.outcome``;
    never apply the work again without knowing.
    """

    def __init__(self, message: str, *, xid: Xid | None = None, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.xid = xid
        self.cause = cause


@dataclass(frozen=True)
class HeuristicReport:
    """A branch that decided on its own."""

    rm: str
    branch: int
    outcome: Heuristic
    detail: str


class HeuristicError(DecreeError):
    """At least one branch decided on its own against the decision (or the server says so).

    ``reports`` lists the branches this client saw (empty when the server's ``Outcome``
    answer is all that is known).
    """

    def __init__(self, message: str, *, xid: Xid | None = None, reports: list[HeuristicReport] | None = None) -> None:
        super().__init__(message)
        self.xid = xid
        self.reports = reports or []


class BranchEndedByApplication(_BranchNamed):
    """The application committed or rolled back a branch itself (on its connection, inside
    the transaction), and the library cannot know which way it ended.

    ``rm`` and ``branch`` name that branch; every other branch is rolled back (those whose
    rollback could not be confirmed are in ``rollback_errors``). The branch's work may be
    committed, so the transaction is **not safe to retry**: check that database first. It
    is deliberately neither a :class:`RolledBack` (whose retry is safe) nor an
    :class:`OutcomeUnknown` (asking the server cannot help: it never decided the
    transaction and would answer "rolled back"), so ``except RolledBack: retry`` code lets
    it through. The cause is a bug in the application: a branch's connection must not see
    ``COMMIT``, ``ROLLBACK`` or ``XA`` statements while it is enlisted.
    """


class ProtocolError(DecreeError):
    """The server sent something the protocol does not allow (or is not a decree server)."""


class ServerError(DecreeError):
    """The server answered with an Error frame: ``code`` (see ``decree.ErrorCode``) and ``message``."""

    def __init__(self, code: int, message: str) -> None:
        from .protocol import ErrorCode

        try:
            name = ErrorCode(code).name
        except ValueError:
            name = f"code {code}"
        super().__init__(f"server error {code} ({name}): {message}")
        self.code = code
        self.server_message = message


class Unavailable(DecreeError):
    """The server cannot be reached, or the connection broke before anything was decided."""


class NotSent(Unavailable):
    """The request was not written whole (its last byte was not taken, or the session was
    already gone): the server never received it. The connection is closed."""


class UsageError(DecreeError):
    """The API was used in a way that cannot work; nothing was sent."""

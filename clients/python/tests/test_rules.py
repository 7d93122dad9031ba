"""The coordinator's rules (decree._rules), which the blocking and the asyncio APIs share,
checked without a server, a database or an event loop: a transaction of named branches is
built, its commit or rollback engine is run against scripted answers and a virtual clock,
and the calls it made, what it returned or raised and the state it left are compared (as
openraft's engine tests compare the commands a handler emitted)."""

from __future__ import annotations

from typing import Any

import pytest

import decree
from decree import _rules as r
from decree import protocol as p
from decree.branches import DONE, BranchEnded, BranchFailed, BranchInDoubt, PhaseTwo, Step
from decree.errors import NotSent

XID = p.Xid.decree(7, 1, 5, 1)
LOST = decree.Unavailable("no reply within 30 s")


class Clock:
    """Virtual time: ``sleep`` moves it on."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class Adapter:
    """A branch the engine names in its calls; the script answers them."""

    def __init__(self, rm: str, holds_prepared: bool = False) -> None:
        self.rm = rm
        self.connection = object()
        self.holds_prepared = holds_prepared


class Session:
    def __init__(self, version: int) -> None:
        self.version = version


class Manager:
    def __init__(self, outcome_timeout: float) -> None:
        self.outcome_timeout = outcome_timeout


class Scripted(r.TransactionRules):
    """A transaction whose calls are answered from ``script``: per ``"who.method"`` (who is
    an RM name, ``session`` or ``manager``), the answers in order, an exception being raised;
    a call the script does not name answers ``None`` (``commit_prepared``: done; the clock's
    calls run on the virtual clock). ``calls`` lists what was called, in order."""

    def __init__(self, *branches: str | Adapter, version: int = 3, outcome_timeout: float = 2.0,
                 script: dict[str, list[Any]] | None = None) -> None:
        super().__init__()
        self.xid = XID
        self.state = "active"
        self._session = Session(version)
        self.tm = Manager(outcome_timeout)
        self._clock = Clock()
        self.script = {key: list(answers) for key, answers in (script or {}).items()}
        self.calls: list[str] = []
        self.args: dict[str, tuple[Any, ...]] = {}
        for b in branches:
            self._add(b if isinstance(b, Adapter) else Adapter(b))

    def _who(self, call: r.Call) -> str:
        if call.target is self._session:
            return "session"
        if call.target is self.tm:
            return "manager"
        if call.target is self._clock:
            return "clock"
        return str(call.target.rm)

    def run(self, steps: r.Steps[Any]) -> Any:
        driven = r.Driven(steps)
        while driven.call is not None:
            call = driven.call
            key = f"{self._who(call)}.{call.method}"
            if not key.startswith("clock."):
                self.calls.append(key)
                self.args[key] = call.args
            answers = self.script.get(key)
            if answers:
                answer = answers.pop(0)
            elif key.startswith("clock."):
                answer = call.invoke()
            else:
                answer = DONE if call.method == "commit_prepared" else None
            if isinstance(answer, BaseException):
                driven.fail(answer)
            else:
                driven.answer(answer)
        return driven.value

    def commit(self) -> r.CommitReport:
        report: r.CommitReport = self.run(self._commit_steps())
        return report


def two_phase_calls(*rms: str) -> list[str]:
    return [f"{rm}.prepare" for rm in rms] + ["session.decide"]


# --- no branch, one branch ----------------------------------------------------------------


def test_a_transaction_without_branches_commits_without_a_call() -> None:
    tx = Scripted()
    assert tx.commit() == r.CommitReport(XID, "empty") and tx.calls == [] and tx.state == "committed"


def test_one_branch_is_announced_committed_and_completed_on_a_version_3_session() -> None:
    tx = Scripted("pg-a", script={"session.one_phase": [True]})
    report = tx.commit()
    assert tx.calls == ["session.one_phase", "pg-a.commit_one_phase", "session.complete"]
    assert report == r.CommitReport(XID, "one_phase") and tx.report == report and tx.state == "committed"
    assert tx.args["session.complete"] == (XID,) and not tx._close_session


def test_one_branch_on_an_older_session_is_neither_announced_nor_completed() -> None:
    tx = Scripted("pg-a", version=2, script={"session.one_phase": [False]})
    assert tx.commit().kind == "one_phase"
    assert tx.calls == ["session.one_phase", "pg-a.commit_one_phase"]


def test_a_one_phase_notice_not_written_rolls_the_branch_back_and_closes_the_session() -> None:
    tx = Scripted("pg-a", script={"session.one_phase": [NotSent("broke while sending")]})
    with pytest.raises(decree.RolledBack, match="the OnePhase notice could not be written") as raised:
        tx.commit()
    assert tx.calls == ["session.one_phase", "pg-a.rollback"], "never committed"
    assert (raised.value.rm, raised.value.branch) == ("pg-a", 0)
    assert tx.state == "rolled_back" and tx._close_session


def test_a_failed_one_phase_commit_is_rolled_back() -> None:
    tx = Scripted("pg-a", script={"session.one_phase": [True], "pg-a.commit_one_phase": [BranchFailed("no")]})
    with pytest.raises(decree.RolledBack, match="the one-phase commit on pg-a failed: no") as raised:
        tx.commit()
    assert isinstance(raised.value.cause, BranchFailed) and tx.state == "rolled_back"
    assert not tx._close_session, "nothing for the server to finish"


@pytest.mark.parametrize("told", [True, False])
def test_a_lost_one_phase_answer_is_unknown_and_a_told_server_learns_it_by_the_close(told: bool) -> None:
    tx = Scripted(
        "pg-a", version=3 if told else 2,
        script={"session.one_phase": [told], "pg-a.commit_one_phase": [BranchInDoubt("lost")]},
    )
    with pytest.raises(decree.OutcomeUnknown) as raised:
        tx.commit()
    message = str(raised.value)
    if told:
        assert "one-phase: only the database knows; the commit on pg-a lost its answer: lost" in message
    else:
        assert "(the server speaks protocol version 2 and was not told of this transaction)" in message
    assert tx._close_session is told and tx.state == "unknown" and raised.value.xid == XID


@pytest.mark.parametrize("told", [True, False])
def test_the_only_branch_ended_by_the_application_is_not_safe_to_retry(told: bool) -> None:
    tx = Scripted("pg-a", script={"session.one_phase": [told], "pg-a.commit_one_phase": [BranchEnded("gone")]})
    with pytest.raises(decree.BranchEndedByApplication, match="not safe to retry; check pg-a first"):
        tx.commit()
    assert tx.calls == ["session.one_phase", "pg-a.commit_one_phase", "pg-a.rollback"]
    assert tx.state == "failed" and tx._close_session is told, "a told server must answer unknown"


# --- two phases ---------------------------------------------------------------------------


def test_two_branches_are_prepared_decided_committed_and_completed() -> None:
    tx = Scripted("pg-a", "maria")
    report = tx.commit()
    assert tx.calls == two_phase_calls("pg-a", "maria") + [
        "pg-a.commit_prepared", "maria.commit_prepared", "session.complete"
    ]
    assert tx.args["session.decide"] == (XID, (p.Branch(0, "pg-a"), p.Branch(1, "maria")))
    assert tx.args["session.complete"] == (XID, None)
    assert report == r.CommitReport(XID, "two_phase") and tx.state == "committed" and not tx._close_session


def test_a_branch_that_does_not_prepare_rolls_every_branch_back_before_any_decision() -> None:
    failed = BranchFailed("aborted")
    tx = Scripted("pg-a", "pg-b", "maria", script={"pg-b.prepare": [failed], "pg-a.rollback": [OSError("reset")]})
    with pytest.raises(decree.RolledBack, match="branch 1 on pg-b did not prepare") as raised:
        tx.commit()
    assert tx.calls == ["pg-a.prepare", "pg-b.prepare", "pg-a.rollback", "pg-b.rollback", "maria.rollback"]
    assert (raised.value.rm, raised.value.branch, raised.value.cause) == ("pg-b", 1, failed)
    assert [str(e) for e in raised.value.rollback_errors] == ["reset"]
    assert tx.rollback_errors == raised.value.rollback_errors
    assert tx._close_session, "an unconfirmed rollback is left to the server's presumed abort"


def test_an_adapter_bug_in_prepare_rolls_back_like_a_failure() -> None:
    tx = Scripted("pg-a", "pg-b", script={"pg-a.prepare": [KeyError("bug")]})
    with pytest.raises(decree.RolledBack, match="did not prepare"):
        tx.commit()
    assert "session.decide" not in tx.calls


def test_a_branch_ended_by_the_application_at_prepare_rolls_the_others_back() -> None:
    tx = Scripted("pg-a", "pg-b", script={"pg-b.prepare": [BranchEnded("no transaction open")]})
    with pytest.raises(decree.BranchEndedByApplication) as raised:
        tx.commit()
    assert (raised.value.rm, raised.value.branch) == ("pg-b", 1) and tx.state == "failed"
    assert tx.calls == ["pg-a.prepare", "pg-b.prepare", "pg-a.rollback", "pg-b.rollback"]


def test_a_decision_not_sent_rolls_back_and_closes_the_session() -> None:
    tx = Scripted("pg-a", "pg-b", script={"session.decide": [NotSent("session 5 is gone (closed by the server)")]})
    with pytest.raises(decree.RolledBack, match=r"the decision was not sent \(session 5 is gone"):
        tx.commit()
    assert tx.calls == two_phase_calls("pg-a", "pg-b") + ["pg-a.rollback", "pg-b.rollback"]
    assert tx._close_session and tx.state == "rolled_back"


@pytest.mark.parametrize("code", sorted(r.REFUSED_BEFORE_WRITING))
def test_a_decision_refused_before_writing_rolls_back_on_a_session_that_goes_on(code: p.ErrorCode) -> None:
    refusal = decree.ServerError(code, "refused")
    tx = Scripted("pg-a", "pg-b", script={"session.decide": [refusal]})
    with pytest.raises(decree.RolledBack, match="the server refused the decision") as raised:
        tx.commit()
    assert raised.value.cause is refusal and raised.value.rm is None
    assert tx.calls == two_phase_calls("pg-a", "pg-b") + ["pg-a.rollback", "pg-b.rollback"]
    assert not tx._close_session


def test_a_log_that_failed_under_the_decision_leaves_every_branch_to_the_server() -> None:
    tx = Scripted("pg-a", "maria", script={"session.decide": [decree.ServerError(p.ErrorCode.LOG_FAILED, "EIO")]})
    with pytest.raises(decree.OutcomeUnknown, match="the server's log failed while writing the decision.*: EIO"):
        tx.commit()
    assert tx.calls == two_phase_calls("pg-a", "maria") + ["pg-a.abandon", "maria.abandon"], "nothing rolled back"
    assert tx._close_session and tx.state == "unknown"


@pytest.mark.parametrize(
    "lost", [LOST, decree.ProtocolError("garbage"), decree.ServerError(p.ErrorCode.BUSY, "busy")]
)
def test_a_lost_answer_to_decide_is_asked_on_a_new_session_and_committed_when_outcome_says_so(
    lost: Exception,
) -> None:
    tx = Scripted("pg-a", "pg-b", script={"session.decide": [lost], "manager._ask_outcome": [p.Outcome.COMMITTED]})
    report = tx.commit()
    assert tx.calls == two_phase_calls("pg-a", "pg-b") + [
        "session.close_now", "manager._ask_outcome", "pg-a.commit_prepared", "pg-b.commit_prepared"
    ], "no Complete on the closed session"
    assert tx.args["session.close_now"] == (f"the answer to Decide was lost: {lost}",)
    assert tx.args["manager._ask_outcome"] == (XID,)
    assert report.resolved_by_outcome and report.kind == "two_phase" and tx.state == "committed"


def test_a_lost_answer_that_outcome_says_rolled_back_rolls_back() -> None:
    tx = Scripted("pg-a", "pg-b", script={"session.decide": [LOST], "manager._ask_outcome": [p.Outcome.ROLLED_BACK]})
    with pytest.raises(decree.RolledBack, match="the server says the transaction is rolled back"):
        tx.commit()
    assert tx.calls[-2:] == ["pg-a.rollback", "pg-b.rollback"] and tx.state == "rolled_back"


def test_a_lost_answer_that_outcome_says_heuristic_is_a_heuristic_error_touching_no_branch() -> None:
    tx = Scripted("pg-a", "pg-b", script={"session.decide": [LOST], "manager._ask_outcome": [p.Outcome.HEURISTIC]})
    with pytest.raises(decree.HeuristicError, match="the server says a branch decided on its own"):
        tx.commit()
    assert tx.calls[-2:] == ["pg-a.abandon", "pg-b.abandon"] and tx.state == "heuristic"


def test_outcome_in_progress_or_unreachable_is_asked_again_after_growing_pauses() -> None:
    answers: list[Any] = [p.Outcome.IN_PROGRESS, LOST, p.Outcome.IN_PROGRESS, p.Outcome.COMMITTED]
    tx = Scripted("pg-a", "pg-b", script={"session.decide": [LOST], "manager._ask_outcome": answers})
    assert tx.commit().resolved_by_outcome
    assert tx.calls.count("manager._ask_outcome") == 4
    assert tx._clock.slept == [0.05, 0.1, 0.2]


def test_an_outcome_that_never_comes_is_unknown_at_the_deadline() -> None:
    tx = Scripted("pg-a", "pg-b", outcome_timeout=2.0,
                  script={"session.decide": [LOST], "manager._ask_outcome": [LOST] * 100})
    with pytest.raises(decree.OutcomeUnknown, match="gave no final answer within 2.0 s"):
        tx.commit()
    assert tx._clock.slept == [0.05, 0.1, 0.2, 0.4, 0.8], "the next pause would pass the deadline"
    assert tx.calls[-1] == "manager._ask_outcome", "no branch touched"


def test_unknown_without_attached_branches_is_final_at_once() -> None:
    tx = Scripted("pg-a", "pg-b", script={"session.decide": [LOST], "manager._ask_outcome": [p.Outcome.UNKNOWN]})
    with pytest.raises(decree.OutcomeUnknown, match="the server cannot prove the outcome"):
        tx.commit()
    assert tx.calls[-3:] == ["manager._ask_outcome", "pg-a.abandon", "pg-b.abandon"] and tx._clock.slept == []


def test_unknown_releases_branches_attached_to_their_connection_and_asks_again() -> None:
    maria = Adapter("maria", holds_prepared=True)
    outcomes = [p.Outcome.UNKNOWN, p.Outcome.UNKNOWN, p.Outcome.COMMITTED]
    tx = Scripted("pg-a", maria, script={"session.decide": [LOST], "manager._ask_outcome": outcomes})
    assert tx.commit().resolved_by_outcome
    assert tx.calls[len(two_phase_calls("pg-a", "maria")):] == [
        "session.close_now", "manager._ask_outcome", "maria.abandon", "manager._ask_outcome",
        "manager._ask_outcome", "pg-a.commit_prepared", "maria.commit_prepared",
    ]
    assert tx._clock.slept == [0.05, 0.1]


def test_unknown_after_the_release_is_final_at_the_deadline() -> None:
    maria = Adapter("maria", holds_prepared=True)
    tx = Scripted("pg-a", maria, outcome_timeout=0.5,
                  script={"session.decide": [LOST], "manager._ask_outcome": [p.Outcome.UNKNOWN] * 100})
    with pytest.raises(decree.OutcomeUnknown, match="cannot prove the outcome"):
        tx.commit()
    assert tx.calls.count("maria.abandon") == 2, "released once, then given up with the rest"
    assert sum(tx._clock.slept) <= 0.5


# --- phase two ----------------------------------------------------------------------------


def test_a_branch_phase_two_could_not_commit_is_left_to_the_server_by_closing_the_session() -> None:
    pending = PhaseTwo(Step.PENDING, "pg-b: COMMIT PREPARED failed: reset")
    tx = Scripted("pg-a", "pg-b", "maria",
                  script={"pg-b.commit_prepared": [pending], "maria.commit_prepared": [RuntimeError("bug")]})
    report = tx.commit()
    assert report.phase_two_pending == ("pg-b", "maria") and tx.state == "committed"
    assert tx.calls[-5:] == [
        "pg-a.commit_prepared", "pg-b.commit_prepared", "pg-b.abandon", "maria.commit_prepared", "maria.abandon"
    ], "no Complete: the server finishes phase two once the session is closed"
    assert tx._close_session


def test_branches_that_committed_on_their_own_are_reported_and_completed_as_such() -> None:
    on_its_own = PhaseTwo(Step.HEURISTIC, "pg-b: committed already", p.Heuristic.COMMITTED)
    tx = Scripted("pg-a", "pg-b", script={"pg-b.commit_prepared": [on_its_own]})
    report = tx.commit()
    assert report.heuristics == (decree.HeuristicReport("pg-b", 1, p.Heuristic.COMMITTED, "pg-b: committed already"),)
    assert tx.args["session.complete"] == (XID, p.Heuristic.COMMITTED)


def test_a_branch_that_rolled_back_on_its_own_is_a_heuristic_error_after_the_complete() -> None:
    rolled = PhaseTwo(Step.HEURISTIC, "maria: rolled back on its own", p.Heuristic.ROLLED_BACK)
    committed = PhaseTwo(Step.HEURISTIC, "pg-a: committed", p.Heuristic.COMMITTED)
    tx = Scripted("pg-a", "maria", script={"pg-a.commit_prepared": [committed], "maria.commit_prepared": [rolled]})
    with pytest.raises(decree.HeuristicError, match="committed, but branches decided on their own: pg-a committed"):
        tx.commit()
    assert tx.args["session.complete"] == (XID, p.Heuristic.MIXED) and tx.state == "heuristic"
    assert tx.report is None


def test_heuristics_combine() -> None:
    def report(outcome: p.Heuristic) -> decree.HeuristicReport:
        return decree.HeuristicReport("rm", 0, outcome, "")

    assert r.combined([]) is None
    assert r.combined([report(p.Heuristic.ROLLED_BACK)] * 2) == p.Heuristic.ROLLED_BACK
    assert r.combined([report(p.Heuristic.COMMITTED), report(p.Heuristic.ROLLED_BACK)]) == p.Heuristic.MIXED


# --- rollback, states, enlisting ----------------------------------------------------------


def test_a_rollback_touches_every_branch_and_sends_the_server_nothing() -> None:
    tx = Scripted("pg-a", "pg-b", script={"pg-b.rollback": [OSError("reset")]})
    tx.run(tx._rollback_steps())
    assert tx.calls == ["pg-a.rollback", "pg-b.rollback"] and tx.state == "rolled_back"
    assert [str(e) for e in tx.rollback_errors] == ["reset"] and tx._close_session


def test_an_interrupt_inside_the_commit_leaves_the_state_failed_and_propagates() -> None:
    tx = Scripted("pg-a", "pg-b", script={"pg-a.prepare": [KeyboardInterrupt()]})
    with pytest.raises(KeyboardInterrupt):
        tx.commit()
    assert tx.state == "failed" and tx.calls == ["pg-a.prepare"], "nothing rolled back by the engine"


@pytest.mark.parametrize(
    ("error", "state"),
    [
        (decree.RolledBack("x"), "rolled_back"),
        (decree.OutcomeUnknown("x"), "unknown"),
        (decree.HeuristicError("x"), "heuristic"),
        (decree.BranchEndedByApplication("x"), "failed"),
        (KeyboardInterrupt(), "failed"),
    ],
)
def test_the_state_an_exception_leaves(error: BaseException, state: str) -> None:
    assert r.state_after(error) == state


def test_a_connection_enlisted_again_keeps_its_number_and_the_branches_are_bounded() -> None:
    tx = Scripted("pg-a", "pg-b")
    first = tx._branches[0].adapter
    assert tx._enlisted(first.connection) == 0 and tx._enlisted(first) == 0
    assert tx._enlisted(object()) is None
    assert tx._next_branch_xid() == XID.branch(2)
    for i in range(p.BRANCHES_MAX - 2):
        tx._add(Adapter(f"rm-{i}"))
    with pytest.raises(decree.UsageError, match=f"at most {p.BRANCHES_MAX} branches"):
        tx._enlisted(object())


def test_a_transaction_that_is_not_active_refuses_with_its_state_in_words() -> None:
    tx = Scripted()
    tx.state = "rolled_back"
    with pytest.raises(decree.UsageError, match="commit: the transaction is rolled back"):
        tx._check_active("commit")


# --- the manager --------------------------------------------------------------------------


class Members(r.ManagerRules[Any]):
    """A manager whose ``open`` calls are answered by each endpoint's script."""

    def __init__(self, answers: dict[str, list[Any]], preferred: int = 0) -> None:
        endpoints = [decree.Endpoint.parse(e) for e in answers]
        super().__init__(endpoints, decree.Options(), 30.0)
        self._connection = self
        self._preferred = preferred
        self.answers = answers
        self.tried: list[str] = []

    def run(self) -> Any:
        driven = r.Driven(self._open_any_steps())
        while driven.call is not None:
            endpoint = str(driven.call.args[0])
            self.tried.append(endpoint)
            answer = self.answers[endpoint].pop(0)
            if isinstance(answer, BaseException):
                driven.fail(answer)
            else:
                driven.answer(answer)
        return driven.value


NOT_PRIMARY = decree.ServerError(p.ErrorCode.NOT_PRIMARY, "backup")


def test_a_pairs_backup_and_an_unreachable_member_pass_the_session_to_the_other() -> None:
    pair = Members({"unix:/a": [NOT_PRIMARY, "session on a"], "unix:/b": ["session on b", LOST]})
    assert pair.run() == "session on b" and pair.tried == ["unix:/a", "unix:/b"]
    assert str(pair.endpoint) == "unix:/b"
    assert pair.run() == "session on a" and pair.tried[2:] == ["unix:/b", "unix:/a"], "the last to serve goes first"
    assert str(pair.endpoint) == "unix:/a"


def test_no_member_serving_is_unavailable_with_both_reasons() -> None:
    pair = Members({"unix:/a": [NOT_PRIMARY], "unix:/b": [LOST]})
    with pytest.raises(decree.Unavailable, match="no member of the pair serves: server error 19 .*; no reply"):
        pair.run()


@pytest.mark.parametrize("error", [decree.ServerError(p.ErrorCode.NOT_ALLOWED, "no"), decree.ProtocolError("x")])
def test_a_refusal_other_than_not_primary_is_raised_at_once(error: Exception) -> None:
    pair = Members({"unix:/a": [error], "unix:/b": ["session on b"]})
    with pytest.raises(type(error)):
        pair.run()
    assert pair.tried == ["unix:/a"]


def test_a_single_endpoints_failure_is_raised_as_it_is() -> None:
    with pytest.raises(decree.ServerError) as raised:
        Members({"unix:/a": [NOT_PRIMARY]}).run()
    assert raised.value is NOT_PRIMARY


def test_settings_read_a_pair_and_keep_the_default_client_name_unless_given() -> None:
    endpoints, options = r.settings("unix:/a, tcp:h:1", None, 3, None, 1.0, None)
    assert [str(e) for e in endpoints] == ["unix:/a", "tcp:h:1"]
    assert (options.node_expected, options.connect_timeout, options.reply_timeout) == (3, 1.0, None)
    assert options.client_name.startswith("decree-python/")
    assert r.settings("unix:/a", None, 0, "app", 5.0, 30.0)[1].client_name == "app"
    with pytest.raises(decree.UsageError):
        r.ManagerRules([], decree.Options(), 1.0)


# --- the driver ---------------------------------------------------------------------------


def test_driven_hands_results_and_exceptions_to_the_engine_and_keeps_its_value() -> None:
    def engine() -> r.Steps[str]:
        first = yield r.Call("a", "upper")
        try:
            yield r.Call("b", "fail")
        except ValueError as e:
            return f"{first} {e}"
        return "not reached"

    driven = r.Driven(engine())
    assert driven.call is not None and driven.call.invoke() == "A"
    driven.answer("A")
    driven.fail(ValueError("caught"))
    assert driven.call is None and driven.value == "A caught"

//! Fault injection around real resource managers: die at a chosen point of the protocol.
//!
//! A random kill rarely lands in the few microseconds that matter most, so the kill loop
//! also stops the process at chosen points: during prepare (one branch prepared, the other
//! not), right after the decision is durable (no branch committed yet) and during phase two
//! (one branch committed, the other still prepared). [`CrashRm`] wraps a real connection
//! and runs a [`CrashPlan`]'s action (by default SIGKILL of the whole process) before or
//! after the `nth` matching call, counted over every connection sharing the plan, after
//! telling the plan's witness, if it has one, the Xid of that call.
//!
//! A plan can also be marked dead ([`CrashPlan::set_dead`]): every later call fails as
//! `Unavailable`, which is how an in-process test freezes a coordinator at the instant of
//! a simulated power loss. Closing and dropping still reach the real connection, since a
//! dying process closes its sockets too. An armed plan turns off parallel branch calls so
//! that "one branch done, the other not" is what the crash leaves, every time.

use decree_core::{ResourceManager, RmError, RmFactory, Vote, Xid};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// The protocol moments the kill loop stops the process at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    /// After branch 0 prepared and before branch 1 did: presumed abort must roll back.
    Prepare,
    /// After the decision is durable, before the first phase-two commit is sent.
    Decided,
    /// After branch 0 committed in phase two, before branch 1 did.
    PhaseTwo,
}

impl CrashPoint {
    /// Every crash point, in the order the kill loop cycles through them.
    pub const ALL: [CrashPoint; 3] = [CrashPoint::Prepare, CrashPoint::Decided, CrashPoint::PhaseTwo];

    /// The name used on command lines.
    pub fn name(self) -> &'static str {
        match self {
            CrashPoint::Prepare => "prepare",
            CrashPoint::Decided => "decided",
            CrashPoint::PhaseTwo => "phase-two",
        }
    }

    /// The trigger that stops the process at this point of the `nth` transaction (from 1).
    pub fn trigger(self, nth: u64) -> Trigger {
        let (call, when) = match self {
            CrashPoint::Prepare => (TriggerCall::Prepare, TriggerWhen::After),
            CrashPoint::Decided => (TriggerCall::Commit, TriggerWhen::Before),
            CrashPoint::PhaseTwo => (TriggerCall::Commit, TriggerWhen::After),
        };
        Trigger { call, rm_index: 0, when, nth }
    }
}

impl FromStr for CrashPoint {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CrashPoint::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown crash point {s:?}; expected prepare, decided or phase-two"))
    }
}

/// The resource-manager call a trigger watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TriggerCall {
    /// `prepare`.
    Prepare,
    /// Phase-two `commit` (one-phase commits are not counted).
    Commit,
}

/// Whether the action runs before the call is forwarded or after it returned `Ok`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TriggerWhen {
    /// Before forwarding: the database never sees the call.
    Before,
    /// After the database answered `Ok`.
    After,
}

/// Where a plan's action runs: the `nth` (from 1) matching call on connection `rm_index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trigger {
    /// The watched call.
    pub call: TriggerCall,
    /// The connection's index in the session (0 = database A, 1 = database B).
    pub rm_index: usize,
    /// Before or after forwarding.
    pub when: TriggerWhen,
    /// Which matching call fires, counted from 1 over all connections of the plan.
    pub nth: u64,
}

/// What a fired trigger does (kill the process, stop a database server...).
pub type CrashAction = Arc<dyn Fn() + Send + Sync>;

/// What a fired trigger tells first: the branch Xid of the call it fired at (so that a
/// process about to die can say which transaction it dies in).
pub type CrashWitness = Arc<dyn Fn(&Xid) + Send + Sync>;

/// A trigger, its action, and the dead flag shared by every wrapped connection.
pub struct CrashPlan {
    trigger: Option<Trigger>,
    action: CrashAction,
    witness: Option<CrashWitness>,
    seen: AtomicU64,
    fired: AtomicBool,
    dead: AtomicBool,
}

impl CrashPlan {
    /// A plan that never fires (connections only honour the dead flag).
    pub fn none() -> Arc<Self> {
        Arc::new(CrashPlan {
            trigger: None,
            action: Arc::new(|| {}),
            witness: None,
            seen: AtomicU64::new(0),
            fired: AtomicBool::new(false),
            dead: AtomicBool::new(false),
        })
    }

    /// A plan that runs `action` once, at `trigger`.
    pub fn new(trigger: Trigger, action: CrashAction) -> Arc<Self> {
        Self::witnessed(trigger, None, action)
    }

    /// A plan that runs `action` once, at `trigger`, after telling `witness` (if any) the
    /// branch Xid of the call.
    pub fn witnessed(trigger: Trigger, witness: Option<CrashWitness>, action: CrashAction) -> Arc<Self> {
        assert!(trigger.nth >= 1, "triggers count calls from 1");
        Arc::new(CrashPlan {
            trigger: Some(trigger),
            action,
            witness,
            seen: AtomicU64::new(0),
            fired: AtomicBool::new(false),
            dead: AtomicBool::new(false),
        })
    }

    /// The action of a real crash: SIGKILL this process (no destructor, no flush runs).
    pub fn kill_process() -> CrashAction {
        Arc::new(|| {
            // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            // SIGKILL cannot be caught; should delivery somehow lag, never run on.
            std::process::abort();
        })
    }

    /// Whether the trigger has fired.
    pub fn fired(&self) -> bool {
        self.fired.load(Ordering::Acquire)
    }

    /// Marks the simulated process dead: every later call fails as `Unavailable`.
    pub fn set_dead(&self) {
        self.dead.store(true, Ordering::Release);
    }

    /// Whether [`CrashPlan::set_dead`] was called.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    fn armed(&self) -> bool {
        self.trigger.is_some()
    }

    fn check(&self, call: TriggerCall, rm_index: usize, when: TriggerWhen, xid: &Xid) {
        let Some(t) = self.trigger else { return };
        if t.call != call || t.rm_index != rm_index || t.when != when {
            return;
        }
        let n = self.seen.fetch_add(1, Ordering::AcqRel) + 1;
        if n == t.nth {
            self.fired.store(true, Ordering::Release);
            if let Some(witness) = &self.witness {
                witness(xid);
            }
            (self.action)();
        }
    }
}

/// A real connection with a [`CrashPlan`] around it.
pub struct CrashRm {
    inner: Box<dyn ResourceManager>,
    rm_index: usize,
    plan: Arc<CrashPlan>,
}

impl CrashRm {
    /// Wraps `inner`, which is connection `rm_index` of its session.
    pub fn new(inner: Box<dyn ResourceManager>, rm_index: usize, plan: Arc<CrashPlan>) -> Self {
        CrashRm { inner, rm_index, plan }
    }

    fn alive(&self, call: &str) -> Result<(), RmError> {
        if self.plan.is_dead() {
            return Err(RmError::Unavailable(format!(
                "{}: {call}: the process is dead (simulated crash)",
                self.inner.name()
            )));
        }
        Ok(())
    }
}

impl ResourceManager for CrashRm {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn open(&mut self) -> Result<(), RmError> {
        self.alive("open")?;
        self.inner.open()
    }
    fn close(&mut self) -> Result<(), RmError> {
        // A dead process closes its sockets as well: always forwarded.
        self.inner.close()
    }
    fn start(&mut self, xid: &Xid) -> Result<(), RmError> {
        self.alive("start")?;
        self.inner.start(xid)
    }
    fn end(&mut self, xid: &Xid) -> Result<(), RmError> {
        self.alive("end")?;
        self.inner.end(xid)
    }
    fn prepare(&mut self, xid: &Xid) -> Result<Vote, RmError> {
        self.alive("prepare")?;
        self.plan.check(TriggerCall::Prepare, self.rm_index, TriggerWhen::Before, xid);
        // The action may have declared the process dead: then nothing more is sent.
        self.alive("prepare")?;
        let vote = self.inner.prepare(xid)?;
        self.plan.check(TriggerCall::Prepare, self.rm_index, TriggerWhen::After, xid);
        Ok(vote)
    }
    fn commit(&mut self, xid: &Xid, one_phase: bool) -> Result<(), RmError> {
        self.alive("commit")?;
        if one_phase {
            return self.inner.commit(xid, true);
        }
        self.plan.check(TriggerCall::Commit, self.rm_index, TriggerWhen::Before, xid);
        self.alive("commit")?;
        self.inner.commit(xid, false)?;
        self.plan.check(TriggerCall::Commit, self.rm_index, TriggerWhen::After, xid);
        Ok(())
    }
    fn rollback(&mut self, xid: &Xid) -> Result<(), RmError> {
        self.alive("rollback")?;
        self.inner.rollback(xid)
    }
    fn recover(&mut self) -> Result<Vec<Xid>, RmError> {
        self.alive("recover")?;
        self.inner.recover()
    }
    fn forget(&mut self, xid: &Xid) -> Result<(), RmError> {
        self.alive("forget")?;
        self.inner.forget(xid)
    }
    fn prefers_parallel(&self) -> bool {
        // An armed plan needs a fixed order (branch 0, then branch 1) to leave exactly
        // one branch done when it fires.
        !self.plan.armed() && self.inner.prefers_parallel()
    }
}

/// A factory whose connections honour a plan's dead flag (recovery and background
/// retries of a simulated dead process must stop too).
pub struct CrashFactory {
    inner: Arc<dyn RmFactory>,
    plan: Arc<CrashPlan>,
}

impl CrashFactory {
    /// Wraps `inner`; its connections share `plan`'s dead flag (they never fire triggers).
    pub fn new(inner: Arc<dyn RmFactory>, plan: Arc<CrashPlan>) -> Self {
        CrashFactory { inner, plan }
    }
}

impl RmFactory for CrashFactory {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn connect(&self) -> Result<Box<dyn ResourceManager>, RmError> {
        if self.plan.is_dead() {
            return Err(RmError::Unavailable(format!(
                "{}: connect: the process is dead (simulated crash)",
                self.inner.name()
            )));
        }
        // usize::MAX: no session index, so triggers never match these connections.
        Ok(Box::new(CrashRm::new(self.inner.connect()?, usize::MAX, self.plan.clone())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use decree_core::testing::DummyFactory;
    use decree_core::Origin;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn a_trigger_fires_once_at_the_nth_matching_call_and_dead_refuses_calls() {
        let factory = DummyFactory::named("dummy", 0);
        let fired = Arc::new(AtomicUsize::new(0));
        let f = fired.clone();
        let witnessed = Arc::new(std::sync::Mutex::new(Vec::new()));
        let w = witnessed.clone();
        let plan = CrashPlan::witnessed(
            CrashPoint::PhaseTwo.trigger(2),
            Some(Arc::new(move |xid: &Xid| w.lock().unwrap().push(*xid))),
            Arc::new(move || {
                f.fetch_add(1, Ordering::SeqCst);
            }),
        );
        let mut rm = CrashRm::new(Box::new(factory.connection()), 0, plan.clone());
        assert!(!rm.prefers_parallel(), "an armed plan keeps branch calls in order");
        for sequence in 1..=3 {
            let xid = Xid::decree(Origin { node: 1, incarnation: 1, session: 1, sequence }).branch(0);
            rm.start(&xid).expect("start");
            rm.end(&xid).expect("end");
            rm.prepare(&xid).expect("prepare");
            rm.commit(&xid, false).expect("commit");
        }
        assert_eq!(fired.load(Ordering::SeqCst), 1, "fires at the 2nd commit only");
        let second = Xid::decree(Origin { node: 1, incarnation: 1, session: 1, sequence: 2 }).branch(0);
        assert_eq!(*witnessed.lock().unwrap(), vec![second], "told the Xid of the call it fired at");
        assert!(plan.fired());
        plan.set_dead();
        let xid = Xid::decree(Origin { node: 1, incarnation: 1, session: 1, sequence: 9 }).branch(0);
        assert!(matches!(rm.start(&xid), Err(RmError::Unavailable(_))));
        let wrapped = CrashFactory::new(factory.arc(), plan);
        assert!(matches!(wrapped.connect(), Err(RmError::Unavailable(_))));
        assert_eq!("phase-two".parse::<CrashPoint>(), Ok(CrashPoint::PhaseTwo));
        assert!("never".parse::<CrashPoint>().is_err());
    }
}

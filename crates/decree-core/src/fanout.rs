//! How one session drives several branches at the same time.
//!
//! Network resource managers spend each start, prepare and phase-two commit waiting for a
//! round trip (and a WAL flush on the database side), so a session with two such branches
//! runs their calls at once, in one of two ways. Resource managers with split-phase calls
//! ([`ResourceManager::send`], PostgreSQL) get every request sent first and every answer
//! taken after, from the session's own thread: no hand-off, no extra thread. The others go
//! to helper threads: the calling thread runs the first branch itself and hands each other
//! one to a helper, then waits for their answers. Spawning a thread per call costs more
//! than the call itself when the machine is busy (stack mmap/munmap serialises on the
//! process's address-space lock), so each session keeps its helpers for its whole life.
//!
//! A connection is lent to its helper by moving its `Box<dyn ResourceManager>` through a
//! channel and back (the slot holds a zero-sized [`Lent`] stand-in meanwhile, which does
//! not allocate), so no reference crosses threads and no `unsafe` is needed. Invariants:
//! every lent connection is back in its slot, and every split-phase request sent has been
//! received, when [`Fanout::run`] returns; a panic inside
//! a resource manager is resumed on the calling thread after the connection is put back,
//! as `std::thread::scope` would; when a helper cannot be started the branch runs on the
//! calling thread instead. Helpers exit when the session drops its [`Fanout`].

use crate::rm::{BranchAnswer, BranchCall, ResourceManager, RmError, Vote};
use crate::xid::Xid;
use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::JoinHandle;

/// Runs a call on one branch, blocking until its answer.
fn call_on(call: BranchCall, rm: &mut dyn ResourceManager, xid: &Xid) -> BranchAnswer {
    match call {
        BranchCall::Start => BranchAnswer::Ack(rm.start(xid)),
        BranchCall::Prepare => BranchAnswer::Vote(rm.prepare(xid)),
        BranchCall::Commit => BranchAnswer::Ack(rm.commit(xid, false)),
    }
}

/// How one round of calls on several branches runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spread {
    /// Send every request first and take the answers after, where the RM has split-phase
    /// calls ([`ResourceManager::send`]).
    pub(crate) split_phase: bool,
    /// Hand the branches without split-phase calls to helper threads (else the caller runs
    /// them one after another).
    pub(crate) helpers: bool,
}

/// A connection on its way to a helper, with what to do on it.
struct Job {
    rm: Box<dyn ResourceManager>,
    xid: Xid,
    call: BranchCall,
}

/// A connection on its way back, with the answer or the panic that interrupted the call.
struct Reply {
    rm: Box<dyn ResourceManager>,
    answer: Result<BranchAnswer, Box<dyn Any + Send>>,
}

/// One helper thread and its two channels.
struct Helper {
    jobs: Option<SyncSender<Job>>,
    replies: Receiver<Reply>,
    thread: Option<JoinHandle<()>>,
}

impl Helper {
    fn spawn() -> std::io::Result<Helper> {
        // One job at a time per helper: the session waits for every reply before it sends
        // the next job, so a buffer of one never blocks.
        let (jobs, inbox) = mpsc::sync_channel::<Job>(1);
        let (outbox, replies) = mpsc::sync_channel::<Reply>(1);
        let thread = std::thread::Builder::new().name("decree-branch".into()).spawn(move || {
            for mut job in inbox {
                let answer =
                    panic::catch_unwind(AssertUnwindSafe(|| call_on(job.call, job.rm.as_mut(), &job.xid)));
                if outbox.send(Reply { rm: job.rm, answer }).is_err() {
                    return;
                }
            }
        })?;
        Ok(Helper { jobs: Some(jobs), replies, thread: Some(thread) })
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        // Closing the job channel ends the helper's loop; it is idle between runs.
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Stands in for a connection while a helper holds it; never called.
struct Lent;

impl Lent {
    fn refuse() -> RmError {
        RmError::Protocol("the connection is lent to a branch helper thread".into())
    }
}

impl ResourceManager for Lent {
    fn name(&self) -> &str {
        "(lent)"
    }
    fn open(&mut self) -> Result<(), RmError> {
        Err(Lent::refuse())
    }
    fn close(&mut self) -> Result<(), RmError> {
        Err(Lent::refuse())
    }
    fn start(&mut self, _xid: &Xid) -> Result<(), RmError> {
        Err(Lent::refuse())
    }
    fn end(&mut self, _xid: &Xid) -> Result<(), RmError> {
        Err(Lent::refuse())
    }
    fn prepare(&mut self, _xid: &Xid) -> Result<Vote, RmError> {
        Err(Lent::refuse())
    }
    fn commit(&mut self, _xid: &Xid, _one_phase: bool) -> Result<(), RmError> {
        Err(Lent::refuse())
    }
    fn rollback(&mut self, _xid: &Xid) -> Result<(), RmError> {
        Err(Lent::refuse())
    }
    fn recover(&mut self) -> Result<Vec<Xid>, RmError> {
        Err(Lent::refuse())
    }
    fn forget(&mut self, _xid: &Xid) -> Result<(), RmError> {
        Err(Lent::refuse())
    }
}

/// A session's helper threads, started on first use and kept until the session ends.
#[derive(Default)]
pub(crate) struct Fanout {
    helpers: Vec<Helper>,
    /// Slot of the connection each busy helper holds, in helper order.
    lent: Vec<usize>,
    /// Slots whose request was sent and whose answer is still to be received.
    in_flight: Vec<usize>,
    /// Slots that take blocking calls (no split-phase calls), in slot order.
    blocking: Vec<usize>,
}

impl Fanout {
    /// Runs `call` on every connection `i` for which `selected(i)` holds, at the same time
    /// as `spread` allows, and hands each answer to `deliver(i, answer)`.
    ///
    /// Order: the split-phase requests go out first, then the blocking calls run (the
    /// first on this thread, the others on helpers when `spread.helpers`), then the
    /// split-phase answers are received, so every branch's work overlaps.
    pub(crate) fn run(
        &mut self,
        rms: &mut [Box<dyn ResourceManager>],
        xids: &[Xid],
        selected: impl Fn(usize) -> bool,
        call: BranchCall,
        spread: Spread,
        mut deliver: impl FnMut(usize, BranchAnswer),
    ) {
        self.in_flight.clear();
        self.blocking.clear();
        for i in (0..rms.len()).filter(|&i| selected(i)) {
            if spread.split_phase && rms[i].send(call, &xids[i]) {
                self.in_flight.push(i);
            } else {
                self.blocking.push(i);
            }
        }
        let blocking = std::mem::take(&mut self.blocking);
        if spread.helpers {
            self.run_blocking_on_helpers(rms, xids, &blocking, call, &mut deliver);
        } else {
            for &i in &blocking {
                deliver(i, call_on(call, rms[i].as_mut(), &xids[i]));
            }
        }
        self.blocking = blocking;
        for &i in &self.in_flight {
            deliver(i, rms[i].receive());
        }
    }

    /// Runs the first of `slots` on this thread and lends the others to helpers.
    fn run_blocking_on_helpers(
        &mut self,
        rms: &mut [Box<dyn ResourceManager>],
        xids: &[Xid],
        slots: &[usize],
        call: BranchCall,
        deliver: &mut impl FnMut(usize, BranchAnswer),
    ) {
        let Some((&own, others)) = slots.split_first() else { return };
        self.lent.clear();
        let mut inline = Vec::new();
        for &i in others {
            if self.lend(rms, xids, i, call) {
                self.lent.push(i);
            } else {
                inline.push(i);
            }
        }
        deliver(own, call_on(call, rms[own].as_mut(), &xids[own]));
        for i in inline {
            deliver(i, call_on(call, rms[i].as_mut(), &xids[i]));
        }
        let mut panicked = None;
        for (h, &i) in self.lent.iter().enumerate() {
            match self.helpers[h].replies.recv() {
                Ok(reply) => {
                    rms[i] = reply.rm;
                    match reply.answer {
                        Ok(answer) => deliver(i, answer),
                        Err(payload) => panicked = panicked.or(Some(payload)),
                    }
                }
                // Unreachable while the helper loop catches panics; the connection is
                // lost with the helper, and the slot keeps refusing every call.
                Err(_) => deliver(i, lost(call)),
            }
        }
        if let Some(payload) = panicked {
            panic::resume_unwind(payload);
        }
    }

    /// Sends connection `i` to the next free helper, starting one if needed; false when no
    /// helper could take it (the caller then runs it itself).
    fn lend(
        &mut self,
        rms: &mut [Box<dyn ResourceManager>],
        xids: &[Xid],
        i: usize,
        call: BranchCall,
    ) -> bool {
        let h = self.lent.len();
        if h == self.helpers.len() {
            match Helper::spawn() {
                Ok(helper) => self.helpers.push(helper),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start a branch helper thread; running in sequence");
                    return false;
                }
            }
        }
        let Some(jobs) = self.helpers[h].jobs.as_ref() else { return false };
        let rm = std::mem::replace(&mut rms[i], Box::new(Lent));
        match jobs.send(Job { rm, xid: xids[i], call }) {
            Ok(()) => true,
            Err(mpsc::SendError(job)) => {
                // The helper is gone: take the connection back and drop the helper.
                rms[i] = job.rm;
                self.helpers.truncate(h);
                false
            }
        }
    }
}

/// The answer for a connection whose helper died.
fn lost(call: BranchCall) -> BranchAnswer {
    let e = RmError::Protocol("the branch helper thread died holding the connection".into());
    match call {
        BranchCall::Prepare => BranchAnswer::Vote(Err(e)),
        BranchCall::Start | BranchCall::Commit => BranchAnswer::Ack(Err(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::dummy::{DummyConfig, DummyFactory};
    use crate::xid::Origin;
    use std::sync::{Arc, Barrier};

    const HELPERS: Spread = Spread { split_phase: false, helpers: true };

    fn xid(seq: u64) -> Xid {
        Xid::decree(Origin { node: 1, incarnation: 1, session: 1, sequence: seq })
    }

    /// Waits at a shared barrier in prepare, so the run finishes only if every branch's
    /// call is in flight at the same time.
    struct Rendezvous {
        barrier: Arc<Barrier>,
        threads: Arc<parking_lot::Mutex<Vec<std::thread::ThreadId>>>,
    }

    impl ResourceManager for Rendezvous {
        fn name(&self) -> &str {
            "rendezvous"
        }
        fn open(&mut self) -> Result<(), RmError> {
            Ok(())
        }
        fn close(&mut self) -> Result<(), RmError> {
            Ok(())
        }
        fn start(&mut self, _xid: &Xid) -> Result<(), RmError> {
            Ok(())
        }
        fn end(&mut self, _xid: &Xid) -> Result<(), RmError> {
            Ok(())
        }
        fn prepare(&mut self, _xid: &Xid) -> Result<Vote, RmError> {
            self.threads.lock().push(std::thread::current().id());
            self.barrier.wait();
            Ok(Vote::Commit)
        }
        fn commit(&mut self, _xid: &Xid, _one_phase: bool) -> Result<(), RmError> {
            if std::thread::current().name() == Some("decree-branch") {
                panic!("commit panicked on purpose");
            }
            Ok(())
        }
        fn rollback(&mut self, _xid: &Xid) -> Result<(), RmError> {
            Ok(())
        }
        fn recover(&mut self) -> Result<Vec<Xid>, RmError> {
            Ok(Vec::new())
        }
        fn forget(&mut self, _xid: &Xid) -> Result<(), RmError> {
            Ok(())
        }
    }

    /// Records the order of its calls in a log shared by all connections; split-phase when
    /// `split` is set.
    struct Recorder {
        id: usize,
        split: bool,
        log: CallLog,
        in_flight: bool,
    }

    impl Recorder {
        fn note(&self, what: &str) {
            self.log.lock().push(format!("{what} {}", self.id));
        }
    }

    impl ResourceManager for Recorder {
        fn name(&self) -> &str {
            "recorder"
        }
        fn open(&mut self) -> Result<(), RmError> {
            Ok(())
        }
        fn close(&mut self) -> Result<(), RmError> {
            Ok(())
        }
        fn start(&mut self, _xid: &Xid) -> Result<(), RmError> {
            Ok(())
        }
        fn end(&mut self, _xid: &Xid) -> Result<(), RmError> {
            Ok(())
        }
        fn prepare(&mut self, _xid: &Xid) -> Result<Vote, RmError> {
            self.note("call");
            Ok(Vote::Commit)
        }
        fn commit(&mut self, _xid: &Xid, _one_phase: bool) -> Result<(), RmError> {
            Ok(())
        }
        fn rollback(&mut self, _xid: &Xid) -> Result<(), RmError> {
            Ok(())
        }
        fn recover(&mut self) -> Result<Vec<Xid>, RmError> {
            Ok(Vec::new())
        }
        fn forget(&mut self, _xid: &Xid) -> Result<(), RmError> {
            Ok(())
        }
        fn send(&mut self, call: BranchCall, _xid: &Xid) -> bool {
            if !self.split {
                return false;
            }
            assert_eq!(call, BranchCall::Prepare);
            assert!(!self.in_flight, "a second send before the first answer was taken");
            self.in_flight = true;
            self.note("send");
            true
        }
        fn receive(&mut self) -> BranchAnswer {
            assert!(self.in_flight, "receive without send");
            self.in_flight = false;
            self.note("receive");
            BranchAnswer::Vote(Ok(Vote::ReadOnly))
        }
    }

    /// The order of calls, shared by every [`Recorder`].
    type CallLog = Arc<parking_lot::Mutex<Vec<String>>>;

    fn recorders(split: &[bool]) -> (Vec<Box<dyn ResourceManager>>, CallLog) {
        let log = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let rms = split
            .iter()
            .enumerate()
            .map(|(id, &split)| {
                Box::new(Recorder { id, split, log: log.clone(), in_flight: false })
                    as Box<dyn ResourceManager>
            })
            .collect();
        (rms, log)
    }

    #[test]
    fn split_phase_requests_all_go_out_before_any_answer_is_awaited() {
        let (mut rms, log) = recorders(&[true, false, true, true]);
        let xids = [xid(1), xid(2), xid(3), xid(4)];
        let mut fanout = Fanout::default();
        let mut answers = vec![None; 4];
        let spread = Spread { split_phase: true, helpers: false };
        fanout.run(
            &mut rms,
            &xids,
            |i| i != 3,
            BranchCall::Prepare,
            spread,
            |i, a| {
                answers[i] = Some(a.into_vote().expect("vote"));
            },
        );
        assert_eq!(
            *log.lock(),
            ["send 0", "send 2", "call 1", "receive 0", "receive 2"],
            "sends first, then the blocking call, then the answers; slot 3 was not selected"
        );
        assert_eq!(answers, [Some(Vote::ReadOnly), Some(Vote::Commit), Some(Vote::ReadOnly), None]);
        assert!(fanout.helpers.is_empty(), "no helper thread without helpers allowed");

        // Without split-phase calls every branch takes the blocking call.
        log.lock().clear();
        let spread = Spread { split_phase: false, helpers: false };
        fanout.run(&mut rms, &xids, |_| true, BranchCall::Prepare, spread, |_, _| {});
        assert_eq!(*log.lock(), ["call 0", "call 1", "call 2", "call 3"]);
    }

    #[test]
    fn branches_run_at_once_on_kept_helpers_and_come_back() {
        let barrier = Arc::new(Barrier::new(3));
        let threads = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let mut rms: Vec<Box<dyn ResourceManager>> = (0..3)
            .map(|_| Box::new(Rendezvous { barrier: barrier.clone(), threads: threads.clone() }) as _)
            .collect();
        let xids = [xid(1), xid(2), xid(3)];
        let mut fanout = Fanout::default();
        for round in 0..3 {
            let mut seen = Vec::new();
            fanout.run(
                &mut rms,
                &xids,
                |_| true,
                BranchCall::Prepare,
                HELPERS,
                |i, a| {
                    assert!(matches!(a, BranchAnswer::Vote(Ok(Vote::Commit))), "{a:?}");
                    seen.push(i);
                },
            );
            seen.sort_unstable();
            assert_eq!(seen, vec![0, 1, 2], "round {round}");
            assert!(rms.iter().all(|rm| rm.name() == "rendezvous"), "every connection is back");
        }
        assert_eq!(fanout.helpers.len(), 2, "helpers are kept, not started per call");
        let mut ids = threads.lock().clone();
        ids.sort_by_key(|id| format!("{id:?}"));
        ids.dedup();
        assert_eq!(ids.len(), 3, "the caller and two helpers took part");
    }

    #[test]
    fn unselected_connections_are_left_alone() {
        let factory = DummyFactory::new(DummyConfig::new("dummy"));
        let mut rms: Vec<Box<dyn ResourceManager>> =
            (0..3).map(|_| Box::new(factory.connection()) as Box<dyn ResourceManager>).collect();
        let xids = [xid(1), xid(2), xid(3)];
        for (rm, x) in rms.iter_mut().zip(&xids) {
            rm.open().expect("open");
            rm.start(x).expect("start");
            rm.end(x).expect("end");
        }
        let mut fanout = Fanout::default();
        let mut seen = Vec::new();
        fanout.run(
            &mut rms,
            &xids,
            |i| i != 1,
            BranchCall::Prepare,
            HELPERS,
            |i, a| {
                assert!(matches!(a, BranchAnswer::Vote(Ok(Vote::Commit))), "{a:?}");
                seen.push(i);
            },
        );
        assert_eq!(seen, vec![0, 2]);
        // Connection 1 was never prepared, so committing it in two phases is refused.
        let err = rms[1].commit(&xids[1], false).expect_err("branch 1 was not prepared");
        assert!(matches!(err, RmError::Protocol(_) | RmError::UnknownXid(_)), "{err:?}");
    }

    #[test]
    fn a_panic_in_a_helper_reaches_the_caller_and_the_connection_comes_back() {
        let barrier = Arc::new(Barrier::new(1));
        let threads = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let mut rms: Vec<Box<dyn ResourceManager>> = (0..2)
            .map(|_| Box::new(Rendezvous { barrier: barrier.clone(), threads: threads.clone() }) as _)
            .collect();
        let xids = [xid(1), xid(2)];
        let mut fanout = Fanout::default();
        let result = panic::catch_unwind(AssertUnwindSafe(|| {
            fanout.run(&mut rms, &xids, |_| true, BranchCall::Commit, HELPERS, |_, _| {});
        }));
        let payload = result.expect_err("the helper's panic is resumed");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"commit panicked on purpose"));
        assert!(rms.iter().all(|rm| rm.name() == "rendezvous"), "the connection is back");
    }
}

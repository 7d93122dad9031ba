//! Which durable write served an `append_with` record, told to its callback while it runs.
//! Under group commit one write (and one sync) serves every record of a batch; the state
//! server's spans show that write once, linked to each transaction it served (issue 36).
//!
//! The engines keep their batching to themselves: each calls [`call_batch`] with the
//! callbacks of one write, and a callback asks [`current`]. What it costs a write: one
//! atomic increment, and a thread-local store per callback; nothing is allocated.
//! Outside a batch's callback (a record refused before any write, or any other code)
//! [`current`] is `None`.

use crate::{DurableCallback, LogError};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// The write that made a record durable, as the record's callback sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteBatch {
    /// Numbers the writes of this process, of every log, from 1 up.
    pub number: u64,
    /// How many callbacks the write calls.
    pub callbacks: usize,
    /// Which of them runs now, from 0; they run one after the other on one thread.
    pub position: usize,
}

/// The number of the next write.
static NEXT_NUMBER: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The batch whose callback runs on this thread now.
    static CURRENT: Cell<Option<WriteBatch>> = const { Cell::new(None) };
}

/// The write whose callback runs on this thread now; `None` outside such a callback.
pub fn current() -> Option<WriteBatch> {
    CURRENT.with(Cell::get)
}

/// Calls every callback of one write with `result` through the engine's `call` (which
/// decides what a panicking callback does), one after the other, each seeing the batch
/// through [`current`].
pub(crate) fn call_batch<I>(
    callbacks: I,
    result: Result<(), LogError>,
    call: impl Fn(DurableCallback, Result<(), LogError>),
) where
    I: IntoIterator<Item = DurableCallback>,
    I::IntoIter: ExactSizeIterator,
{
    let callbacks = callbacks.into_iter();
    let number = NEXT_NUMBER.fetch_add(1, Ordering::Relaxed);
    let count = callbacks.len();
    // A callback may append again and see its own record's batch called inline: the
    // outer batch is given back afterwards, even when a callback panics.
    let _restore = Restore(current());
    for (position, done) in callbacks.enumerate() {
        assert!(position < count, "no more callbacks than the write said");
        CURRENT.with(|c| c.set(Some(WriteBatch { number, callbacks: count, position })));
        call(done, result.clone());
    }
}

/// Gives [`current`] its value from before a batch back when dropped.
struct Restore(Option<WriteBatch>);

impl Drop for Restore {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn each_callback_of_a_write_sees_its_batch_and_nothing_is_seen_outside() {
        let seen: Arc<Mutex<Vec<Option<WriteBatch>>>> = Arc::default();
        let callback = |seen: &Arc<Mutex<Vec<Option<WriteBatch>>>>| -> DurableCallback {
            let seen = seen.clone();
            Box::new(move |_| seen.lock().unwrap().push(current()))
        };
        let call = |done: DurableCallback, result| done(result);
        call_batch((0..3).map(|_| callback(&seen)).collect::<Vec<_>>(), Ok(()), call);
        call_batch(vec![callback(&seen)], Ok(()), call);
        assert_eq!(current(), None);
        let seen = seen.lock().unwrap().clone();
        let batches: Vec<WriteBatch> = seen.into_iter().map(Option::unwrap).collect();
        let first = batches[0].number;
        assert_eq!(
            batches,
            [
                WriteBatch { number: first, callbacks: 3, position: 0 },
                WriteBatch { number: first, callbacks: 3, position: 1 },
                WriteBatch { number: first, callbacks: 3, position: 2 },
                WriteBatch { number: batches[3].number, callbacks: 1, position: 0 },
            ]
        );
        assert!(batches[3].number > first);
    }

    #[test]
    fn a_panicking_callback_leaves_no_batch_behind() {
        let callbacks: Vec<DurableCallback> = vec![Box::new(|_| panic!("a callback's own bug"))];
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            call_batch(callbacks, Ok(()), |done, result| done(result))
        }));
        assert!(unwound.is_err());
        assert_eq!(current(), None);
    }
}

//! The primary's side of the stream: records waiting to be sent, batches sent and not yet
//! acknowledged (kept for a resend), and which decisions each batch confirms once the
//! backup acknowledges it. No IO: the link's runtime cuts batches, sends them and feeds
//! acknowledgements back.
//!
//! Everything is bounded: a batch holds at most `batch_records_max` records and
//! `batch_bytes_max` payload bytes, and at most `unacked_batches_max` batches wait for an
//! acknowledgement. When the bound is reached [`Outbox::push`] refuses, and the server
//! stops taking decisions: a strict primary acknowledges nothing its backup has not
//! confirmed, so a backup that stopped answering must stop the primary, not fill its
//! memory.
//!
//! A new link starts with a **catch-up** ([`Outbox::begin_catch_up`]): what the outbox held
//! before the live set's snapshot is dropped (the live set holds what of it still matters;
//! its tickets wait for the catch-up's last batch, so that no acknowledgement confirms a
//! decision the backup may not hold), and the live set goes first, from a queue of its own
//! cut into batches as the backup acknowledges them: a live set larger than the outbox's
//! bounds is streamed, never refused.

use crate::wire::{LinkRecord, BATCH_RECORDS_MAX};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// Identifies a decision waiting for its batch's acknowledgement (the server's reply to
/// the client waits on it).
pub type Ticket = u64;

/// The outbox's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutboxLimits {
    /// Records in one batch.
    pub batch_records_max: usize,
    /// Payload bytes in one batch (below the link's frame bound).
    pub batch_bytes_max: usize,
    /// Batches sent and not acknowledged.
    pub unacked_batches_max: usize,
}

impl Default for OutboxLimits {
    fn default() -> Self {
        OutboxLimits { batch_records_max: 1024, batch_bytes_max: 1 << 20, unacked_batches_max: 256 }
    }
}

/// A batch cut from the outbox: what goes on the wire, and the decisions it confirms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Its number in the epoch, from 1.
    pub sequence: u64,
    /// Its records, in the order they were pushed (shared with the message that sends them).
    pub records: Arc<[LinkRecord]>,
    /// The decisions the backup confirms by acknowledging it.
    pub tickets: Vec<Ticket>,
    /// When its oldest record was pushed: how long the backup has kept it waiting.
    pub since: Instant,
}

/// Why a record was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboxFull {
    /// `unacked_batches_max` batches wait for the backup: nothing more until it answers.
    Unacknowledged(usize),
}

/// The primary's records on their way to the backup.
#[derive(Debug)]
pub struct Outbox {
    limits: OutboxLimits,
    current: Vec<LinkRecord>,
    current_tickets: Vec<Ticket>,
    current_bytes: usize,
    /// When the first record of the current batch was pushed.
    current_since: Option<Instant>,
    /// The sequence the next batch cut gets.
    next_sequence: u64,
    unacked: VecDeque<Batch>,
    /// Records pushed since the outbox was made: a catch-up drops those pushed before its
    /// snapshot's mark.
    pushed: u64,
    catch_up: CatchUp,
}

/// The live set of the link being opened, and the tickets that wait for it.
#[derive(Debug, Default)]
struct CatchUp {
    /// Live-set records not cut into a batch yet; they go before anything pushed.
    queue: VecDeque<LinkRecord>,
    /// Decisions of earlier links (their records dropped: the live set holds them),
    /// confirmed only when the catch-up's last batch is acknowledged.
    held: Vec<Ticket>,
    /// The catch-up's last batch, once cut (the sequence before its first when empty).
    last: Option<u64>,
}

impl Outbox {
    /// An empty outbox for a new epoch: its first batch is number 1.
    pub fn new(limits: OutboxLimits) -> Outbox {
        assert!(limits.batch_records_max >= 1 && limits.batch_records_max <= BATCH_RECORDS_MAX);
        assert!(limits.unacked_batches_max >= 1);
        Outbox {
            limits,
            current: Vec::new(),
            current_tickets: Vec::new(),
            current_bytes: 0,
            current_since: None,
            next_sequence: 1,
            unacked: VecDeque::new(),
            pushed: 0,
            catch_up: CatchUp { last: Some(0), ..CatchUp::default() },
        }
    }

    /// A mark for [`Outbox::begin_catch_up`]: records pushed from now on are kept.
    pub fn mark(&self) -> u64 {
        self.pushed
    }

    /// A link opened expecting batch `first_sequence` next (nothing was sent on it yet), and
    /// `live` is the primary's live set, snapshotted after `mark` was taken: drops every
    /// record pushed before the mark (the live set holds what of them matters), moves
    /// every ticket waiting now to the catch-up's last batch, queues the live set ahead of
    /// everything else, and keeps the records pushed since the mark behind it.
    pub fn begin_catch_up(&mut self, mark: u64, first_sequence: u64, live: Vec<LinkRecord>) {
        assert!(mark <= self.pushed, "a mark of this outbox");
        let mut held = std::mem::take(&mut self.catch_up.held);
        let mut earlier: Vec<LinkRecord> = Vec::new();
        for batch in self.unacked.drain(..) {
            held.extend(batch.tickets);
            earlier.extend(batch.records.iter().cloned());
        }
        held.append(&mut self.current_tickets);
        earlier.append(&mut self.current);
        // Records pushed since the mark are the last `pushed - mark` of those held.
        let kept = ((self.pushed - mark) as usize).min(earlier.len());
        let kept: Vec<LinkRecord> = earlier.split_off(earlier.len() - kept);
        self.current_bytes = 0;
        self.current_since = None;
        self.next_sequence = first_sequence.max(1);
        let empty = live.is_empty();
        self.catch_up = CatchUp { queue: live.into(), held, last: empty.then_some(self.next_sequence - 1) };
        for record in kept {
            self.current_bytes += record.payload.len();
            self.current_since.get_or_insert_with(Instant::now);
            self.current.push(record);
        }
        self.check();
    }

    /// The catch-up's last batch, once it is cut: `CaughtUp` names it.
    pub fn catch_up_last(&self) -> Option<u64> {
        self.catch_up.last
    }

    /// Whether a record of `bytes` would be refused now.
    pub fn is_full(&self, bytes: usize) -> bool {
        !self.may_cut_current() && self.needs_cut_for(bytes)
    }

    /// Whether the records pushed may become a batch now: not while the live set waits
    /// to be cut (it goes first), nor past the unacknowledged bound.
    fn may_cut_current(&self) -> bool {
        self.catch_up.queue.is_empty() && self.unacked.len() < self.limits.unacked_batches_max
    }

    /// Whether a record of `bytes` must go to the next batch: the current one has records
    /// and would pass a bound with it (a single larger record still makes a batch alone).
    fn needs_cut_for(&self, bytes: usize) -> bool {
        !self.current.is_empty()
            && (self.current.len() >= self.limits.batch_records_max
                || self.current_bytes + bytes > self.limits.batch_bytes_max)
    }

    /// Takes a record for the next batch; `ticket` names a decision whose acknowledgement
    /// waits for the backup. Cuts the current batch first when it is full.
    pub fn push(&mut self, record: LinkRecord, ticket: Option<Ticket>) -> Result<(), OutboxFull> {
        if self.needs_cut_for(record.payload.len()) {
            if !self.may_cut_current() {
                return Err(OutboxFull::Unacknowledged(self.unacked.len()));
            }
            self.cut();
        }
        self.pushed += 1;
        self.current_bytes += record.payload.len();
        self.current_since.get_or_insert_with(Instant::now);
        self.current.push(record);
        self.current_tickets.extend(ticket);
        Ok(())
    }

    /// Makes the records pushed so far a batch, kept until acknowledged, and returns it
    /// for sending; `None` when nothing waits or the unacknowledged bound is reached.
    pub fn cut(&mut self) -> Option<&Batch> {
        if !self.catch_up.queue.is_empty() {
            return self.cut_catch_up();
        }
        if self.current.is_empty() || !self.may_cut_current() {
            return None;
        }
        let batch = Batch {
            sequence: self.next_sequence,
            records: std::mem::take(&mut self.current).into(),
            tickets: std::mem::take(&mut self.current_tickets),
            since: self.current_since.take().expect("a batch with records has its first push's time"),
        };
        self.current_bytes = 0;
        self.next_sequence += 1;
        self.unacked.push_back(batch);
        self.check();
        self.unacked.back()
    }

    /// Cuts the next batch of the live set, within the batch bounds, when the
    /// unacknowledged bound leaves room; its last batch carries the held tickets.
    fn cut_catch_up(&mut self) -> Option<&Batch> {
        if self.unacked.len() >= self.limits.unacked_batches_max {
            return None;
        }
        let (mut records, mut bytes) = (Vec::new(), 0usize);
        while let Some(next) = self.catch_up.queue.front() {
            let size = next.payload.len();
            if !records.is_empty()
                && (records.len() >= self.limits.batch_records_max
                    || bytes + size > self.limits.batch_bytes_max)
            {
                break;
            }
            bytes += size;
            records.push(self.catch_up.queue.pop_front().expect("front exists"));
        }
        let last = self.catch_up.queue.is_empty();
        let batch = Batch {
            sequence: self.next_sequence,
            records: records.into(),
            tickets: if last { std::mem::take(&mut self.catch_up.held) } else { Vec::new() },
            since: Instant::now(),
        };
        if last {
            self.catch_up.last = Some(batch.sequence);
        }
        self.next_sequence += 1;
        self.unacked.push_back(batch);
        self.check();
        self.unacked.back()
    }

    /// The backup made every batch up to `sequence` durable: forgets them and returns the
    /// decisions they confirm. An acknowledgement of a batch never cut is ignored (its
    /// sender is wrong, and nothing may be confirmed on its word).
    pub fn acknowledge(&mut self, sequence: u64) -> Vec<Ticket> {
        if sequence >= self.next_sequence {
            return Vec::new();
        }
        let mut confirmed = Vec::new();
        while self.unacked.front().is_some_and(|b| b.sequence <= sequence) {
            let batch = self.unacked.pop_front().expect("front exists");
            confirmed.extend(batch.tickets);
        }
        // An empty live set: the earlier links' tickets go with the `CaughtUp`'s answer.
        if self.catch_up.last.is_some_and(|last| sequence >= last) {
            confirmed.append(&mut self.catch_up.held);
        }
        self.check();
        confirmed
    }

    /// The unacknowledged batches from `from` on, for a backup that reconnected expecting
    /// `from` next (batches before it it already holds).
    pub fn resend_from(&self, from: u64) -> impl Iterator<Item = &Batch> {
        self.unacked.iter().filter(move |b| b.sequence >= from)
    }

    /// Records not acknowledged yet, sent or not.
    pub fn unacked_records(&self) -> usize {
        self.current.len()
            + self.catch_up.queue.len()
            + self.unacked.iter().map(|b| b.records.len()).sum::<usize>()
    }

    /// Decisions waiting for the backup's acknowledgement.
    pub fn unacked_tickets(&self) -> usize {
        self.current_tickets.len()
            + self.catch_up.held.len()
            + self.unacked.iter().map(|b| b.tickets.len()).sum::<usize>()
    }

    /// When the oldest record not acknowledged yet was pushed.
    pub fn oldest_unacked(&self) -> Option<Instant> {
        self.unacked.front().map(|b| b.since).or(self.current_since)
    }

    /// The sequence the next batch cut gets.
    pub fn next_sequence(&self) -> u64 {
        self.next_sequence
    }

    /// Batches waiting for an acknowledgement.
    pub fn unacked_count(&self) -> usize {
        self.unacked.len()
    }

    /// Sequences only increase and the unacknowledged ones are contiguous and below the next.
    fn check(&self) {
        assert!(self.unacked.len() <= self.limits.unacked_batches_max);
        for (a, b) in self.unacked.iter().zip(self.unacked.iter().skip(1)) {
            assert_eq!(a.sequence + 1, b.sequence, "unacknowledged batches are contiguous");
        }
        if let Some(last) = self.unacked.back() {
            assert_eq!(last.sequence + 1, self.next_sequence);
        }
        assert!(
            self.catch_up.queue.is_empty() || self.catch_up.last.is_none(),
            "the catch-up's last batch is known only once the live set is cut"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::RecordKind;
    use decree_core::{Origin, Xid};

    fn record(sequence: u64, bytes: usize) -> LinkRecord {
        let xid = Xid::decree(Origin { node: 1, incarnation: 0x101, session: 1, sequence });
        LinkRecord { kind: RecordKind::Decision, xid, payload: vec![0; bytes] }
    }

    fn limits(records: usize, bytes: usize, unacked: usize) -> OutboxLimits {
        OutboxLimits { batch_records_max: records, batch_bytes_max: bytes, unacked_batches_max: unacked }
    }

    #[test]
    fn batches_are_numbered_from_one_and_confirm_their_decisions_when_acknowledged() {
        let mut outbox = Outbox::new(OutboxLimits::default());
        assert!(outbox.cut().is_none(), "nothing to send");
        outbox.push(record(1, 10), Some(1)).unwrap();
        outbox.push(record(2, 0), None).unwrap();
        let first = outbox.cut().unwrap().clone();
        assert_eq!((first.sequence, first.records.len(), first.tickets.clone()), (1, 2, vec![1]));
        outbox.push(record(3, 10), Some(3)).unwrap();
        assert_eq!(outbox.cut().unwrap().sequence, 2);
        assert_eq!(
            outbox.acknowledge(5),
            Vec::<Ticket>::new(),
            "an ack of a batch never cut confirms nothing"
        );
        assert_eq!(outbox.unacked_count(), 2);
        assert_eq!(outbox.acknowledge(1), vec![1]);
        assert_eq!(outbox.acknowledge(1), Vec::<Ticket>::new(), "a repeated ack confirms nothing more");
        assert_eq!(outbox.acknowledge(2), vec![3]);
        assert_eq!(outbox.unacked_count(), 0);
    }

    #[test]
    fn a_full_batch_is_cut_by_records_or_bytes() {
        for (records, bytes, pushes, expected_batches) in [(2, 1 << 20, 5, 2), (100, 25, 5, 2), (1, 1, 3, 2)]
        {
            let mut outbox = Outbox::new(limits(records, bytes, 16));
            for i in 0..pushes {
                outbox.push(record(i, 10), Some(i)).unwrap();
            }
            assert_eq!(outbox.unacked_count(), expected_batches, "{records} records, {bytes} bytes");
            for batch in outbox.resend_from(1) {
                assert!(batch.records.len() <= records);
                let payload: usize = batch.records.iter().map(|r| r.payload.len()).sum();
                assert!(
                    payload <= bytes.max(10),
                    "a batch stays within its bytes unless one record is larger"
                );
            }
        }
    }

    #[test]
    fn a_silent_backup_stops_the_primary_at_the_bound_and_its_ack_frees_it() {
        let mut outbox = Outbox::new(limits(1, 1 << 20, 2));
        outbox.push(record(1, 1), Some(1)).unwrap();
        outbox.push(record(2, 1), Some(2)).unwrap(); // cuts batch 1
        outbox.push(record(3, 1), Some(3)).unwrap(); // cuts batch 2
        assert!(outbox.is_full(1));
        assert_eq!(outbox.push(record(4, 1), Some(4)), Err(OutboxFull::Unacknowledged(2)));
        assert!(outbox.cut().is_none(), "no third batch in flight");
        assert_eq!(outbox.acknowledge(1), vec![1]);
        outbox.push(record(4, 1), Some(4)).unwrap(); // cuts batch 3 (record 3)
        assert_eq!(outbox.resend_from(1).map(|b| b.sequence).collect::<Vec<_>>(), [2, 3]);
        assert_eq!(outbox.resend_from(3).map(|b| b.sequence).collect::<Vec<_>>(), [3]);
        assert_eq!(outbox.acknowledge(3), vec![2, 3]);
        assert_eq!(outbox.cut().map(|b| (b.sequence, b.tickets.clone())), Some((4, vec![4])));
    }

    /// Defect 6 of issue 32: a live set larger than the outbox's bounds was refused on
    /// every link ("too far behind"), and records shipped while no backup answered filled
    /// the outbox for good. The catch-up drops what came before its mark and streams the
    /// live set under the bounds.
    #[test]
    fn a_live_set_larger_than_the_outbox_streams_and_what_came_before_the_mark_is_dropped() {
        let mut outbox = Outbox::new(limits(2, 1 << 20, 2));
        for i in 0..6 {
            outbox.push(record(i, 1), Some(i)).unwrap(); // a link that never answers
        }
        assert!(outbox.is_full(1));
        let mark = outbox.mark();
        outbox.push(record(100, 1), None).unwrap_err(); // refused: full, and not pushed
        let live: Vec<LinkRecord> = (200..209).map(|i| record(i, 1)).collect();
        outbox.begin_catch_up(mark, 7, live);
        assert_eq!(outbox.catch_up_last(), None, "nothing cut yet");
        outbox.push(record(300, 1), Some(300)).unwrap(); // after the snapshot: behind the live set
        let mut sent = Vec::new();
        let mut confirmed: Vec<(u64, Vec<Ticket>)> = Vec::new();
        let mut next_ack = 7;
        while outbox.unacked_records() > 0 {
            while let Some(batch) = outbox.cut() {
                sent.push((batch.sequence, batch.records.iter().map(|r| r.xid).collect::<Vec<_>>()));
            }
            // One batch acknowledged at a time.
            confirmed.push((next_ack, outbox.acknowledge(next_ack)));
            next_ack += 1;
        }
        let sequences: Vec<u64> = sent.iter().map(|(s, _)| *s).collect();
        assert_eq!(
            sequences,
            (7..7 + sequences.len() as u64).collect::<Vec<_>>(),
            "from the hello's sequence"
        );
        let order: Vec<Xid> = sent.iter().flat_map(|(_, xids)| xids.clone()).collect();
        let expected: Vec<Xid> = (200..209).chain([300]).map(|i| record(i, 1).xid).collect();
        assert_eq!(
            order, expected,
            "the live set first, then what was pushed after the mark; before it: dropped"
        );
        let last_live = sent.iter().rfind(|(_, xids)| xids.contains(&record(208, 1).xid)).unwrap().0;
        assert_eq!(outbox.catch_up_last(), Some(last_live));
        for (acked, tickets) in &confirmed {
            let earlier = tickets.iter().filter(|&&t| t < 6).count();
            assert_eq!(earlier, if *acked == last_live { 6 } else { 0 }, "batch {acked}: {tickets:?}");
        }
        let all: Vec<Ticket> = confirmed.into_iter().flat_map(|(_, t)| t).collect();
        assert!(all.contains(&300));
    }

    /// Defect 4 of issue 32: an acknowledgement on a new link released the tickets of
    /// batches cut on the previous one while the live set carrying them was on its way.
    #[test]
    fn tickets_of_an_earlier_link_wait_for_the_live_sets_last_batch() {
        let mut outbox = Outbox::new(limits(1, 1 << 20, 8));
        outbox.push(record(1, 1), Some(1)).unwrap();
        outbox.cut();
        let mark = outbox.mark();
        outbox.begin_catch_up(mark, 2, vec![record(1, 1), record(2, 1)]);
        assert_eq!(outbox.cut().map(|b| (b.sequence, b.tickets.clone())), Some((2, vec![])));
        assert_eq!(outbox.acknowledge(2), Vec::<Ticket>::new(), "the live set is not all there");
        assert_eq!(outbox.cut().map(|b| (b.sequence, b.tickets.clone())), Some((3, vec![1])));
        assert_eq!(outbox.catch_up_last(), Some(3));
        assert_eq!(outbox.acknowledge(3), vec![1]);
        // An empty live set: held tickets go with the answer to `CaughtUp`.
        outbox.push(record(4, 1), Some(4)).unwrap();
        let mark = outbox.mark();
        outbox.begin_catch_up(mark, 9, Vec::new());
        assert_eq!(outbox.catch_up_last(), Some(8));
        assert_eq!(outbox.acknowledge(8), vec![4]);
    }
}

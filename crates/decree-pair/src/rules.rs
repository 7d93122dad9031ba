//! What a pair member does, as a step machine without IO: each event changes the member's
//! [`Node`] and returns the [`Command`]s the runtime must carry out, in order.
//!
//! Not here: sockets, the log, timers. The runtime owns those and obeys the commands; in
//! particular a [`Command::PersistSeen`] must be durable before the runtime carries out any
//! command after it, since a member that forgot an epoch it had seen could accept a
//! deposed primary's records again after a restart.
//!
//! The pure predicates at the end ([`may_acknowledge`], [`may_call_rms`],
//! [`may_presume_abort`]) are the one place that says when a decision counts; the server's
//! commit path, recovery and `Outcome` ask them. A decision written or sent that
//! `may_acknowledge` does not settle yet is in doubt, never absent.

use crate::epoch::{Epoch, MemberId};

/// What a member is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Follows the primary of the member's highest seen epoch, if any; serves no client,
    /// calls no resource manager, runs no recovery. Every member starts here.
    Backup,
    /// Leads its epoch. `alone`: it acknowledges on its own write, as it does after a
    /// promotion until a backup says hello; otherwise it waits for its backup too.
    Primary { alone: bool },
}

/// How the receiver's highest seen epoch compares with a message's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// The message is of an older epoch: refused.
    Stale,
    /// The message is of the epoch the member knows.
    Current,
    /// The message is of a newer epoch: recorded durably, then acted on.
    Newer,
}

/// Compares a message's epoch with the highest the receiver has seen.
pub fn fence(seen: Epoch, incoming: Epoch) -> Fence {
    match incoming.cmp(&seen) {
        std::cmp::Ordering::Less => Fence::Stale,
        std::cmp::Ordering::Equal => Fence::Current,
        std::cmp::Ordering::Greater => Fence::Newer,
    }
}

/// A message of the replication link, without its payload (the rules need its kind and
/// sequence only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerMessage {
    /// Primary to backup: the records of one batch, numbered from 1 within the epoch.
    Batch { sequence: u64 },
    /// Primary to backup: with the batches up to `up_to`, which carried the primary's live
    /// set after the stream started, the backup holds everything the primary holds. The
    /// runtime hands it to the rules only once those batches are durable in the backup's
    /// log and what the primary does not hold was forgotten.
    CaughtUp { up_to: u64 },
    /// Backup to primary: every batch up to `sequence` is durable in the backup's log.
    Ack { sequence: u64 },
    /// When a link opens (the primary dials its backup, both say hello): from the primary,
    /// the sequence of the next batch it sends, where the backup's stream starts; from the
    /// backup, what it expects (informational: the primary always sends its live set).
    Hello { next_sequence: u64 },
    /// Either way: the peer refused a message of this member's epoch because it has seen
    /// the one this message carries. Only its epoch matters (a newer one deposes).
    Refused,
}

/// What happened to the member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The operator's `decree promote`: the peer is down, lead. `log_highest` is the
    /// highest epoch found in the member's log (in Xids' incarnations); `forced` skips the
    /// caught-up check.
    Promote { forced: bool, log_highest: Epoch },
    /// etcd elected this member to lead `epoch` (its campaign's transaction succeeded,
    /// which required the sync record to name it in sync: the election, not this member's
    /// memory of a link, says it holds every acknowledged decision).
    Elected { epoch: Epoch },
    /// A message of the replication link, tagged with its sender's epoch.
    Peer { epoch: Epoch, message: PeerMessage },
    /// The primary's backup has confirmed the live set and the stream: strict again.
    BackupCaughtUp,
    /// The member's log failed (a write or a sync): a backup no longer holds for sure what
    /// it acknowledged, so it is not caught up (not promotable without `--force`).
    LogFailed,
    /// A strict primary's backup stopped confirming and the election on etcd recorded it
    /// out of sync (`alone_after_ms`): acknowledge on the local write alone until a backup
    /// says hello again. Only after that record, which keeps the backup from taking over.
    GoAlone,
}

/// What the runtime must do, in the order given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Record durably that `Epoch` is the highest seen, before any later command.
    PersistSeen(Epoch),
    /// Record durably that this member was promoted without having caught up (the
    /// operator forced it; `decree recover` and the status show it).
    RecordForcedPromotion(Epoch),
    /// Stop leading: finish no phase two, call no resource manager, answer clients with a
    /// redirect, acknowledge nothing more.
    StepDown,
    /// Lead `Epoch`: run the recovery pass on the live set, then serve clients.
    RecoverThenServe(Epoch),
    /// Drop what the log holds beyond what the primary of `Epoch` sends, and ask it for
    /// the live set (none of what is dropped was acknowledged: a strict primary waits for
    /// its backup, and no phase two acted on an unconfirmed decision).
    Rejoin(Epoch),
    /// Append the batch through the local engine, then acknowledge it once durable.
    AppendThenAck { epoch: Epoch, sequence: u64 },
    /// Acknowledge again a batch already durable (the primary resent it).
    AckAgain { epoch: Epoch, sequence: u64 },
    /// A batch is missing (`from` was expected): close the link; the primary dials again,
    /// says hello and sends its live set, which holds whatever was missed.
    Resend { epoch: Epoch, from: u64 },
    /// The primary of `epoch` opened a link and streams from `next_sequence`: start
    /// collecting the Xids it sends, for the forgetting at the end of the catch-up.
    Join { epoch: Epoch, next_sequence: u64 },
    /// A backup opened a link: push the live set into the stream after what is already in
    /// it, then send `CaughtUp` with the last batch's sequence.
    SendLiveSet,
    /// Decisions in batches up to `sequence` are confirmed by the backup.
    ConfirmUpTo(u64),
    /// Acknowledge with the backup as well as the local write from now on: a primary
    /// running alone turns strict when a backup says hello, as the live set is taken.
    BecomeStrict,
    /// Answer the sender with this member's epoch and drop its message.
    Refuse { seen: Epoch },
    /// The message cannot come from a correct peer in this role (say, an acknowledgement
    /// to a backup): close the link and log it.
    ProtocolError,
}

/// Why a promotion was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromoteRefused {
    /// The member already leads.
    AlreadyPrimary(Epoch),
    /// The member has not caught up since it started or rejoined: it may lack
    /// acknowledged decisions (`--force` overrides, at that risk).
    NotCaughtUp { seen: Epoch },
    /// An elected epoch that is not this member's or not above every epoch it has seen.
    NotAbove { seen: Epoch, elected: Epoch },
}

impl std::fmt::Display for PromoteRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PromoteRefused::AlreadyPrimary(e) => write!(f, "this member already leads epoch {e}"),
            PromoteRefused::NotCaughtUp { seen } => write!(
                f,
                "this member has not caught up with the primary of epoch {seen} since it started or rejoined, \
                 so it may lack acknowledged decisions; promote the other member, or force it if that one's \
                 disk is lost"
            ),
            PromoteRefused::NotAbove { seen, elected } => write!(
                f,
                "the elected epoch {elected} is not this member's or not above the epoch {seen} it has seen"
            ),
        }
    }
}

/// One member of a pair, as the rules see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Node {
    /// Which member this is.
    pub member: MemberId,
    /// The highest epoch seen or minted, durable.
    pub seen: Epoch,
    /// What the member is doing.
    pub role: Role,
    /// A backup's: it holds everything the primary of `seen` holds (live set received,
    /// no batch missing) since it last started or rejoined.
    pub caught_up: bool,
    /// A backup's: the next batch sequence expected from the primary of `seen`.
    pub next_sequence: u64,
}

impl Node {
    /// A member just started: a backup that has caught up with nobody, knowing the epoch
    /// its state file holds.
    pub fn start(member: MemberId, seen: Epoch) -> Node {
        Node { member, seen, role: Role::Backup, caught_up: false, next_sequence: 1 }
    }

    /// The epoch this member leads, if it leads.
    pub fn leads(&self) -> Option<Epoch> {
        matches!(self.role, Role::Primary { .. }).then_some(self.seen)
    }

    /// Applies `event`; returns the commands in the order the runtime must carry them out.
    pub fn step(&mut self, event: Event) -> Result<Vec<Command>, PromoteRefused> {
        let commands = match event {
            Event::Promote { forced, log_highest } => self.promote(forced, log_highest)?,
            Event::Elected { epoch } => self.elected(epoch)?,
            Event::Peer { epoch, message } => self.receive(epoch, message),
            Event::BackupCaughtUp => match self.role {
                Role::Primary { alone: true } => {
                    self.role = Role::Primary { alone: false };
                    vec![Command::BecomeStrict]
                }
                Role::Primary { alone: false } => Vec::new(),
                Role::Backup => vec![Command::ProtocolError],
            },
            Event::LogFailed => {
                self.caught_up = false;
                Vec::new()
            }
            Event::GoAlone => {
                if self.role == (Role::Primary { alone: false }) {
                    self.role = Role::Primary { alone: true };
                }
                Vec::new()
            }
        };
        self.check();
        Ok(commands)
    }

    fn promote(&mut self, forced: bool, log_highest: Epoch) -> Result<Vec<Command>, PromoteRefused> {
        if let Role::Primary { .. } = self.role {
            return Err(PromoteRefused::AlreadyPrimary(self.seen));
        }
        if !self.caught_up && !forced {
            return Err(PromoteRefused::NotCaughtUp { seen: self.seen });
        }
        let epoch = Epoch::mint(self.member, &[self.seen, log_highest]);
        let mut commands = vec![Command::PersistSeen(epoch)];
        if !self.caught_up {
            commands.push(Command::RecordForcedPromotion(epoch));
        }
        commands.push(Command::RecoverThenServe(epoch));
        self.seen = epoch;
        self.role = Role::Primary { alone: true };
        self.caught_up = false;
        self.next_sequence = 1;
        Ok(commands)
    }

    fn elected(&mut self, epoch: Epoch) -> Result<Vec<Command>, PromoteRefused> {
        if let Role::Primary { .. } = self.role {
            return Err(PromoteRefused::AlreadyPrimary(self.seen));
        }
        if epoch <= self.seen || epoch.member() != Some(self.member) {
            return Err(PromoteRefused::NotAbove { seen: self.seen, elected: epoch });
        }
        self.seen = epoch;
        self.role = Role::Primary { alone: true };
        self.caught_up = false;
        self.next_sequence = 1;
        Ok(vec![Command::PersistSeen(epoch), Command::RecoverThenServe(epoch)])
    }

    fn receive(&mut self, epoch: Epoch, message: PeerMessage) -> Vec<Command> {
        let mut commands = Vec::new();
        match fence(self.seen, epoch) {
            // A refusal is never refused back: the two would answer each other forever.
            Fence::Stale if message == PeerMessage::Refused => return Vec::new(),
            // A backup says hello before it has read the primary's, which tells it of the
            // newer epoch: the live set follows that hello, so it is sent, not refused.
            Fence::Stale if self.leads().is_some() && matches!(message, PeerMessage::Hello { .. }) => {
                return self.receive_current(message)
            }
            Fence::Stale => return vec![Command::Refuse { seen: self.seen }],
            Fence::Current => {}
            Fence::Newer => {
                commands.push(Command::PersistSeen(epoch));
                if let Role::Primary { .. } = self.role {
                    commands.push(Command::StepDown);
                }
                commands.push(Command::Rejoin(epoch));
                self.seen = epoch;
                self.role = Role::Backup;
                self.caught_up = false;
                self.next_sequence = 1;
            }
        }
        commands.extend(self.receive_current(message));
        commands
    }

    /// A message of the member's own epoch.
    fn receive_current(&mut self, message: PeerMessage) -> Vec<Command> {
        let epoch = self.seen;
        match (self.role, message) {
            (_, PeerMessage::Refused) => Vec::new(),
            (Role::Backup, PeerMessage::Hello { next_sequence }) => {
                self.next_sequence = next_sequence.max(1);
                self.caught_up = false;
                vec![Command::Join { epoch, next_sequence: self.next_sequence }]
            }
            (Role::Primary { alone }, PeerMessage::Hello { .. }) => {
                // Strict from the live set's snapshot on (issue 32, defect 1): a decision
                // acknowledged alone after it would ride behind the batch `CaughtUp`
                // names, and the backup would call itself caught up without it.
                self.role = Role::Primary { alone: false };
                match alone {
                    true => vec![Command::BecomeStrict, Command::SendLiveSet],
                    false => vec![Command::SendLiveSet],
                }
            }
            (Role::Backup, PeerMessage::Batch { sequence }) if sequence == self.next_sequence => {
                self.next_sequence += 1;
                vec![Command::AppendThenAck { epoch, sequence }]
            }
            (Role::Backup, PeerMessage::Batch { sequence }) if sequence < self.next_sequence => {
                vec![Command::AckAgain { epoch, sequence }]
            }
            (Role::Backup, PeerMessage::Batch { .. }) => {
                // A batch is missing: until it is resent, this member lacks a decision
                // the primary may be waiting on, so it is not caught up.
                self.caught_up = false;
                vec![Command::Resend { epoch, from: self.next_sequence }]
            }
            (Role::Backup, PeerMessage::CaughtUp { up_to }) if up_to < self.next_sequence => {
                self.caught_up = true;
                Vec::new()
            }
            (Role::Backup, PeerMessage::CaughtUp { .. }) => {
                // The live set ends in a batch this member never received.
                self.caught_up = false;
                vec![Command::Resend { epoch, from: self.next_sequence }]
            }
            (Role::Primary { .. }, PeerMessage::Ack { sequence }) => vec![Command::ConfirmUpTo(sequence)],
            // A backup gets no acknowledgement; a primary gets no batch of its own epoch
            // (only it mints that epoch) nor a catch-up notice.
            (Role::Backup, PeerMessage::Ack { .. })
            | (Role::Primary { .. }, PeerMessage::Batch { .. } | PeerMessage::CaughtUp { .. }) => {
                vec![Command::ProtocolError]
            }
        }
    }

    /// The invariants that hold after every step.
    fn check(&self) {
        assert!(self.next_sequence >= 1, "batch sequences start at 1");
        if let Role::Primary { .. } = self.role {
            assert_eq!(self.seen.member(), Some(self.member), "a primary leads an epoch it minted");
            assert!(!self.caught_up, "caught_up is a backup's state");
        }
    }
}

/// Whether a primary may answer a decide: its own write is durable under its policy and,
/// unless it runs alone, its backup confirmed the decision. A backup acknowledges nothing.
pub fn may_acknowledge(role: Role, local_durable: bool, backup_confirmed: bool) -> bool {
    match role {
        Role::Backup => false,
        Role::Primary { alone: true } => local_durable,
        Role::Primary { alone: false } => local_durable && backup_confirmed,
    }
}

/// Whether the member may call a resource manager at all (phase two, recovery, rollback):
/// only while it leads.
pub fn may_call_rms(role: Role) -> bool {
    matches!(role, Role::Primary { .. })
}

/// Whether the member may roll back a prepared branch that has no decision (presumed
/// abort): only while it leads, and only when no decision of that transaction is in doubt.
pub fn may_presume_abort(role: Role, decision_in_doubt: bool) -> bool {
    may_call_rms(role) && !decision_in_doubt
}

#[cfg(test)]
mod tests;

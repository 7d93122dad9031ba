//! The link's network, modelled on TCP: a model, not the tokio runtime's sockets.
//!
//! A connection carries frames each way in order with a random delay (a few hundred
//! microseconds, sometimes tens of milliseconds). A partition delays every frame sent
//! during it until it heals (TCP retransmits; a short cut loses nothing), and a dial
//! made during it connects once it heals. A killed process's kernel closes its sockets:
//! the peer learns it after the frames already sent. A machine that loses power tells no
//! one: what is sent to it vanishes, and its peer learns of the loss only by sending, once
//! the machine is back (its new kernel answers with a reset); a peer that only listens
//! never learns (a half-open connection). With `chaos` on, frames are also dropped,
//! duplicated and reordered within a connection, which TCP never does.
//!
//! The frames a member has received wait in its end's inbox until the member reads them
//! (a paused or busy member reads later); each member's loop reads its inboxes
//! (`member.rs`).

use crate::world::{Event, Time, World, MS};
use decree_pair::link::LinkEnd;
use decree_pair::wire::LinkMessage;
use std::collections::{BTreeMap, VecDeque};

/// One TCP connection of the link: end 0 dialled, end 1 accepted.
#[derive(Debug)]
pub struct Conn {
    /// The members at each end.
    pub ends: [usize; 2],
    /// Each end's process life when it connected.
    pub lives: [u64; 2],
    /// Each end still holds it.
    pub open: [bool; 2],
    /// Each end's machine lost power while holding it: what reaches it vanishes.
    pub dead: [bool; 2],
    /// Something sent towards a dead end vanished (TCP keeps retransmitting it).
    pub lost: [bool; 2],
    /// Frames received by each end and not read yet.
    pub inbox: [VecDeque<LinkMessage>; 2],
    /// When the last frame towards each end arrives (frames keep their order).
    pub last_arrival: [Time; 2],
}

impl Conn {
    /// Which end `member` holds.
    pub fn end_of(&self, member: usize) -> usize {
        if self.ends[0] == member {
            0
        } else {
            assert_eq!(self.ends[1], member, "member {member} is not an end of this connection");
            1
        }
    }
}

/// The link's connections and the state of the network between the members.
#[derive(Debug)]
pub struct Network {
    /// Open connections, by id.
    pub conns: BTreeMap<u64, Conn>,
    next_id: u64,
    /// Until when the members cannot reach each other.
    pub partitioned_until: Option<Time>,
    /// Frames may be dropped, duplicated or reordered within a connection.
    pub chaos: bool,
    /// Frames dropped by chaos so far.
    pub dropped: u64,
}

impl Network {
    /// A network with no connection.
    pub fn new(chaos: bool) -> Network {
        Network { conns: BTreeMap::new(), next_id: 1, partitioned_until: None, chaos, dropped: 0 }
    }

    /// Whether the members are cut off from each other at `now`.
    pub fn partitioned(&self, now: Time) -> bool {
        self.partitioned_until.is_some_and(|until| now < until)
    }
}

/// Shortens a trace line (a batch's records are long).
pub fn shorten(line: &str) -> String {
    if line.len() <= 240 {
        return line.to_string();
    }
    let mut end = 240;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &line[..end])
}

impl World {
    /// A one-way delay on the link or between a client and a member.
    pub fn net_delay(&mut self) -> Time {
        if self.rng.chance(20) {
            self.rng.range(5 * MS, 40 * MS)
        } else {
            self.rng.range(50, 800)
        }
    }

    /// When something sent now arrives, after `delay`: past the partition's end if the
    /// network is cut.
    fn arrival(&mut self, delay: Time) -> Time {
        let base = match self.net.partitioned_until {
            Some(until) if self.now < until => until,
            _ => self.now,
        };
        base + delay
    }

    /// Opens a connection from `dialer` to `acceptor` (both running).
    pub fn connect(&mut self, dialer: usize, acceptor: usize) -> u64 {
        let id = self.net.next_id;
        self.net.next_id += 1;
        let conn = Conn {
            ends: [dialer, acceptor],
            lives: [self.members[dialer].life, self.members[acceptor].life],
            open: [true, true],
            dead: [false, false],
            lost: [false, false],
            inbox: [VecDeque::new(), VecDeque::new()],
            last_arrival: [self.now, self.now],
        };
        self.net.conns.insert(id, conn);
        id
    }

    /// Sends `frames` from `from`'s end of `conn`, in order.
    pub fn send(&mut self, conn: u64, from: usize, frames: Vec<LinkMessage>) {
        for frame in frames {
            self.send_one(conn, from, frame);
        }
    }

    fn send_one(&mut self, id: u64, from: usize, frame: LinkMessage) {
        let Some(conn) = self.net.conns.get(&id) else { return };
        let side = conn.end_of(from);
        let (other, to) = (1 - side, conn.ends[1 - side]);
        if !conn.open[side] {
            return;
        }
        if conn.dead[other] {
            // Nobody answers at the other end until its machine is back; then a reset.
            let back = self.members[to].life > conn.lives[other];
            self.net.conns.get_mut(&id).expect("present").lost[other] = true;
            if back {
                let delay = self.net_delay();
                self.after(delay, Event::Notice { conn: id, to: from });
            }
            return;
        }
        let delay = self.net_delay();
        let mut at = self.arrival(delay);
        let chaos = self.net.chaos;
        if chaos && self.rng.chance(10) {
            self.net.dropped += 1;
            let line = format!("chaos: dropped {frame:?}");
            self.note(|| shorten(&line));
            return;
        }
        let reorder = chaos && self.rng.chance(20);
        let duplicate = chaos && self.rng.chance(10);
        let conn = self.net.conns.get_mut(&id).expect("present");
        if !reorder {
            at = at.max(conn.last_arrival[other]);
            conn.last_arrival[other] = at;
        }
        if duplicate {
            self.schedule(at + 1, Event::Deliver { conn: id, to, frame: frame.clone() });
        }
        self.schedule(at, Event::Deliver { conn: id, to, frame });
    }

    /// A frame reaches `to`'s end: it waits in the inbox until the member reads it.
    pub fn deliver(&mut self, id: u64, to: usize, frame: LinkMessage) {
        let Some(conn) = self.net.conns.get_mut(&id) else { return };
        let side = conn.end_of(to);
        if conn.dead[side] {
            conn.lost[side] = true;
            // The machine is back: its new kernel answers the frame with a reset.
            let (back, from) = (self.members[to].life > conn.lives[side], conn.ends[1 - side]);
            if back && conn.open[1 - side] {
                let delay = self.net_delay();
                self.after(delay, Event::Notice { conn: id, to: from });
            }
            return;
        }
        if conn.open[side] {
            conn.inbox[side].push_back(frame);
        }
    }

    /// `member` closes its end of `conn` (its link ended, or its process exited): the
    /// other end learns it after the frames already on their way.
    pub fn close(&mut self, id: u64, member: usize) {
        let Some(conn) = self.net.conns.get_mut(&id) else { return };
        let side = conn.end_of(member);
        if !conn.open[side] {
            return;
        }
        conn.open[side] = false;
        conn.inbox[side].clear();
        let (other, to) = (1 - side, conn.ends[1 - side]);
        let after_data = conn.last_arrival[other];
        let dead = conn.dead[other];
        if !conn.open[other] {
            self.net.conns.remove(&id);
            return;
        }
        if dead {
            return;
        }
        let delay = self.net_delay();
        let at = self.arrival(delay).max(after_data);
        self.schedule(at, Event::Notice { conn: id, to });
    }

    /// `member`'s machine lost power: its ends go dark, and nobody is told.
    pub fn power_lost(&mut self, member: usize) {
        let ids: Vec<u64> = self.net.conns.keys().copied().collect();
        for id in ids {
            let conn = self.net.conns.get_mut(&id).expect("present");
            if conn.ends.contains(&member) {
                let side = conn.end_of(member);
                if conn.open[side] {
                    conn.open[side] = false;
                    conn.dead[side] = true;
                    conn.inbox[side].clear();
                }
                if !conn.open[1 - side] {
                    self.net.conns.remove(&id);
                }
            }
        }
    }

    /// `member`'s machine is back after a power loss: each peer whose frames to it were
    /// lost gets a reset (its retransmission now meets the new kernel).
    pub fn machine_back(&mut self, member: usize) {
        let mut resets = Vec::new();
        for (&id, conn) in &self.net.conns {
            if !conn.ends.contains(&member) {
                continue;
            }
            let side = conn.end_of(member);
            if conn.dead[side] && conn.lost[side] && conn.open[1 - side] {
                resets.push((id, conn.ends[1 - side]));
            }
        }
        for (id, to) in resets {
            let delay = self.net_delay();
            self.after(delay, Event::Notice { conn: id, to });
        }
    }

    /// Every connection `member` holds open (its process exits: the kernel closes them).
    pub fn conns_of(&self, member: usize) -> Vec<u64> {
        self.net
            .conns
            .iter()
            .filter(|(_, c)| c.ends.contains(&member) && c.open[c.end_of(member)])
            .map(|(&id, _)| id)
            .collect()
    }

    /// Takes the frames waiting in `member`'s end of `conn`, at most `max`.
    pub fn take_frames(&mut self, id: u64, member: usize, max: usize) -> Vec<LinkMessage> {
        let Some(conn) = self.net.conns.get_mut(&id) else { return Vec::new() };
        let side = conn.end_of(member);
        let n = conn.inbox[side].len().min(max);
        conn.inbox[side].drain(..n).collect()
    }

    /// Whether frames wait in `member`'s end of `conn`.
    pub fn has_frames(&self, id: u64, member: usize) -> bool {
        self.net.conns.get(&id).is_some_and(|c| !c.inbox[c.end_of(member)].is_empty())
    }

    /// `member` learns that the other end of `conn` closed.
    pub fn notice(&mut self, id: u64, member: usize) {
        let Some(conn) = self.net.conns.get(&id) else { return };
        let side = conn.end_of(member);
        if !conn.open[side] || conn.lives[side] != self.members[member].life {
            return;
        }
        if self.members[member].paused() {
            let at = self.members[member].paused_until.expect("paused");
            self.schedule(at, Event::Notice { conn: id, to: member });
            return;
        }
        self.link_ended(member, id, LinkEnd::Closed("the peer closed the link".into()));
    }

    /// A partition of the link for `duration`.
    pub fn partition(&mut self, duration: Time) {
        if self.net.partitioned(self.now) {
            return;
        }
        let until = self.now + duration;
        self.net.partitioned_until = Some(until);
        self.schedule(until, Event::Heal);
        self.note(|| format!("partition for {} ms", duration / MS));
    }

    /// The partition ends.
    pub fn heal(&mut self) {
        if self.net.partitioned_until.is_some_and(|until| until <= self.now) {
            self.net.partitioned_until = None;
            self.note(|| "partition healed".to_string());
        }
    }
}

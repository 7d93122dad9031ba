//! The simulation's clients (a model of an application with decree's coordinator) and the
//! member's side of their connections (a model of `connection.rs` around the server's real
//! commit path).
//!
//! A client opens a session on the member it believes leads (a backup answers
//! `NotPrimary`; it tries the other), and runs one transaction at a time: it prepares a
//! branch on each of a few databases, sometimes rolls them back itself instead of
//! deciding, else sends `Decide`; on `DecideOk` it commits its branches and sends
//! `Complete`. A decide whose answer never came (the member died, the session was lost,
//! the write failed) is unknown: the client asks `Outcome` for it later. Clients also die
//! (their prepared branches are left to the member's recovery) and disconnect.
//!
//! On the member's side a session closes only once every decide it sent was answered, as a
//! connection's writer ends only when its in-flight callbacks are gone: only then are its
//! decisions handed to recovery. A decide's answer is taken from the server's callback with
//! the member's role at that moment, for the invariants.

use crate::member::{Proc, NODE};
use crate::oracle::Ack;
use crate::rm::{Actor, BranchState};
use crate::world::{Event, Phase, Time, World, MS, SECOND};
use decree_core::{BranchRecord, Decision, Origin, Outcome, Xid};
use decree_pair::Role;
use decree_proto::Message;
use decree_server::sim_api::SimSession;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A client's request to a member.
#[derive(Debug, Clone)]
pub enum Request {
    /// Open a session.
    Hello,
    /// Decide a transaction of the session.
    Decide(Decision),
    /// Phase two is done.
    Complete(Xid),
    /// What became of a transaction?
    Outcome(Xid),
    /// The client closes its connection.
    Close,
}

/// A member's reply to a client.
#[derive(Debug, Clone)]
pub enum Reply {
    /// The session is open.
    HelloOk { incarnation: u64, session: u64, life: u64 },
    /// The member does not lead.
    NotPrimary,
    /// The decision is acknowledged.
    DecideOk(Xid),
    /// The decision was refused or its write failed.
    DecideError(Xid, String),
    /// The answer to `Outcome`.
    Outcome(Xid, Outcome),
    /// The connection is gone (the member died or stopped, or refused it).
    Lost,
}

/// A decide's answer from a server's callback, with its context.
pub struct ServerAnswer {
    member: usize,
    life: u64,
    token: u64,
    client: usize,
    xid: Xid,
    message: Message,
    role: Role,
}

/// An answer a leader's fence holds until its lease provably lives again (elected runs).
pub enum Held {
    /// A decide's answer.
    Decide(ServerAnswer),
    /// An `Outcome` answer that says more than "unknown".
    Outcome { client: usize, token: u64, xid: Xid, answer: Outcome },
}

/// Where the servers' callbacks put decide answers.
#[derive(Default, Clone)]
pub struct AnswerQueue(Arc<Mutex<Vec<ServerAnswer>>>);

/// A session on a member's side.
pub struct ServerSession {
    /// The server's session.
    pub session: SimSession,
    /// Its client.
    pub client: usize,
    /// Decides sent and not answered.
    pub in_flight: usize,
    /// The client closed its end: the session closes once nothing is in flight.
    pub closing: bool,
}

/// A client's connection to a member.
#[derive(Debug, Clone)]
pub struct ClientConn {
    /// The member.
    pub member: usize,
    /// The member's life when the client connected.
    pub member_life: u64,
    /// Names this connection in replies.
    pub token: u64,
    /// The session, once `HelloOk` came: (incarnation, session id).
    pub session: Option<(u64, u64)>,
}

/// Where a client's transaction is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnState {
    /// `Decide` sent, no answer yet.
    Deciding,
    /// `DecideOk` came: committing branch `n` next.
    Committing(usize),
}

/// A client's transaction.
#[derive(Debug, Clone)]
pub struct Txn {
    /// Its Xid.
    pub xid: Xid,
    /// Its branches: database and branch number.
    pub branches: Vec<(String, u16)>,
    /// Where it is.
    pub state: TxnState,
}

/// One client.
#[derive(Debug)]
pub struct Client {
    /// Its index.
    pub index: usize,
    /// Its process's life (a crash starts a new one).
    pub life: u64,
    /// The member it tries first.
    pub target: usize,
    /// Its connection.
    pub conn: Option<ClientConn>,
    /// Its transaction.
    pub txn: Option<Txn>,
    /// Decides whose outcome it does not know, with the questions asked so far.
    pub unknown: Vec<(Xid, u32)>,
    next_sequence: u64,
    next_token: u64,
}

/// `Outcome` questions a client asks about one transaction before it gives up.
const QUESTIONS_MAX: u32 = 8;

/// How long after a primary's shutdown began a decide its connection read before it may
/// still reach the server (`decree serve`'s reader acts on what it read, then sees the stop).
const LATE_READ: Time = 2 * MS;

/// Counts a decide answer the server holds until it is given or dropped (a stopping
/// primary exits only once none is held: `decree serve` waits for every connection).
struct AnswerHeld(Arc<AtomicUsize>);

impl AnswerHeld {
    fn new(out: Arc<AtomicUsize>) -> AnswerHeld {
        out.fetch_add(1, Ordering::Relaxed);
        AnswerHeld(out)
    }
}

impl Drop for AnswerHeld {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Client {
    /// Client `index`, not connected.
    pub fn new(index: usize) -> Client {
        Client {
            index,
            life: 1,
            target: 0,
            conn: None,
            txn: None,
            unknown: Vec::new(),
            next_sequence: 1,
            next_token: 1,
        }
    }

    /// Whether it waits for nothing (no transaction under way).
    pub fn quiet(&self) -> bool {
        self.txn.is_none()
    }

    fn token(&mut self) -> u64 {
        self.next_token += 1;
        ((self.index as u64) << 40) | (self.life << 24) | self.next_token
    }
}

impl World {
    /// A client's next move; the next one is scheduled.
    pub fn client_turn(&mut self, index: usize, life: u64) {
        if self.clients[index].life != life {
            return;
        }
        self.phase_two_step(index);
        match self.clients[index].conn.clone() {
            None => self.client_connect(index),
            Some(ClientConn { session: None, .. }) => {}
            Some(conn) => self.client_work(index, &conn),
        }
        let think = self.rng.range(1, 15) * MS;
        self.after(think, Event::ClientTurn { client: index, life });
    }

    fn client_connect(&mut self, index: usize) {
        let client = &self.clients[index];
        if self.phase == Phase::Liveness && client.unknown.is_empty() {
            return;
        }
        let member = client.target;
        let member_life = self.members[member].life;
        let token = self.clients[index].token();
        self.clients[index].conn = Some(ClientConn { member, member_life, token, session: None });
        self.send_to_member(member, index, token, Request::Hello);
    }

    fn client_work(&mut self, index: usize, conn: &ClientConn) {
        let (incarnation, session) = conn.session.expect("a session");
        if let Some(i) = (!self.clients[index].unknown.is_empty() && self.rng.chance(300))
            .then(|| self.rng.range(0, self.clients[index].unknown.len() as u64 - 1) as usize)
        {
            let client = &mut self.clients[index];
            client.unknown[i].1 += 1;
            let xid = client.unknown[i].0;
            client.unknown.retain(|(_, asked)| *asked <= QUESTIONS_MAX);
            self.send_to_member(conn.member, index, conn.token, Request::Outcome(xid));
        }
        match self.clients[index].txn.clone() {
            None if self.phase == Phase::Liveness => {}
            None if self.rng.chance(8) => self.client_crash(index),
            None if self.rng.chance(8) => {
                self.send_to_member(conn.member, index, conn.token, Request::Close);
                self.clients[index].conn = None;
            }
            None => self.client_begin(index, conn, incarnation, session),
            Some(Txn { state: TxnState::Deciding, .. }) => {}
            Some(Txn { xid, branches, state: TxnState::Committing(next) }) => {
                if next >= branches.len() {
                    self.send_to_member(conn.member, index, conn.token, Request::Complete(xid));
                    self.clients[index].txn = None;
                }
            }
        }
    }

    /// After `DecideOk` the client commits its branches, one a turn, connected or not (it
    /// knows the outcome); with no connection left to say `Complete` on, the member's
    /// recovery finishes the transaction.
    fn phase_two_step(&mut self, index: usize) {
        let Some(Txn { xid, branches, state: TxnState::Committing(next) }) = self.clients[index].txn.clone()
        else {
            return;
        };
        if next < branches.len() {
            let (rm, branch) = &branches[next];
            let _ = self.databases.finish(&xid, rm, *branch, BranchState::Committed, Actor::Client(index));
            self.clients[index].txn.as_mut().expect("a txn").state = TxnState::Committing(next + 1);
        } else if self.clients[index].conn.as_ref().is_none_or(|c| c.session.is_none()) {
            self.clients[index].txn = None;
        }
    }

    /// Starts a transaction: prepares its branches, then decides (or rolls back).
    fn client_begin(&mut self, index: usize, conn: &ClientConn, incarnation: u64, session: u64) {
        let client = &mut self.clients[index];
        let sequence = client.next_sequence;
        client.next_sequence += 1;
        let xid = Xid::decree(Origin { node: NODE, incarnation, session, sequence });
        let names = self.databases.names();
        let count = self.rng.range(1, names.len() as u64) as usize;
        let mut branches = Vec::new();
        for (branch, rm) in names.iter().take(count).enumerate() {
            if self.databases.prepare(&xid, rm, branch as u16) {
                branches.push((rm.clone(), branch as u16));
            }
        }
        if branches.len() < count || self.rng.chance(50) {
            for (rm, branch) in &branches {
                let _ =
                    self.databases.finish(&xid, rm, *branch, BranchState::RolledBack, Actor::Client(index));
            }
            return;
        }
        let records =
            branches.iter().map(|(rm, branch)| BranchRecord { rm: rm.clone(), branch: *branch }).collect();
        let decision = Decision { xid, branches: records };
        self.clients[index].txn = Some(Txn { xid, branches, state: TxnState::Deciding });
        self.send_to_member(conn.member, index, conn.token, Request::Decide(decision));
    }

    /// The client's process dies: its connection closes, it forgets everything.
    pub fn client_crash(&mut self, index: usize) {
        let client = &mut self.clients[index];
        if let Some(conn) = client.conn.take() {
            self.send_to_member(conn.member, index, conn.token, Request::Close);
        }
        let client = &mut self.clients[index];
        client.txn = None;
        client.unknown.clear();
        client.life += 1;
        let life = client.life;
        self.note(|| format!("client {index} dies"));
        let restart = self.rng.range(10, 100) * MS;
        self.after(restart, Event::ClientTurn { client: index, life });
    }

    fn send_to_member(&mut self, member: usize, client: usize, token: u64, request: Request) {
        let delay = self.net_delay();
        self.after(delay, Event::Request { member, client, token, request });
    }

    fn send_to_client(&mut self, client: usize, token: u64, reply: Reply) {
        let delay = self.net_delay();
        self.after(delay, Event::Reply { client, token, reply });
    }

    /// A client's request reaches a member.
    pub fn request(&mut self, index: usize, client: usize, token: u64, request: Request) {
        if let Some(until) = self.members[index].paused_until {
            self.schedule(until, Event::Request { member: index, client, token, request });
            return;
        }
        let (life, now) = (self.members[index].life, self.now);
        let proc = &mut self.members[index].proc;
        let p = match proc {
            Proc::Primary(p) if !p.stopping => p,
            // A connection's reader takes a decide it read before the stop after the stop
            // began (`decree serve` stops reading only between requests).
            Proc::Primary(p)
                if matches!(request, Request::Decide(_))
                    && p.sessions.contains_key(&token)
                    && now <= p.stopped_at + LATE_READ =>
            {
                p
            }
            Proc::Backup(_) if matches!(request, Request::Hello) => {
                return self.send_to_client(client, token, Reply::NotPrimary)
            }
            _ => {
                if !matches!(request, Request::Close) {
                    self.send_to_client(client, token, Reply::Lost);
                }
                return;
            }
        };
        let late = p.stopping;
        if !matches!(request, Request::Hello) && !p.sessions.contains_key(&token) {
            if !matches!(request, Request::Close) {
                self.send_to_client(client, token, Reply::Lost);
            }
            return;
        }
        match request {
            Request::Hello => {
                let session = p.server.open_session();
                let reply =
                    Reply::HelloOk { incarnation: p.server.incarnation(), session: session.id(), life };
                p.sessions.insert(token, ServerSession { session, client, in_flight: 0, closing: false });
                self.send_to_client(client, token, reply);
            }
            Request::Decide(decision) => {
                let xid = decision.xid;
                let session = p.sessions.get_mut(&token).expect("checked");
                session.in_flight += 1;
                let answer = self.answer_to(index, life, token, client, xid);
                if late {
                    self.late_decides += 1;
                    self.note(|| {
                        format!("member {} takes a decide of {xid} read before its stop", index + 1)
                    });
                }
                let Proc::Primary(p) = &self.members[index].proc else { unreachable!("a primary") };
                let session = &p.sessions[&token].session;
                let now = self.now;
                self.oracle.decide_received(now, xid);
                p.server.decide(session, decision, answer);
            }
            Request::Complete(xid) => {
                let session = &p.sessions[&token].session;
                p.server.complete(session, &xid);
            }
            Request::Outcome(xid) => {
                let answer = p.server.outcome(&xid);
                if answer != Outcome::Unknown && !self.may_act(index) {
                    return self.hold(index, Held::Outcome { client, token, xid, answer });
                }
                let now = self.now;
                self.oracle.outcome_answer(now, &self.members[index], xid, answer, &self.databases);
                self.send_to_client(client, token, Reply::Outcome(xid, answer));
            }
            Request::Close => {
                let session = p.sessions.get_mut(&token).expect("checked");
                session.closing = true;
                self.close_if_done(index, token);
            }
        }
    }

    /// The callback a decide's answer goes through: the server calls it from its commit
    /// path, with the leader's role read at that moment.
    fn answer_to(
        &self,
        member: usize,
        life: u64,
        token: u64,
        client: usize,
        xid: Xid,
    ) -> Box<dyn FnOnce(Message) + Send> {
        let Proc::Primary(p) = &self.members[member].proc else { unreachable!("a primary answers") };
        let (leader, queue) = (p.leader.clone(), self.answers.0.clone());
        let held = AnswerHeld::new(p.answers_out.clone());
        Box::new(move |message| {
            let _held = held;
            let role = leader.node().role;
            queue.lock().push(ServerAnswer { member, life, token, client, xid, message, role });
        })
    }

    /// Closes a session whose client left once no decide of it is in flight.
    fn close_if_done(&mut self, index: usize, token: u64) {
        let Proc::Primary(p) = &mut self.members[index].proc else { return };
        let Some(session) = p.sessions.get(&token) else { return };
        if !session.closing || session.in_flight > 0 {
            return;
        }
        let session = p.sessions.remove(&token).expect("present");
        p.server.close_session(&session.session);
        let life = self.members[index].life;
        self.after(MS, Event::Recovery { member: index, life, periodic: false });
    }

    /// Takes the decide answers the servers gave since the last call; whether there were any.
    pub fn take_answers(&mut self) -> bool {
        let answers = std::mem::take(&mut *self.answers.0.lock());
        let any = !answers.is_empty();
        for answer in answers {
            let member = &self.members[answer.member];
            if member.life != answer.life {
                continue;
            }
            let Proc::Primary(p) = &self.members[answer.member].proc else { continue };
            if !p.sessions.contains_key(&answer.token) {
                continue;
            }
            if matches!(answer.message, Message::DecideOk) && !self.may_act(answer.member) {
                self.hold(answer.member, Held::Decide(answer));
                continue;
            }
            let Proc::Primary(p) = &mut self.members[answer.member].proc else { continue };
            let session = p.sessions.get_mut(&answer.token).expect("checked");
            session.in_flight -= 1;
            let closing = session.closing;
            let (epoch, link_opened_at) = (p.epoch, p.link_opened_at);
            let reply = match &answer.message {
                Message::DecideOk => {
                    let now = self.now;
                    let ack = Ack {
                        member: answer.member,
                        epoch,
                        role: answer.role,
                        at: now,
                        decided_at: now,
                        link_opened_at,
                    };
                    let line = format!(
                        "member {} acknowledges {} ({:?})",
                        answer.member + 1,
                        answer.xid,
                        answer.role
                    );
                    self.note(|| line);
                    self.oracle.acknowledged_by(now, answer.xid, ack, &self.members, &self.databases);
                    self.acknowledged_at(answer.member, answer.client, answer.xid, answer.role);
                    Reply::DecideOk(answer.xid)
                }
                other => Reply::DecideError(answer.xid, format!("{other:?}")),
            };
            if closing {
                self.close_if_done(answer.member, answer.token);
            } else {
                self.send_to_client(answer.client, answer.token, reply);
            }
        }
        any
    }

    /// The fence of member `index` opened again: the answers it held go, in order.
    pub fn release_held(&mut self, index: usize) {
        if self.members[index].candidacy.held.is_empty() || !self.may_act(index) {
            return;
        }
        let held = std::mem::take(&mut self.members[index].candidacy.held);
        for one in held {
            match one {
                Held::Decide(answer) => self.answers.0.lock().push(answer),
                Held::Outcome { client, token, xid, answer } => {
                    let now = self.now;
                    self.oracle.outcome_answer(now, &self.members[index], xid, answer, &self.databases);
                    self.send_to_client(client, token, Reply::Outcome(xid, answer));
                }
            }
        }
    }

    /// A member's reply reaches a client.
    pub fn reply(&mut self, index: usize, token: u64, reply: Reply) {
        let client = &mut self.clients[index];
        if client.conn.as_ref().is_none_or(|c| c.token != token) {
            return;
        }
        match reply {
            Reply::HelloOk { incarnation, session, life } => {
                let conn = client.conn.as_mut().expect("checked");
                conn.session = Some((incarnation, session));
                conn.member_life = life;
            }
            Reply::NotPrimary => {
                client.conn = None;
                client.target = 1 - client.target;
            }
            Reply::DecideOk(xid) => {
                if let Some(txn) = client.txn.as_mut().filter(|t| t.xid == xid) {
                    txn.state = TxnState::Committing(0);
                }
            }
            Reply::DecideError(xid, _) => {
                if client.txn.as_ref().is_some_and(|t| t.xid == xid) {
                    client.txn = None;
                    client.unknown.push((xid, 0));
                }
            }
            Reply::Outcome(xid, outcome) => {
                if !matches!(outcome, Outcome::InProgress | Outcome::Unknown) {
                    client.unknown.retain(|(x, _)| *x != xid);
                }
            }
            Reply::Lost => {
                // A notice about the member's previous life (the connection's SYN reached
                // its next one, which holds the session): the connection is alive.
                let conn = client.conn.clone().expect("checked");
                let alive = self.members[conn.member].life == conn.member_life
                    && matches!(&self.members[conn.member].proc, Proc::Primary(p) if p.sessions.contains_key(&token));
                if alive {
                    return;
                }
                let client = &mut self.clients[index];
                client.conn = None;
                client.target = 1 - client.target;
                if let Some(txn) = client.txn.as_ref().filter(|t| t.state == TxnState::Deciding) {
                    client.unknown.push((txn.xid, 0));
                    client.txn = None;
                }
            }
        }
    }

    /// Member `index` died or exited: its clients learn their connection is gone (at once
    /// from a killed process's kernel, after their own timeout from a machine that lost
    /// power).
    pub fn sessions_lost(&mut self, index: usize, power_loss: bool) {
        let life = self.members[index].life;
        for client in 0..self.clients.len() {
            let Some(conn) = self.clients[client].conn.clone() else { continue };
            if conn.member != index || conn.member_life != life {
                continue;
            }
            let delay: Time = if power_loss { self.rng.range(SECOND, 3 * SECOND) } else { self.net_delay() };
            self.after(delay, Event::Reply { client, token: conn.token, reply: Reply::Lost });
        }
    }
}

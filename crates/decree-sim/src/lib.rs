//! A seeded, deterministic simulation of a decree pair, in the manner of TigerBeetle's
//! VOPR and FoundationDB's simulation: one thread steps both members, their clients, the
//! network, the disks and the resource managers in virtual time, with faults drawn from
//! one seed, and checks the pair's invariants after every step. A seed replays exactly.
//!
//! **Real** (the code `decree serve` runs, called through `decree_server::sim_api`): the
//! pair's rules, epochs, outbox and replica (`decree-pair`); both ends of the link as
//! their sans-IO steps (`Leader::on_frame`/`poll_send`, `Follower::on_frame`/
//! `on_durable`); the `PAIR` state file and the outcome memory on each member's fault
//! storage (`decree_log::testing::fault`: what was synced survives a power loss, the rest
//! is lost or torn); the server's state, commit path (`commit_decision`, `PrimaryLink`'s
//! pending and overflow logic), promotion (`pair::lead`, `pair::follow`), deposition,
//! outcome rule and recovery passes (`decree-core`'s engine).
//!
//! **Modelled** (see each module): the log engine ([`disk`], the engines' contract over
//! the fault storage), the network ([`net`]: TCP connections with delay, partitions,
//! resets, half-open ends, and optionally drops, duplicates and reordering), the loops
//! around the sans-IO steps (the leader's dialling, the follower's accept loop and
//! backlog, the recovery thread's schedule, the connections' session close, a member's
//! shutdown: [`member`], [`net`]), the resource managers ([`rm`]), the clients
//! ([`client`]), the operator and the faults ([`nemesis`]).
//!
//! The invariants ([`oracle`]): an acknowledged decision is held by every member that says
//! it has caught up; a decision acknowledged in strict mode is durable (or received) on
//! the backup at that moment; only a leading member acknowledges; no Xid has a branch
//! committed and another rolled back, nor a `DecideOk` with a rolled-back branch; every
//! `Outcome` answer agrees with what was acknowledged and done; after the faults stop the
//! pair returns to strict with every branch finished (liveness). A run is a safety phase
//! with faults, then a liveness phase without them.
//!
//! **Elected** seeds ([`Scenario::elected`], issue 33) replace the operator with decree-pair's
//! model of etcd ([`etcd`]: leases on the simulated clock, requests delayed, lost or cut
//! off, member clocks drifting within ±1 %) and each member's part in the election
//! ([`election`]: run ids, leases, campaigns, `record_sync`, stepping down, and the
//! `lease_alive` fence on every act); each rule can be broken on purpose ([`Break`]), and
//! in `received` seeds a crash point ([`nemesis::CrashPoint`]) plays the sequence the run
//! id rule guards against, which random faults almost never line up.
//!
//! Not here: races between locks inside one process (the live-set snapshot against a
//! session's close, `persist_seen` against `promote`), which are loom's or shuttle's.

pub mod client;
pub mod disk;
pub mod election;
pub mod etcd;
pub mod member;
pub mod nemesis;
pub mod net;
pub mod oracle;
pub mod rm;
pub mod rng;
pub mod world;

pub use etcd::Break;
pub use oracle::{Invariant, Violation};
pub use world::{run, run_scenario, Report, Scenario};

//! The election's rules against the model of etcd: the sequences of issue 33 (a new pair, a
//! failover, a restarted backup, a late out-of-sync write, an alone primary whose lease
//! lapsed, etcd's data lost) and the lease's fence.

use super::model::Etcd;
use super::*;
use std::time::Duration;

const SECOND: u64 = 1_000_000_000;
const TTL: u64 = SECOND;

fn keys() -> Keys {
    Keys::new("/decree/", "orders")
}

fn m(id: u8) -> MemberId {
    MemberId::new(id).unwrap()
}

/// What a member reads of its pair's keys at `now`.
fn view(etcd: &mut Etcd, now: u64) -> View {
    let k = keys();
    let read = |etcd: &mut Etcd, key: &str| etcd.get(now, key);
    let leader = read(etcd, &k.leader);
    let sync = read(etcd, &k.sync);
    let counter = read(etcd, &k.epoch);
    View {
        leader: Read {
            value: leader.as_ref().map(|e| from_json(&k.leader, &e.value).unwrap()),
            mod_revision: leader.map_or(0, |e| e.mod_revision),
        },
        sync: Read {
            value: sync.as_ref().map(|e| from_json(&k.sync, &e.value).unwrap()),
            mod_revision: sync.map_or(0, |e| e.mod_revision),
        },
        counter: Read {
            value: counter.as_ref().map(|e| e.value.parse().unwrap()),
            mod_revision: counter.map_or(0, |e| e.mod_revision),
        },
        pause: {
            let pause = read(etcd, &k.pause);
            Read {
                value: pause.as_ref().map(|e| from_json(&k.pause, &e.value).unwrap()),
                mod_revision: pause.map_or(0, |e| e.mod_revision),
            }
        },
    }
}

fn candidate(etcd: &mut Etcd, now: u64, id: u8, run: &str, highest: Epoch) -> Candidate {
    Candidate { member: m(id), run: run.into(), lease: etcd.grant(now, TTL), highest, prepared: Epoch::NONE }
}

/// `me` campaigns at `now`: the epoch it leads, or why not.
fn campaign_at(etcd: &mut Etcd, now: u64, me: &Candidate) -> Result<Epoch, NotNow> {
    let (txn, epoch) = campaign(&view(etcd, now), me, &keys())?;
    assert!(etcd.txn(now, &txn), "nobody moved between the read and the transaction");
    Ok(epoch)
}

fn sync_record(etcd: &mut Etcd, now: u64) -> SyncRecord {
    from_json(&keys().sync, &etcd.get(now, &keys().sync).expect("a sync record").value).unwrap()
}

fn leader_of(epoch: Epoch, run: &str) -> Leader {
    Leader { member: epoch.member().unwrap().get(), run: run.into(), epoch: epoch.raw() }
}

#[test]
fn a_new_pair_is_led_by_the_first_fresh_member_and_the_second_is_told_who_leads() {
    let mut etcd = Etcd::default();
    let a = candidate(&mut etcd, 0, 1, "run-a", Epoch::NONE);
    let b = candidate(&mut etcd, 0, 2, "run-b", Epoch::NONE);
    let epoch = campaign_at(&mut etcd, 0, &a).unwrap();
    assert_eq!(epoch.to_string(), "1.1");
    assert_eq!(campaign_at(&mut etcd, 0, &b), Err(NotNow::Led(1, epoch)));
    assert_eq!(
        sync_record(&mut etcd, 0),
        SyncRecord {
            epoch: epoch.raw(),
            members: vec![InSync { member: 1, run: "run-a".into() }],
            since: Some(Epoch::NONE.raw())
        }
    );
    assert_eq!(etcd.get(0, &keys().epoch).unwrap().value, "1");
    assert_eq!(
        etcd.get(0, &keys().leader).unwrap().lease,
        Some(a.lease),
        "the leader key lives with its lease"
    );
}

#[test]
fn two_members_campaigning_from_the_same_view_elect_one() {
    let mut etcd = Etcd::default();
    let a = candidate(&mut etcd, 0, 1, "run-a", Epoch::NONE);
    let b = candidate(&mut etcd, 0, 2, "run-b", Epoch::NONE);
    let seen = view(&mut etcd, 0);
    let (txn_a, _) = campaign(&seen, &a, &keys()).unwrap();
    let (txn_b, _) = campaign(&seen, &b, &keys()).unwrap();
    assert!(etcd.txn(0, &txn_b));
    assert!(!etcd.txn(0, &txn_a), "the second transaction finds the keys moved");
    assert_eq!(view(&mut etcd, 0).leader.value.unwrap().member, 2);
}

#[test]
fn the_in_sync_backup_takes_over_when_the_leaders_lease_expires_with_a_higher_epoch() {
    let mut etcd = Etcd::default();
    let a = candidate(&mut etcd, 0, 1, "run-a", Epoch::NONE);
    let one = campaign_at(&mut etcd, 0, &a).unwrap();
    let b = candidate(&mut etcd, 0, 2, "run-b", Epoch::NONE);
    assert_eq!(campaign_at(&mut etcd, 0, &b), Err(NotNow::Led(1, one)));
    // The backup caught up: the leader records it.
    let backup = InSync { member: 2, run: "run-b".into() };
    assert!(etcd.txn(0, &record_sync(&keys(), &leader_of(one, "run-a"), a.lease, Some(backup))));
    // The leader dies: no keepalive; the backup's lease is kept alive.
    assert!(etcd.keep_alive(b.lease, TTL / 2, TTL));
    let later = TTL + 1;
    assert!(etcd.keep_alive(b.lease, later, TTL));
    let two = campaign_at(&mut etcd, later, &b).unwrap();
    assert_eq!(two.to_string(), "2.2");
    assert_eq!(
        sync_record(&mut etcd, later).members,
        vec![InSync { member: 2, run: "run-b".into() }],
        "alone at first"
    );
}

/// A switchover: the leader hands over to its in-sync backup, which alone may campaign
/// (the old leader, back as a backup with its log holding the epoch, may not race it),
/// and a leader whose lease no longer holds the key hands nothing over.
#[test]
fn a_switchover_lets_the_in_sync_backup_alone_take_the_lead_at_once() {
    let mut etcd = Etcd::default();
    let a = candidate(&mut etcd, 0, 1, "run-a", Epoch::NONE);
    let one = campaign_at(&mut etcd, 0, &a).unwrap();
    let b = candidate(&mut etcd, 0, 2, "run-b", Epoch::NONE);
    let backup = InSync { member: 2, run: "run-b".into() };
    assert!(etcd.txn(0, &record_sync(&keys(), &leader_of(one, "run-a"), a.lease, Some(backup.clone()))));
    // A stranger's lease hands nothing over.
    let stranger = etcd.grant(0, TTL);
    assert!(!etcd.txn(0, &hand_over(&keys(), &leader_of(one, "run-a"), stranger, backup.clone())));
    assert!(etcd.get(0, &keys().leader).is_some());
    assert!(etcd.txn(0, &hand_over(&keys(), &leader_of(one, "run-a"), a.lease, backup.clone())));
    assert!(etcd.get(0, &keys().leader).is_none(), "the leader key goes with the handover");
    // The old leader, its lease still alive and its log holding epoch 1.1, does not race
    // the backup: the backup campaigns first.
    let again = Candidate { highest: one, ..a.clone() };
    assert_eq!(campaign_at(&mut etcd, 0, &again), Err(NotNow::HandedOver(2)));
    let record = sync_record(&mut etcd, 0);
    assert_eq!(record.handed_to(), Some(2));
    assert_eq!(record.members[1], InSync { member: 1, run: "run-a".into() }, "the old leader named after it");
    let two = campaign_at(&mut etcd, 0, &b).unwrap();
    assert_eq!(two.to_string(), "2.2");
    // A late handover of the old leader (it holds no key now) changes nothing.
    assert!(!etcd.txn(0, &hand_over(&keys(), &leader_of(one, "run-a"), a.lease, backup)));
    assert_eq!(sync_record(&mut etcd, 0).epoch, two.raw());
}

/// A switchover to a backup whose process died after its last acknowledgement (simulator
/// finding 16): the backup never campaigns; once its turn is over the old leader, in its
/// same process or a new one (its log holds the epoch), may lead again; the backup's next
/// process, out of sync, may not; nor may a member whose log lost the epoch.
#[test]
fn the_old_leader_leads_again_when_the_backup_it_handed_over_to_never_campaigns() {
    let mut etcd = Etcd::default();
    let a = candidate(&mut etcd, 0, 1, "run-a", Epoch::NONE);
    let one = campaign_at(&mut etcd, 0, &a).unwrap();
    let backup = InSync { member: 2, run: "run-b".into() };
    assert!(etcd.txn(0, &record_sync(&keys(), &leader_of(one, "run-a"), a.lease, Some(backup.clone()))));
    assert!(etcd.txn(0, &hand_over(&keys(), &leader_of(one, "run-a"), a.lease, backup)));
    // The backup's next process, not the one in sync, may not lead at any time.
    let b_next = candidate(&mut etcd, 0, 2, "run-b2", one);
    let v = view(&mut etcd, 0);
    assert_eq!(campaign_after_turn(&v, &b_next, &keys()).map(|t| t.1), Err(NotNow::OutOfSync(one)));
    // The old leader's next process whose disk was lost (its log knows no epoch) may not.
    let a_lost = candidate(&mut etcd, 0, 1, "run-a2", Epoch::NONE);
    assert_eq!(campaign_after_turn(&v, &a_lost, &keys()).map(|t| t.1), Err(NotNow::OutOfSync(one)));
    // The old leader's next process, its log holding 1.1, during the backup's turn and after.
    let a_next = candidate(&mut etcd, 0, 1, "run-a2", one);
    assert_eq!(campaign(&v, &a_next, &keys()).map(|t| t.1), Err(NotNow::HandedOver(2)));
    let (txn, two) = campaign_after_turn(&v, &a_next, &keys()).unwrap();
    assert!(etcd.txn(0, &txn));
    assert_eq!(two.to_string(), "2.1");
    assert_eq!(sync_record(&mut etcd, 0).handed_to(), None, "an ordinary record again");
}

/// A campaign whose answer was lost (and the read after it): the leader key names the
/// campaigner's process, which must lead the epoch it won; another process of the same
/// member, or the other member, has won nothing.
#[test]
fn a_campaign_whose_answer_was_lost_is_known_won_by_the_leader_key() {
    let mut etcd = Etcd::default();
    let a = candidate(&mut etcd, 0, 1, "run-a", Epoch::NONE);
    let (txn, epoch) = campaign(&view(&mut etcd, 0), &a, &keys()).unwrap();
    assert_eq!(won(&view(&mut etcd, 0), m(1), "run-a"), None, "nothing sent yet");
    assert!(etcd.txn(0, &txn), "applied; its answer is lost");
    let v = view(&mut etcd, 0);
    assert_eq!(
        campaign(&v, &a, &keys()).map(|t| t.1),
        Err(NotNow::Led(1, epoch)),
        "the rules alone see a leader"
    );
    assert_eq!(won(&v, m(1), "run-a"), Some(epoch));
    assert_eq!(won(&v, m(1), "run-a2"), None, "another process of the member won nothing");
    assert_eq!(won(&v, m(2), "run-a"), None);
}

/// A maintenance pause: the in-sync backup does not take over while it stands, even once
/// the leader's lease lapsed; a pause written between a campaign's read and its
/// transaction makes the transaction fail; after the resume the backup takes over.
#[test]
fn no_member_campaigns_while_failover_is_paused() {
    let mut etcd = Etcd::default();
    let a = candidate(&mut etcd, 0, 1, "run-a", Epoch::NONE);
    let one = campaign_at(&mut etcd, 0, &a).unwrap();
    let b = candidate(&mut etcd, 0, 2, "run-b", Epoch::NONE);
    let backup = InSync { member: 2, run: "run-b".into() };
    assert!(etcd.txn(0, &record_sync(&keys(), &leader_of(one, "run-a"), a.lease, Some(backup))));
    let read_before_the_pause = view(&mut etcd, 0);
    let pause = Op::Put { key: keys().pause, value: to_json(&Pause { by: 1, at_unix_ms: 5 }), lease: None };
    assert!(etcd.txn(0, &Txn { compares: vec![], ops: vec![pause] }));
    etcd.revoke(a.lease);
    assert_eq!(campaign_at(&mut etcd, 0, &b), Err(NotNow::Paused(1)));
    // A campaign from a view read before the pause fails at etcd.
    let mut stale = read_before_the_pause;
    stale.leader = Read::absent();
    let (txn, _) = campaign(&stale, &b, &keys()).unwrap();
    assert!(!etcd.txn(0, &txn), "the pause is compared absent");
    assert!(etcd.get(0, &keys().leader).is_none(), "nobody leads while paused");
    assert!(etcd.txn(0, &Txn { compares: vec![], ops: vec![Op::Delete(keys().pause)] }));
    assert_eq!(campaign_at(&mut etcd, 0, &b).unwrap().to_string(), "2.2");
}

#[test]
fn the_new_epoch_is_above_the_members_own_highest_epoch() {
    let mut etcd = Etcd::default();
    // A member whose log holds 7.2 (a forced promotion etcd never recorded) leads a new
    // pair's first epoch above it, so that 7.2's Xids are an older incarnation's to it.
    let a = candidate(&mut etcd, 0, 1, "run-a", Epoch::NONE);
    campaign_at(&mut etcd, 0, &a).unwrap();
    let b = candidate(&mut etcd, 0, 2, "run-b", epoch_of(7, m(2)));
    let backup = InSync { member: 2, run: "run-b".into() };
    assert!(etcd.txn(0, &record_sync(&keys(), &leader_of(epoch_of(1, m(1)), "run-a"), a.lease, Some(backup))));
    etcd.revoke(a.lease);
    assert_eq!(campaign_at(&mut etcd, 0, &b).unwrap().to_string(), "8.2");
}

#[test]
fn a_restarted_backup_is_out_of_sync_until_recorded_again() {
    let mut etcd = Etcd::default();
    let a = candidate(&mut etcd, 0, 1, "run-a", Epoch::NONE);
    let one = campaign_at(&mut etcd, 0, &a).unwrap();
    let backup = InSync { member: 2, run: "run-b".into() };
    assert!(etcd.txn(0, &record_sync(&keys(), &leader_of(one, "run-a"), a.lease, Some(backup))));
    etcd.revoke(a.lease);
    // The backup restarted (in `received` mode it lost what it acknowledged from memory).
    let b = candidate(&mut etcd, 0, 2, "run-b2", Epoch::NONE);
    assert_eq!(campaign_at(&mut etcd, 0, &b), Err(NotNow::OutOfSync(one)));
    assert!(etcd.get(0, &keys().leader).is_none(), "nobody leads: the operator decides");
}

/// The bug this rule prevents: a primary paused past its lease lands a late "backup out of
/// sync" after the backup took over, then goes alone and acknowledges decisions the new
/// primary will presume aborted.
#[test]
fn a_late_out_of_sync_write_of_a_deposed_leader_is_refused() {
    let mut etcd = Etcd::default();
    let a = candidate(&mut etcd, 0, 1, "run-a", Epoch::NONE);
    let one = campaign_at(&mut etcd, 0, &a).unwrap();
    let backup = InSync { member: 2, run: "run-b".into() };
    assert!(etcd.txn(0, &record_sync(&keys(), &leader_of(one, "run-a"), a.lease, Some(backup))));
    let b = candidate(&mut etcd, 0, 2, "run-b", Epoch::NONE);
    let later = TTL + 1; // A was paused past its lease.
    assert!(etcd.keep_alive(b.lease, TTL / 2, TTL));
    assert!(etcd.keep_alive(b.lease, later, TTL));
    let two = campaign_at(&mut etcd, later, &b).unwrap();
    // A resumes and records its backup out of sync, to go alone.
    let late = record_sync(&keys(), &leader_of(one, "run-a"), a.lease, None);
    assert!(!etcd.txn(later, &late), "the leader key is not A's any more");
    assert_eq!(sync_record(&mut etcd, later).epoch, two.raw());
    // Even with a fresh lease: the leader key holds B's.
    let fresh = etcd.grant(later, TTL);
    assert!(!etcd.txn(later, &record_sync(&keys(), &leader_of(one, "run-a"), fresh, None)));
}

#[test]
fn a_primary_alone_whose_lease_lapsed_can_lead_again_and_its_out_of_sync_backup_cannot() {
    let mut etcd = Etcd::default();
    let a = candidate(&mut etcd, 0, 1, "run-a", Epoch::NONE);
    let one = campaign_at(&mut etcd, 0, &a).unwrap();
    // The link was cut: the leader records itself alone, then acknowledges alone.
    assert!(etcd.txn(0, &record_sync(&keys(), &leader_of(one, "run-a"), a.lease, None)));
    let b = candidate(&mut etcd, 0, 2, "run-b", Epoch::NONE);
    let later = TTL + 1;
    assert!(etcd.keep_alive(b.lease, TTL / 2, TTL));
    assert!(etcd.keep_alive(b.lease, later, TTL));
    assert_eq!(
        campaign_at(&mut etcd, later, &b),
        Err(NotNow::OutOfSync(one)),
        "B lacks what A acknowledged alone"
    );
    // A returns (the same process, paused past its lease): still named, it leads again.
    let again = Candidate { lease: etcd.grant(later, TTL), ..a.clone() };
    assert_eq!(campaign_at(&mut etcd, later, &again).unwrap().to_string(), "2.1");
}

#[test]
fn the_recorded_leader_leads_again_from_a_new_process_unless_its_disk_forgot_the_epoch() {
    let mut etcd = Etcd::default();
    let a = candidate(&mut etcd, 0, 1, "run-a", Epoch::NONE);
    let one = campaign_at(&mut etcd, 0, &a).unwrap();
    // As it starts serving, the leader writes the record again: its log now holds `one`.
    assert!(etcd.txn(0, &record_sync(&keys(), &leader_of(one, "run-a"), a.lease, None)));
    let later = TTL + 1;
    // A's process died while it led alone; its disk was lost: a blank member 1 knows no
    // epoch, so the record's leadership is not its to take.
    let blank = candidate(&mut etcd, later, 1, "run-a3", Epoch::NONE);
    assert_eq!(campaign_at(&mut etcd, later, &blank), Err(NotNow::OutOfSync(one)));
    // Nor when the databases still hold branches it prepared in `one` (the decisions it
    // acknowledged and lost with its disk): they raise the epoch minted, never what its
    // log is taken to hold (the simulator's finding 18, seed 121).
    let blank = Candidate { prepared: one, ..blank };
    assert_eq!(campaign_at(&mut etcd, later, &blank), Err(NotNow::OutOfSync(one)));
    // A restarted over its log, which holds epoch `one`: it leads again, above it.
    let restarted = candidate(&mut etcd, later, 1, "run-a2", one);
    let prepared_above = epoch_of(3, m(2));
    let restarted = Candidate { prepared: prepared_above, ..restarted };
    assert_eq!(
        campaign_at(&mut etcd, later, &restarted).unwrap().to_string(),
        "4.1",
        "above the newest prepared incarnation (defect 14)"
    );
    assert_eq!(sync_record(&mut etcd, later).since, Some(one.raw()), "its log holds `one`, not 3.2");
    // The rule is the leader's only: member 2 named nowhere, with every epoch, may not.
    let two = epoch_of(4, m(1));
    let b = candidate(&mut etcd, 3 * TTL, 2, "run-b", two);
    assert_eq!(campaign_at(&mut etcd, 3 * TTL, &b), Err(NotNow::OutOfSync(two)));
}

#[test]
fn a_member_with_an_epoch_finding_no_records_leaves_the_choice_to_the_operator() {
    let mut etcd = Etcd::default();
    let a = candidate(&mut etcd, 0, 1, "run-a", epoch_of(3, m(1)));
    assert_eq!(campaign_at(&mut etcd, 0, &a), Err(NotNow::RecordsLost(epoch_of(3, m(1)))));
    assert!(etcd.get(0, &keys().leader).is_none());
}

#[test]
fn inconsistent_or_unreadable_records_are_named() {
    let k = keys();
    let sync = SyncRecord {
        epoch: epoch_of(4, m(1)).raw(),
        members: vec![InSync { member: 2, run: "r".into() }],
        since: None,
    };
    let v = View {
        leader: Read::absent(),
        sync: Read { value: Some(sync), mod_revision: 5 },
        counter: Read { value: Some(3), mod_revision: 6 },
        pause: Read::absent(),
    };
    let me =
        Candidate { member: m(2), run: "r".into(), lease: 1, highest: Epoch::NONE, prepared: Epoch::NONE };
    let e = campaign(&v, &me, &k).unwrap_err().to_string();
    assert!(e.contains("epoch 4.1") && e.contains("counter is at 3"), "{e}");
    let e = from_json::<SyncRecord>(&k.sync, "{\"epoch\":1}").unwrap_err().to_string();
    assert!(e.contains("/decree/orders/sync") && e.contains("members"), "{e}");
}

#[test]
fn a_lease_is_alive_only_within_its_ttl_less_the_margin_from_when_its_keepalive_was_sent() {
    let margin = SECOND / 5;
    for (sent, now, alive) in [
        (0, 0, true),
        (0, TTL - margin - 1, true),
        (0, TTL - margin, false),
        (0, TTL, false),
        (10 * SECOND, 10 * SECOND + SECOND / 2, true),
        (10 * SECOND, 9 * SECOND, false), // a clock that went back proves nothing
    ] {
        assert_eq!(lease_alive(sent, TTL, margin, now), alive, "sent {sent}, now {now}");
    }
    assert!(!lease_alive(0, margin, margin, 0), "a margin as long as the TTL leaves nothing");
}

#[test]
fn the_keys_sit_under_the_prefix_and_the_pair() {
    let k = keys();
    assert_eq!(
        (k.leader.as_str(), k.sync.as_str(), k.epoch.as_str(), k.member(m(2))),
        (
            "/decree/orders/leader",
            "/decree/orders/sync",
            "/decree/orders/epoch",
            "/decree/orders/members/2".to_string()
        )
    );
}

#[test]
fn a_forced_epoch_is_recorded_when_etcd_returns_unless_a_newer_one_exists() {
    let mut etcd = Etcd::default();
    let a = candidate(&mut etcd, 0, 1, "run-a", Epoch::NONE);
    let one = campaign_at(&mut etcd, 0, &a).unwrap();
    // etcd is unreachable; the operator forces member 2 to lead epoch 2.2. etcd returns
    // with member 1's leader key still under its (not yet expired) lease.
    let forced = epoch_of(2, m(2));
    let b = candidate(&mut etcd, TTL / 2, 2, "run-b", forced);
    let txn = record_forced(&view(&mut etcd, TTL / 2), &b, forced, &keys()).unwrap();
    assert!(etcd.txn(TTL / 2, &txn));
    let leader: Leader =
        from_json(&keys().leader, &etcd.get(TTL / 2, &keys().leader).unwrap().value).unwrap();
    assert_eq!((leader.member, Epoch::from_raw(leader.epoch)), (2, forced), "the stale key is replaced");
    assert_eq!(sync_record(&mut etcd, TTL / 2).epoch, forced.raw());
    // Member 1's late sync write is refused: the leader key is no longer under its lease.
    assert!(!etcd.txn(TTL / 2, &record_sync(&keys(), &leader_of(one, "run-a"), a.lease, None)));
    // A forced epoch below one minted meanwhile steps down instead.
    let older = epoch_of(1, m(2));
    assert_eq!(record_forced(&view(&mut etcd, TTL / 2), &b, older, &keys()), Err(NotNow::Led(2, forced)));
    etcd.revoke(b.lease);
    assert_eq!(record_forced(&view(&mut etcd, TTL / 2), &b, older, &keys()), Err(NotNow::Superseded(2)));
}

/// Issue 33's simulator, finding 15 (seeds 221, 483, ... of its census): a member wins
/// a campaign and dies before recording the epoch in `PAIR`. Before the fix, etcd named it
/// alone for an epoch its log never saw: it was refused as a member whose disk was lost, the
/// other member was not named, and nobody could lead.
#[test]
fn a_member_that_won_and_died_before_recording_the_epoch_can_lead_again() {
    let mut etcd = Etcd::default();
    let a = candidate(&mut etcd, 0, 1, "run-a", Epoch::NONE);
    let one = campaign_at(&mut etcd, 0, &a).unwrap();
    assert!(etcd.txn(0, &record_sync(&keys(), &leader_of(one, "run-a"), a.lease, None)));
    // Member 2 takes over (A's lease lapsed, 2 was recorded in sync), and dies at once.
    let b = candidate(&mut etcd, 0, 2, "run-b", one);
    assert!(etcd.txn(
        0,
        &record_sync(
            &keys(),
            &leader_of(one, "run-a"),
            a.lease,
            Some(InSync { member: 2, run: "run-b".into() })
        )
    ));
    let later = TTL + 1;
    assert!(etcd.keep_alive(b.lease, TTL / 2, TTL) && etcd.keep_alive(b.lease, later, TTL));
    let two = campaign_at(&mut etcd, later, &b).unwrap();
    assert_eq!(sync_record(&mut etcd, later).since, Some(one.raw()), "B's log holds 1.1, not yet 2.2");
    // B's new process: its PAIR never recorded 2.2, its log holds 1.1 as the record says.
    let again = 3 * TTL;
    let restarted = candidate(&mut etcd, again, 2, "run-b2", one);
    assert_eq!(campaign_at(&mut etcd, again, &restarted).unwrap(), epoch_of(3, m(2)), "above {two}");
    // A member below what the record says (a lost disk) is still refused.
    let three = epoch_of(3, m(2));
    assert!(
        etcd.txn(again + TTL / 2, &record_sync(&keys(), &leader_of(three, "run-b2"), restarted.lease, None))
    );
    etcd.revoke(restarted.lease);
    let blank = candidate(&mut etcd, 5 * TTL, 2, "run-b3", Epoch::NONE);
    assert_eq!(campaign_at(&mut etcd, 5 * TTL, &blank), Err(NotNow::OutOfSync(three)));
}

/// `decree status --etcd`'s reading: each pair under the prefix with its leader, sync
/// record, counter, registered members and pause; what does not parse is named; keys of
/// another prefix or of no pair are ignored.
#[test]
fn the_cluster_view_groups_the_keys_by_pair_and_names_what_does_not_parse() {
    let leader = Leader { member: 2, run: "r2".into(), epoch: epoch_of(3, m(2)).raw() };
    let registration = Registration { run: "r1".into(), link: "l".into(), clients: "c".into() };
    let change = LeaderChange { member: 2, epoch: leader.epoch, at_unix_ms: 9, vacant_ms: Some(120) };
    let entries: Vec<(String, String)> = vec![
        ("/decree/orders/leader".into(), to_json(&leader)),
        ("/decree/orders/epoch".into(), "3".into()),
        ("/decree/orders/members/1".into(), to_json(&registration)),
        ("/decree/orders/pause".into(), to_json(&Pause { by: 1, at_unix_ms: 7 })),
        ("/decree/orders/last_change".into(), to_json(&change)),
        ("/decree/orders/lag".into(), to_json(&lag(2, 5))),
        // A stepped-down leader's report, its lease still alive: not the leader's, not shown.
        ("/decree/stock/lag".into(), to_json(&lag(1, 5))),
        ("/decree/stock/epoch".into(), "x".into()),
        ("/decree/stock/sync".into(), "{".into()),
        ("/decree/stray".into(), "1".into()),
        ("/other/orders/leader".into(), "{}".into()),
    ];
    let views = cluster("/decree/", &entries);
    assert_eq!(views.len(), 2, "{views:?}");
    let orders = &views[0];
    assert_eq!(
        (orders.pair.as_str(), orders.leader.as_ref(), orders.epoch_count),
        ("orders", Some(&leader), Some(3))
    );
    assert_eq!(orders.members.get(&1), Some(&registration));
    assert_eq!(orders.pause, Some(Pause { by: 1, at_unix_ms: 7 }));
    assert_eq!(orders.last_change, Some(change));
    assert_eq!(orders.lag, Some(lag(2, 5)));
    assert!(orders.unreadable.is_empty() && orders.sync.is_none());
    let stock = &views[1];
    assert_eq!(stock.unreadable.len(), 2, "{:?}", stock.unreadable);
    assert!(stock.unreadable.iter().any(|e| e.contains("/decree/stock/epoch")), "{:?}", stock.unreadable);
    assert_eq!(stock.lag, None, "no leader: no lag shown");
}

/// The last change of leader is written only by the member whose lease holds the leader
/// key: a deposed leader's late write fails and names nobody.
#[test]
fn only_the_leader_holding_the_key_records_the_change_of_leader() {
    let mut etcd = Etcd::default();
    let a = candidate(&mut etcd, 0, 1, "run-a", Epoch::NONE);
    let one = campaign_at(&mut etcd, 0, &a).unwrap();
    let change = LeaderChange { member: 1, epoch: one.raw(), at_unix_ms: 5, vacant_ms: None };
    let stranger = etcd.grant(0, TTL);
    assert!(!etcd.txn(0, &record_leader_change(&keys(), stranger, &change)), "another lease records nothing");
    assert!(etcd.txn(0, &record_leader_change(&keys(), a.lease, &change)));
    etcd.revoke(a.lease);
    assert!(
        !etcd.txn(0, &record_leader_change(&keys(), a.lease, &change)),
        "a deposed leader records nothing"
    );
}

/// `decree recover` on a stopped member's log: refused while anyone leads or another member
/// runs; allowed alone only when the sync record names this member for the latest epoch.
#[test]
fn a_hand_resolution_is_alone_only_with_no_leader_no_other_member_and_this_one_in_sync() {
    let two = epoch_of(2, m(1));
    let sync =
        SyncRecord { epoch: two.raw(), members: vec![InSync { member: 1, run: "r1".into() }], since: None };
    let alone =
        PairView { pair: "p".into(), sync: Some(sync.clone()), epoch_count: Some(2), ..Default::default() };
    assert_eq!(hand_resolution(&alone, 1, two.raw()), HandResolution::Alone);
    let led = PairView { leader: Some(leader_of(epoch_of(3, m(2)), "r2")), ..alone.clone() };
    assert_eq!(
        hand_resolution(&led, 1, two.raw()),
        HandResolution::Led { member: 2, epoch: epoch_of(3, m(2)).raw() }
    );
    let mut running = alone.clone();
    running.members.insert(2, Registration { run: "r2".into(), link: "l".into(), clients: "c".into() });
    assert!(
        matches!(hand_resolution(&running, 1, two.raw()), HandResolution::Unproven(why) if why.contains("member 2"))
    );
    assert!(
        matches!(hand_resolution(&alone, 2, two.raw()), HandResolution::Unproven(_)),
        "member 2 is not in sync"
    );
    let newer_count = PairView { epoch_count: Some(3), ..alone.clone() };
    assert!(
        matches!(hand_resolution(&newer_count, 1, two.raw()), HandResolution::Unproven(_)),
        "a later epoch was minted"
    );
    let older_log = epoch_of(1, m(1)).raw();
    assert!(
        matches!(hand_resolution(&alone, 1, older_log), HandResolution::Unproven(_)),
        "this log lacks the epoch"
    );
    let nothing = PairView { pair: "p".into(), ..Default::default() };
    assert!(matches!(hand_resolution(&nothing, 1, two.raw()), HandResolution::Unproven(_)));
}

/// A lag report of member `member` with `records` unacknowledged.
fn lag(member: u8, records: u64) -> LagReport {
    LagReport {
        member,
        epoch: epoch_of(3, m(member)).raw(),
        linked: true,
        strict: true,
        records,
        decisions_waiting: records / 2,
        oldest_ms: (records > 0).then_some(4),
        at_unix_ms: 1_000,
    }
}

/// The lag goes to etcd at the first measure, then only when it says something new and at
/// most once per period: an idle pair writes nothing, a busy one one key per period.
#[test]
fn the_lag_is_reported_when_it_changes_at_most_once_per_period() {
    let every = Duration::from_secs(2);
    let (quiet, busy) = (lag(1, 0), lag(1, 40));
    let later = LagReport { at_unix_ms: 9_000, ..quiet.clone() };
    assert!(lag_report_due(None, Duration::ZERO, every, &quiet), "the first measure goes");
    assert!(!lag_report_due(Some(&quiet), Duration::from_secs(60), every, &later), "unchanged: nothing");
    assert!(!lag_report_due(Some(&quiet), Duration::from_millis(1_999), every, &busy), "too soon");
    assert!(lag_report_due(Some(&quiet), every, every, &busy));
    let unlinked = LagReport { linked: false, ..quiet.clone() };
    assert!(lag_report_due(Some(&quiet), every, every, &unlinked), "a link that went down is news");
    let alone = LagReport { strict: false, ..quiet.clone() };
    assert!(lag_report_due(Some(&quiet), every, every, &alone), "going alone is news");
}

/// Only the leader holding the key reports a lag, under its lease: a deposed leader's late
/// report fails, and the report goes when the lease does.
#[test]
fn only_the_leader_holding_the_key_reports_its_lag_and_it_goes_with_its_lease() {
    let mut etcd = Etcd::default();
    let a = candidate(&mut etcd, 0, 1, "run-a", Epoch::NONE);
    campaign_at(&mut etcd, 0, &a).unwrap();
    let stranger = etcd.grant(0, TTL);
    assert!(!etcd.txn(0, &report_lag(&keys(), stranger, &lag(2, 1))), "another lease reports nothing");
    assert!(etcd.txn(0, &report_lag(&keys(), a.lease, &lag(1, 3))));
    let stored = etcd.get(0, &keys().lag).expect("reported");
    assert_eq!(
        (from_json::<LagReport>("lag", &stored.value).unwrap(), stored.lease),
        (lag(1, 3), Some(a.lease))
    );
    etcd.revoke(a.lease);
    assert!(etcd.get(0, &keys().lag).is_none(), "the report went with the lease");
    assert!(!etcd.txn(0, &report_lag(&keys(), a.lease, &lag(1, 4))), "a deposed leader reports nothing");

    // A leader stepping down with its lease alive takes back its own report, no other.
    let mut etcd = Etcd::default();
    let b = candidate(&mut etcd, 0, 2, "run-b", Epoch::NONE);
    campaign_at(&mut etcd, 0, &b).unwrap();
    let stranger = etcd.grant(0, TTL);
    assert!(etcd.txn(0, &report_lag(&keys(), b.lease, &lag(2, 0))));
    assert!(!etcd.txn(0, &withdraw_lag(&keys(), stranger)), "not its report");
    assert!(etcd.get(0, &keys().lag).is_some());
    assert!(etcd.txn(0, &withdraw_lag(&keys(), b.lease)));
    assert!(etcd.get(0, &keys().lag).is_none());
}

//! Table tests of the pair's rules: every combination of role, caught-up state, epochs
//! (older, same, newer, none) and message, with the invariants each step must keep.

use super::*;

fn m(id: u8) -> MemberId {
    MemberId::new(id).unwrap()
}

fn e(count: u64, member: u8) -> Epoch {
    Epoch::from_raw((count << crate::epoch::MEMBER_BITS) | u64::from(member))
}

/// Every state a member can be in, for members 1 and 2, with no epoch or epochs of either.
fn states() -> Vec<Node> {
    let mut all = Vec::new();
    for member in [m(1), m(2)] {
        for seen in [Epoch::NONE, e(3, 1), e(3, 2)] {
            for caught_up in [false, true] {
                for next_sequence in [1, 5] {
                    all.push(Node { member, seen, role: Role::Backup, caught_up, next_sequence });
                }
            }
            if seen.member() == Some(member) {
                for alone in [false, true] {
                    let role = Role::Primary { alone };
                    all.push(Node { member, seen, role, caught_up: false, next_sequence: 1 });
                }
            }
        }
    }
    all
}

fn messages() -> Vec<PeerMessage> {
    let mut all = vec![PeerMessage::Refused];
    for sequence in [0, 1, 4, 5, 6, 9] {
        all.push(PeerMessage::Batch { sequence });
        all.push(PeerMessage::Ack { sequence });
        all.push(PeerMessage::Hello { next_sequence: sequence });
        all.push(PeerMessage::CaughtUp { up_to: sequence });
    }
    all
}

/// The epochs a message may carry relative to `seen`: none, older, the same, newer by
/// either member.
fn epochs_around(seen: Epoch) -> Vec<Epoch> {
    let mut all =
        vec![Epoch::NONE, seen, e(seen.count() + 1, 1), e(seen.count() + 1, 2), e(seen.count() + 7, 2)];
    if seen.count() > 0 {
        all.push(e(seen.count() - 1, 2));
        all.push(Epoch::from_raw(seen.raw() - 1));
    }
    all
}

#[test]
fn a_message_of_an_older_epoch_is_refused_and_changes_nothing() {
    for node in states() {
        for epoch in epochs_around(node.seen).into_iter().filter(|&x| x < node.seen) {
            for message in messages() {
                let mut after = node;
                let commands = after.step(Event::Peer { epoch, message }).unwrap();
                // A refusal is not refused back (the two would answer each other forever),
                // and a backup's hello may predate the primary's: the primary answers it
                // with the live set (its own hello told the backup of the newer epoch).
                // A primary running alone turns strict at that hello.
                let (expected, role) = match (node.role, message) {
                    (_, PeerMessage::Refused) => (vec![], node.role),
                    (Role::Primary { alone: true }, PeerMessage::Hello { .. }) => {
                        (vec![Command::BecomeStrict, Command::SendLiveSet], Role::Primary { alone: false })
                    }
                    (Role::Primary { .. }, PeerMessage::Hello { .. }) => {
                        (vec![Command::SendLiveSet], node.role)
                    }
                    _ => (vec![Command::Refuse { seen: node.seen }], node.role),
                };
                assert_eq!(commands, expected, "{node:?} {epoch} {message:?}");
                assert_eq!(after, Node { role, ..node });
            }
        }
    }
}

#[test]
fn a_newer_epoch_is_persisted_first_and_makes_any_member_a_backup_that_rejoins() {
    for node in states() {
        for epoch in epochs_around(node.seen).into_iter().filter(|&x| x > node.seen) {
            for message in messages() {
                let mut after = node;
                let commands = after.step(Event::Peer { epoch, message }).unwrap();
                assert_eq!(commands[0], Command::PersistSeen(epoch), "{node:?} {epoch} {message:?}");
                let was_primary = node.leads().is_some();
                assert_eq!(commands[1] == Command::StepDown, was_primary, "{commands:?}");
                assert!(commands.contains(&Command::Rejoin(epoch)));
                assert_eq!((after.role, after.seen, after.leads()), (Role::Backup, epoch, None));
                assert!(!commands.iter().any(|c| matches!(c, Command::RecoverThenServe(_))));
                // The message itself is then read as one of the new epoch, by a backup
                // that expects the new primary's first batch.
                let last = *commands.last().unwrap();
                match message {
                    PeerMessage::Batch { sequence: 1 } => {
                        assert_eq!(last, Command::AppendThenAck { epoch, sequence: 1 })
                    }
                    PeerMessage::Batch { sequence: 0 } => {
                        assert_eq!(last, Command::AckAgain { epoch, sequence: 0 })
                    }
                    PeerMessage::Batch { .. } => assert_eq!(last, Command::Resend { epoch, from: 1 }),
                    PeerMessage::Ack { .. } => assert_eq!(last, Command::ProtocolError),
                    PeerMessage::CaughtUp { up_to: 0 } => {
                        assert!(after.caught_up, "nothing was to be received")
                    }
                    PeerMessage::CaughtUp { .. } => {
                        assert_eq!(last, Command::Resend { epoch, from: 1 });
                        assert!(!after.caught_up);
                    }
                    PeerMessage::Hello { next_sequence } => {
                        assert_eq!(last, Command::Join { epoch, next_sequence: next_sequence.max(1) });
                        assert_eq!(after.next_sequence, next_sequence.max(1));
                    }
                    PeerMessage::Refused => assert_eq!(last, Command::Rejoin(epoch)),
                }
                assert!(!after.caught_up || message == PeerMessage::CaughtUp { up_to: 0 });
            }
        }
    }
}

#[test]
fn a_backup_appends_batches_in_order_acks_duplicates_again_and_asks_for_a_gap() {
    for node in states().into_iter().filter(|n| n.role == Role::Backup) {
        for sequence in [1, 4, 5, 6, 9] {
            let mut after = node;
            let commands = after
                .step(Event::Peer { epoch: node.seen, message: PeerMessage::Batch { sequence } })
                .unwrap();
            let epoch = node.seen;
            let expected = node.next_sequence;
            if sequence == expected {
                assert_eq!(commands, vec![Command::AppendThenAck { epoch, sequence }]);
                assert_eq!((after.next_sequence, after.caught_up), (expected + 1, node.caught_up));
            } else if sequence < expected {
                assert_eq!(commands, vec![Command::AckAgain { epoch, sequence }]);
                assert_eq!(after, node);
            } else {
                assert_eq!(commands, vec![Command::Resend { epoch, from: expected }]);
                assert!(!after.caught_up, "a backup missing a batch is not caught up");
                assert_eq!(after.next_sequence, expected);
            }
        }
    }
}

#[test]
fn messages_of_the_current_epoch_in_the_wrong_role_are_protocol_errors() {
    for node in states() {
        for message in messages() {
            let mut after = node;
            let commands = after.step(Event::Peer { epoch: node.seen, message }).unwrap();
            let wrong = matches!(
                (node.role, message),
                (Role::Backup, PeerMessage::Ack { .. })
                    | (Role::Primary { .. }, PeerMessage::Batch { .. } | PeerMessage::CaughtUp { .. })
            );
            assert_eq!(commands == vec![Command::ProtocolError], wrong, "{node:?} {message:?} {commands:?}");
            match (node.role, message) {
                (Role::Primary { .. }, PeerMessage::Ack { sequence }) => {
                    assert_eq!(commands, vec![Command::ConfirmUpTo(sequence)])
                }
                (Role::Primary { alone: true }, PeerMessage::Hello { .. }) => {
                    assert_eq!(commands, vec![Command::BecomeStrict, Command::SendLiveSet]);
                    assert_eq!(after.role, Role::Primary { alone: false }, "strict from the snapshot on");
                }
                (Role::Primary { alone: false }, PeerMessage::Hello { .. }) => {
                    assert_eq!(commands, vec![Command::SendLiveSet])
                }
                (_, PeerMessage::Refused) => {
                    assert!(commands.is_empty(), "a refusal of the same epoch means nothing")
                }
                (Role::Backup, PeerMessage::CaughtUp { up_to }) => {
                    assert_eq!(after.caught_up, up_to < node.next_sequence);
                    assert_eq!(commands.is_empty(), up_to < node.next_sequence);
                }
                (Role::Backup, PeerMessage::Hello { next_sequence }) => {
                    assert_eq!(
                        commands,
                        vec![Command::Join { epoch: node.seen, next_sequence: next_sequence.max(1) }]
                    );
                    assert!(!after.caught_up, "a new stream starts a new catch-up");
                }
                _ => {}
            }
            if wrong {
                assert_eq!(after, node, "a protocol error changes nothing");
            }
        }
    }
}

#[test]
fn promotion_needs_a_caught_up_backup_or_force_and_mints_above_everything_known() {
    for node in states() {
        for forced in [false, true] {
            for log_highest in [Epoch::NONE, e(1, 2), e(9, 1)] {
                let mut after = node;
                let result = after.step(Event::Promote { forced, log_highest });
                match (node.role, node.caught_up || forced) {
                    (Role::Primary { .. }, _) => {
                        assert_eq!(result, Err(PromoteRefused::AlreadyPrimary(node.seen)));
                        assert_eq!(after, node);
                    }
                    (Role::Backup, false) => {
                        assert_eq!(result, Err(PromoteRefused::NotCaughtUp { seen: node.seen }));
                        assert_eq!(after, node);
                    }
                    (Role::Backup, true) => {
                        let commands = result.unwrap();
                        let epoch = after.seen;
                        assert!(epoch > node.seen && epoch > log_highest);
                        assert_eq!(epoch.member(), Some(node.member));
                        assert_eq!(
                            commands.first(),
                            Some(&Command::PersistSeen(epoch)),
                            "durable before serving"
                        );
                        assert_eq!(commands.last(), Some(&Command::RecoverThenServe(epoch)));
                        let recorded = commands.contains(&Command::RecordForcedPromotion(epoch));
                        assert_eq!(recorded, !node.caught_up, "a forced promotion is recorded");
                        assert_eq!(
                            after.role,
                            Role::Primary { alone: true },
                            "alone until a backup caught up"
                        );
                        assert_eq!(after.leads(), Some(epoch));
                    }
                }
            }
        }
    }
}

#[test]
fn a_primary_turns_strict_once_its_backup_caught_up() {
    for node in states() {
        let mut after = node;
        let commands = after.step(Event::BackupCaughtUp).unwrap();
        match node.role {
            Role::Primary { alone: true } => {
                assert_eq!(commands, vec![Command::BecomeStrict]);
                assert_eq!(after.role, Role::Primary { alone: false });
            }
            Role::Primary { alone: false } => assert!(commands.is_empty()),
            Role::Backup => assert_eq!(commands, vec![Command::ProtocolError]),
        }
    }
}

#[test]
fn only_a_leader_acknowledges_or_calls_resource_managers_and_strict_needs_both_writes() {
    let roles = [Role::Backup, Role::Primary { alone: true }, Role::Primary { alone: false }];
    for role in roles {
        for local in [false, true] {
            for backup in [false, true] {
                let expected = match role {
                    Role::Backup => false,
                    Role::Primary { alone: true } => local,
                    Role::Primary { alone: false } => local && backup,
                };
                assert_eq!(may_acknowledge(role, local, backup), expected, "{role:?} {local} {backup}");
                // Nothing that one disk alone holds is acknowledged by a strict primary.
                if role == (Role::Primary { alone: false }) {
                    assert!(!may_acknowledge(role, true, false) && !may_acknowledge(role, false, true));
                }
            }
        }
        for in_doubt in [false, true] {
            assert_eq!(may_presume_abort(role, in_doubt), role != Role::Backup && !in_doubt);
        }
        assert_eq!(may_call_rms(role), role != Role::Backup);
    }
}

/// The story of a failover: member 1 leads, dies; the operator promotes member 2; member 1
/// returns, hears of the newer epoch, becomes a backup, and its old epoch is refused by
/// everyone from then on.
#[test]
fn a_deposed_primary_returns_as_a_backup_and_its_epoch_is_refused_everywhere() {
    let mut one = Node::start(m(1), Epoch::NONE);
    let mut two = Node::start(m(2), Epoch::NONE);
    let first = match one.step(Event::Promote { forced: true, log_highest: Epoch::NONE }).unwrap().as_slice()
    {
        [Command::PersistSeen(epoch), Command::RecordForcedPromotion(_), Command::RecoverThenServe(_)] => {
            *epoch
        }
        other => panic!("{other:?}"),
    };
    // Member 1 dials member 2: member 2's hello makes it send its live set.
    let reply = PeerMessage::Hello { next_sequence: 1 };
    assert_eq!(
        one.step(Event::Peer { epoch: first, message: reply }).unwrap(),
        vec![Command::BecomeStrict, Command::SendLiveSet]
    );
    // Member 2 follows: hello, two batches, the end of the catch-up.
    let hello = PeerMessage::Hello { next_sequence: 1 };
    for message in [hello, PeerMessage::Batch { sequence: 1 }, PeerMessage::Batch { sequence: 2 }] {
        two.step(Event::Peer { epoch: first, message }).unwrap();
    }
    assert!(
        two.step(Event::Promote { forced: false, log_highest: Epoch::NONE }).is_err(),
        "not caught up yet"
    );
    two.step(Event::Peer { epoch: first, message: PeerMessage::CaughtUp { up_to: 2 } }).unwrap();
    assert!(two.caught_up);
    assert_eq!(
        one.step(Event::Peer { epoch: first, message: PeerMessage::Ack { sequence: 2 } }).unwrap(),
        vec![Command::ConfirmUpTo(2)]
    );
    one.step(Event::BackupCaughtUp).unwrap();
    // Member 1 dies; the operator promotes member 2, which caught up.
    let second = two.step(Event::Promote { forced: false, log_highest: first }).unwrap();
    let second = match second.as_slice() {
        [Command::PersistSeen(epoch), Command::RecoverThenServe(_)] => *epoch,
        other => panic!("{other:?}"),
    };
    assert!(second > first);
    // Member 1 comes back believing it leads: member 2 refuses its batches...
    let refused =
        two.step(Event::Peer { epoch: first, message: PeerMessage::Batch { sequence: 3 } }).unwrap();
    assert_eq!(refused, vec![Command::Refuse { seen: second }]);
    // ...and member 1 steps down at the first message of the newer epoch.
    let commands = one.step(Event::Peer { epoch: second, message: PeerMessage::Refused }).unwrap();
    assert_eq!(commands, vec![Command::PersistSeen(second), Command::StepDown, Command::Rejoin(second)]);
    assert_eq!(one.role, Role::Backup);
    assert_eq!(
        one.step(Event::Peer { epoch: first, message: PeerMessage::Ack { sequence: 3 } }).unwrap(),
        vec![Command::Refuse { seen: second }],
        "its own old epoch is refused by itself too"
    );
}

/// etcd's election promotes a member to the epoch its campaign minted, whether or not this
/// process caught up over a link (the sync record vouched for it), but only to an epoch of
/// its own above every epoch it has seen, and never twice.
#[test]
fn an_elected_member_leads_exactly_its_epoch_and_nothing_older_or_foreign() {
    let seen = Epoch::from_raw((3 << 8) | 2);
    let mut two = Node::start(m(2), seen);
    for wrong in [seen, Epoch::from_raw((2 << 8) | 2), Epoch::from_raw((4 << 8) | 1)] {
        let mut node = two;
        assert_eq!(
            node.step(Event::Elected { epoch: wrong }),
            Err(PromoteRefused::NotAbove { seen, elected: wrong }),
            "{wrong}"
        );
        assert_eq!(node, two, "a refused election changes nothing");
    }
    let elected = Epoch::from_raw((5 << 8) | 2);
    assert_eq!(
        two.step(Event::Elected { epoch: elected }).unwrap(),
        vec![Command::PersistSeen(elected), Command::RecoverThenServe(elected)]
    );
    assert_eq!((two.seen, two.role), (elected, Role::Primary { alone: true }));
    assert_eq!(
        two.step(Event::Elected { epoch: Epoch::from_raw((6 << 8) | 2) }),
        Err(PromoteRefused::AlreadyPrimary(elected))
    );
}

/// Going alone (issue 33's `alone_after_ms`, after the election recorded the backup out of
/// sync) turns a strict primary into one that acknowledges on its own write, and the next
/// hello makes it strict again; a backup or an alone primary is left as it is.
#[test]
fn a_strict_primary_goes_alone_when_told_and_a_hello_makes_it_strict_again() {
    let mut node = Node::start(m(1), Epoch::NONE);
    node.step(Event::Promote { forced: true, log_highest: Epoch::NONE }).unwrap();
    let epoch = node.seen;
    node.step(Event::Peer { epoch, message: PeerMessage::Hello { next_sequence: 1 } }).unwrap();
    assert_eq!(node.role, Role::Primary { alone: false });
    assert!(!may_acknowledge(node.role, true, false), "strict: not on the local write alone");
    assert_eq!(node.step(Event::GoAlone).unwrap(), Vec::new());
    assert_eq!(node.role, Role::Primary { alone: true });
    assert!(may_acknowledge(node.role, true, false), "alone: on the local write");
    let strict = node.step(Event::Peer { epoch, message: PeerMessage::Hello { next_sequence: 1 } }).unwrap();
    assert_eq!(strict, vec![Command::BecomeStrict, Command::SendLiveSet]);
    let mut backup = Node::start(m(2), Epoch::NONE);
    backup.step(Event::GoAlone).unwrap();
    assert_eq!(backup.role, Role::Backup, "a backup does not lead, alone or not");
}

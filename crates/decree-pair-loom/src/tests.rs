//! Every interleaving of a promotion and a newer epoch heard on the link, under loom
//! (`cargo test --release -p decree-pair-loom`; the workspace's test run includes it).
//! Both go through [`StateCell::change`], as `Follower::promote` and
//! `Follower::persist_seen` do; the store is a list of the records written, in order.

use crate::state_cell::StateCell;
use decree_pair::epoch::{Epoch, MemberId};
use decree_pair::state_file::PairState;
use loom::sync::Arc;

fn epoch(count: u64, member: u8) -> Epoch {
    Epoch::from_raw((count << 8) | u64::from(member))
}

type Stored = Arc<loom::sync::Mutex<Vec<PairState>>>;

fn store_into(stored: &Stored) -> impl FnOnce(&PairState, &PairState) -> Result<(), ()> + '_ {
    move |previous, next| {
        let mut file = stored.lock().unwrap();
        assert_eq!(file.last(), Some(previous), "a store starts from what was stored last");
        file.push(*next);
        Ok(())
    }
}

#[test]
fn a_promotion_and_a_newer_epoch_heard_on_the_link_never_move_seen_back_or_lose_a_record() {
    loom::model(|| {
        let start = PairState { member: MemberId::new(2).unwrap(), seen: epoch(1, 1), forced: None };
        let cell = Arc::new(StateCell::new(start));
        let stored: Stored = Arc::new(loom::sync::Mutex::new(vec![start]));
        let heard = epoch(3, 1);
        let link = {
            let (cell, stored) = (cell.clone(), stored.clone());
            loom::thread::spawn(move || {
                cell.change(
                    |s| Ok((s.seen < heard).then_some(PairState { seen: heard, ..s })),
                    store_into(&stored),
                )
                .unwrap();
            })
        };
        // A forced promotion, minting one count above the highest epoch it knows.
        let promoted = cell
            .change(
                |s| {
                    let minted = Epoch::mint(s.member, &[s.seen]);
                    Ok(Some(PairState { seen: minted, forced: Some(minted), ..s }))
                },
                store_into(&stored),
            )
            .unwrap()
            .expect("a promotion always changes the record");
        link.join().unwrap();
        let stored = stored.lock().unwrap().clone();
        assert!(stored.windows(2).all(|w| w[0].seen <= w[1].seen), "seen moved back: {stored:?}");
        let last = cell.get();
        assert_eq!(stored.last(), Some(&last), "the member holds what was stored last");
        assert!(last.seen >= heard, "the epoch heard on the link is kept: {stored:?}");
        assert_eq!(last.forced, Some(promoted.seen), "the forced promotion is kept: {stored:?}");
    });
}

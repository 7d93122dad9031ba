//! Every interleaving of a session closing (its decisions move to the orphans) and a pair's
//! snapshot of the live set, under loom, through decree-server's own `live_set` functions
//! (issue 32, defect 2: a snapshot that read the orphans first missed a decision moved
//! between its two reads, and the backup's catch-up forgot its copy).

use crate::live_set;
use loom::sync::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// A session's map of decided transactions: sequence number to decision (here an Xid
/// number, which is also its key among the orphans).
type Decided = Mutex<HashMap<u64, u32>>;

#[test]
fn a_decision_moved_by_a_closing_session_is_in_every_snapshot_of_the_live_set() {
    loom::model(|| {
        let session: Arc<Decided> = Arc::new(Mutex::new(HashMap::from([(1, 7)])));
        let sessions = Arc::new(Mutex::new(HashMap::from([(5u64, session.clone())])));
        // An orphan already there: a snapshot holds it whatever the interleaving.
        let orphans = Arc::new(Mutex::new(HashMap::from([(9u32, 9u32)])));
        let closer = {
            let (sessions, orphans) = (sessions.clone(), orphans.clone());
            loom::thread::spawn(move || {
                live_set::close(&sessions, 5, &session, &orphans, |d| *d, |_, _| {}, || {}, || {})
            })
        };
        let mut seen = live_set::snapshot(&sessions, |s: &Decided| s, &orphans, |d| *d);
        assert_eq!(closer.join().unwrap(), 1, "the session's one decision moved");
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen, vec![7, 9], "a snapshot holds every live decision, moved or not");
        let orphans = orphans.lock().unwrap();
        assert_eq!(orphans.len(), 2, "the moved decision is an orphan once the session closed");
        assert!(sessions.lock().unwrap().is_empty(), "the closed session left the live sessions");
    });
}

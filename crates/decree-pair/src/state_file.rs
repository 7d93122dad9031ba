//! `PAIR`: what a pair member must never forget across a restart, in its log directory.
//!
//! It holds the member id (a log directory belongs to one member; starting member 2 on
//! member 1's directory is refused), the highest epoch the member has seen or minted (so
//! that a deposed primary's records stay refused after a restart), and the last promotion
//! that was forced (an operator skipped the caught-up check; the status shows it). It is
//! one framed record (length, CRC32C) written to `PAIR.tmp`, synced, renamed over `PAIR`
//! and the directory synced: a crash leaves the old record or the new one, never a mix. A
//! failed sync is returned, and the caller stops (fail-stop, as the log does).

use crate::epoch::{Epoch, MemberId};
use decree_log::io::Storage;
use decree_log::record::{self, Decoded, RecordKind};
use decree_log::LogError;
use std::path::{Path, PathBuf};

/// The file's name in the log directory.
pub const PAIR_FILE: &str = "PAIR";

/// Bytes of the record's payload: version, member, seen epoch, forced epoch.
const PAYLOAD_BYTES: usize = 1 + 1 + 8 + 8;

/// The payload's version byte.
const VERSION: u8 = 1;

/// The durable state of one pair member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PairState {
    /// The member this directory belongs to.
    pub member: MemberId,
    /// The highest epoch seen or minted.
    pub seen: Epoch,
    /// The epoch of the last forced promotion, if any.
    pub forced: Option<Epoch>,
}

/// Reads `PAIR` of `dir`: `None` when the member has never run there.
pub fn load(storage: &dyn Storage, dir: &Path) -> Result<Option<PairState>, LogError> {
    let path = dir.join(PAIR_FILE);
    if !storage.list(dir).map_err(|e| LogError::io(dir, e))?.iter().any(|p| p == &path) {
        return Ok(None);
    }
    let file = storage.open(&path, false).map_err(|e| LogError::io(&path, e))?;
    let len = file.len().map_err(|e| LogError::io(&path, e))? as usize;
    let mut buf = vec![0u8; len.min(record::frame_len(PAYLOAD_BYTES) + 1)];
    file.read_exact_at(&mut buf, 0).map_err(|e| LogError::io(&path, e))?;
    let corrupted = |reason: String| LogError::Corrupted { path: path.clone(), offset: 0, reason };
    let payload = match record::decode(&buf, PAYLOAD_BYTES) {
        Decoded::Frame(frame, used) if used == len && frame.payload.len() == PAYLOAD_BYTES => frame.payload,
        other => return Err(corrupted(format!("the pair state record is unreadable ({other:?})"))),
    };
    if payload[0] != VERSION {
        return Err(corrupted(format!("pair state version {} (this decree reads {VERSION})", payload[0])));
    }
    let member = MemberId::new(payload[1]).ok_or_else(|| corrupted("member id 0".into()))?;
    let seen = Epoch::from_raw(u64::from_le_bytes(payload[2..10].try_into().unwrap()));
    let forced = Epoch::from_raw(u64::from_le_bytes(payload[10..18].try_into().unwrap()));
    let forced = (forced != Epoch::NONE).then_some(forced);
    Ok(Some(PairState { member, seen, forced }))
}

/// Stores `state` durably over `previous` (what [`load`] returned, or the last store):
/// the seen epoch never goes down, and the member never changes.
pub fn store(
    storage: &dyn Storage,
    dir: &Path,
    previous: Option<&PairState>,
    state: &PairState,
) -> Result<(), LogError> {
    if let Some(previous) = previous {
        assert_eq!(previous.member, state.member, "a log directory belongs to one member");
        assert!(state.seen >= previous.seen, "the seen epoch only grows: {previous:?} -> {state:?}");
    }
    let mut payload = Vec::with_capacity(PAYLOAD_BYTES);
    payload.push(VERSION);
    payload.push(state.member.get());
    payload.extend_from_slice(&state.seen.raw().to_le_bytes());
    payload.extend_from_slice(&state.forced.unwrap_or(Epoch::NONE).raw().to_le_bytes());
    assert_eq!(payload.len(), PAYLOAD_BYTES);
    let mut buf = Vec::with_capacity(record::frame_len(PAYLOAD_BYTES));
    record::encode(&mut buf, RecordKind::Data, 0, &payload);
    let (path, tmp): (PathBuf, PathBuf) = (dir.join(PAIR_FILE), dir.join(format!("{PAIR_FILE}.tmp")));
    let sync_failed =
        |p: &Path, e: std::io::Error| LogError::SyncFailed { path: p.to_path_buf(), message: e.to_string() };
    let _ = storage.remove(&tmp);
    let file = storage.open(&tmp, true).map_err(|e| LogError::io(&tmp, e))?;
    file.write_all_at(&buf, 0).map_err(|e| LogError::io(&tmp, e))?;
    file.sync_all().map_err(|e| sync_failed(&tmp, e))?;
    storage.rename(&tmp, &path).map_err(|e| LogError::io(&path, e))?;
    storage.sync_dir(dir).map_err(|e| sync_failed(dir, e))?;
    Ok(())
}

/// Checks that `dir`'s state belongs to `member`, naming both when it does not.
pub fn check_member(state: &PairState, member: MemberId, dir: &Path) -> Result<(), LogError> {
    if state.member == member {
        return Ok(());
    }
    Err(LogError::Corrupted {
        path: dir.join(PAIR_FILE),
        offset: 0,
        reason: format!(
            "this log directory belongs to pair member {}, and this server is configured as member {}: \
             each member keeps its own directory",
            state.member.get(),
            member.get()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use decree_log::testing::fault::FaultStorage;

    fn m(id: u8) -> MemberId {
        MemberId::new(id).unwrap()
    }

    fn storage() -> (FaultStorage, PathBuf) {
        let storage = FaultStorage::new(7);
        let dir = PathBuf::from("/log");
        storage.create_dir_all(&dir).unwrap();
        storage.sync_dir(&dir).unwrap();
        (storage, dir)
    }

    #[test]
    fn a_stored_state_survives_power_loss_and_reads_back_exactly() {
        let (storage, dir) = storage();
        assert_eq!(load(&storage, &dir).unwrap(), None);
        let first = PairState { member: m(2), seen: Epoch::from_raw(0x301), forced: None };
        store(&storage, &dir, None, &first).unwrap();
        let second =
            PairState { seen: Epoch::from_raw(0x402), forced: Some(Epoch::from_raw(0x402)), ..first };
        store(&storage, &dir, Some(&first), &second).unwrap();
        let after = storage.crash();
        assert_eq!(load(&after, &dir).unwrap(), Some(second));
    }

    #[test]
    fn a_failed_sync_is_returned_and_the_old_state_stays() {
        let (storage, dir) = storage();
        let first = PairState { member: m(1), seen: Epoch::from_raw(0x101), forced: None };
        store(&storage, &dir, None, &first).unwrap();
        storage.fail_next_sync();
        let next = PairState { seen: Epoch::from_raw(0x201), ..first };
        match store(&storage, &dir, Some(&first), &next) {
            Err(LogError::SyncFailed { path, .. }) => assert!(path.ends_with("PAIR.tmp"), "{path:?}"),
            other => panic!("expected SyncFailed, got {other:?}"),
        }
        assert_eq!(load(&storage.crash(), &dir).unwrap(), Some(first));
    }

    #[test]
    fn a_damaged_file_is_refused_with_its_path_and_never_read_as_no_state() {
        let (storage, dir) = storage();
        let state = PairState { member: m(1), seen: Epoch::from_raw(0x101), forced: None };
        store(&storage, &dir, None, &state).unwrap();
        storage.corrupt(&dir.join(PAIR_FILE), 12, 0x40).unwrap();
        match load(&storage, &dir) {
            Err(LogError::Corrupted { path, reason, .. }) => {
                assert!(path.ends_with(PAIR_FILE));
                assert!(reason.contains("unreadable"), "{reason}");
            }
            other => panic!("a damaged state must be refused, got {other:?}"),
        }
    }

    #[test]
    fn another_members_directory_is_refused_by_name() {
        let state = PairState { member: m(1), seen: Epoch::NONE, forced: None };
        assert!(check_member(&state, m(1), Path::new("/log")).is_ok());
        let e = check_member(&state, m(2), Path::new("/log")).unwrap_err().to_string();
        assert!(e.contains("belongs to pair member 1") && e.contains("configured as member 2"), "{e}");
    }

    #[test]
    #[should_panic(expected = "the seen epoch only grows")]
    fn the_seen_epoch_never_goes_down() {
        let (storage, dir) = storage();
        let high = PairState { member: m(1), seen: Epoch::from_raw(0x501), forced: None };
        let low = PairState { seen: Epoch::from_raw(0x301), ..high };
        let _ = store(&storage, &dir, Some(&high), &low);
    }
}

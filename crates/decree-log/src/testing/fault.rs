//! Fault-injecting, in-memory storage for crash tests of every engine.
//!
//! Modelled on redb's `CrashBackend` and FoundationDB's `AsyncFileNonDurable`: every file
//! keeps a *live* image (what reads see) and a *durable* image (what survives power loss),
//! plus the list of writes made since its last sync. `sync_data`/`sync_all` make that file's
//! writes durable; creations, removals and renames become durable only when `sync_dir` of
//! their directory succeeds. [`FaultStorage::crash_with`] builds a fresh storage from the
//! durable state, optionally keeping, tearing or zeroing unsynced writes, the way a power
//! cut can. Other controls make syncs fail, writes fail, or the disk fill up.
//!
//! It is for tests only: everything lives in memory, directories are created durably at
//! once (engines create their directory once, at open), and `raw_fd` is `None`, so
//! engines that need `mmap` must fall back to plain reads and writes here. Deterministic:
//! every random choice comes from the seed given to [`FaultStorage::new`].
//! A storage that was crashed keeps working (the process that "died" may still hold it);
//! the storage returned by the crash is independent of it.

use crate::io::{Storage, StorageFile, DIRECT_ALIGN};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a crash does with writes that were not synced yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// Power loss: every unsynced write and unsynced directory change is lost.
    DropUnsynced,
    /// The page cache reached the disk after all: unsynced writes of durable files survive.
    KeepUnsynced,
    /// Each unsynced write survives or not by a coin flip (seeded), in any order.
    KeepRandomUnsynced,
    /// Unsynced writes survive, but the most recent one is cut at a random byte.
    TearLastWrite,
    /// Unsynced writes survive, but the most recent one reads back as zeros.
    ZeroLastWrite,
}

#[derive(Debug, Clone)]
enum PendingOp {
    Write { offset: u64, data: Vec<u8>, order: u64 },
    SetLen { len: u64 },
}

#[derive(Debug, Default, Clone)]
struct Inode {
    live: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<PendingOp>,
    /// A failed sync dropped unsynced writes: the disk will never hold them, although the
    /// cache (`live`) still shows them.
    lost_writes: bool,
    /// Write-back errors so far (Linux's `errseq_t`): each handle reports each new error
    /// once, on its next sync, whoever's data it hit.
    errors: u64,
}

#[derive(Debug)]
struct FsState {
    inodes: HashMap<u64, Inode>,
    inode_next: u64,
    names_live: BTreeMap<PathBuf, u64>,
    names_durable: BTreeMap<PathBuf, u64>,
    dirs: BTreeSet<PathBuf>,
    rng: u64,
    write_order: u64,
    /// Syncs that still succeed before every later one fails (`None`: no limit).
    syncs_left: Option<u64>,
    /// The next sync fails, later ones succeed again.
    sync_fail_once: bool,
    /// `syncs_done` value at which one sync fails.
    sync_fail_at: Option<u64>,
    /// How long a file sync takes, so that concurrent syncs overlap as on a device.
    sync_delay: std::time::Duration,
    /// File syncs wait while this is set (`hold_syncs`): a test holds the disk still.
    syncs_held: bool,
    /// `open_direct` refuses (as tmpfs does), so engines take their buffered path.
    no_direct_io: bool,
    /// Writes that still succeed before every later one fails (`None`: no limit).
    writes_left: Option<u64>,
    space_limit_bytes: Option<u64>,
    syncs_done: u64,
}

impl FsState {
    fn new(seed: u64) -> Self {
        FsState {
            inodes: HashMap::new(),
            inode_next: 1,
            names_live: BTreeMap::new(),
            names_durable: BTreeMap::new(),
            dirs: BTreeSet::new(),
            rng: seed ^ 0x5DEE_CE66_D1CE_4E5B,
            write_order: 0,
            syncs_left: None,
            sync_fail_once: false,
            sync_fail_at: None,
            sync_delay: std::time::Duration::ZERO,
            syncs_held: false,
            no_direct_io: false,
            writes_left: None,
            space_limit_bytes: None,
            syncs_done: 0,
        }
    }

    /// splitmix64: small, seedable, good enough to choose crash outcomes.
    fn next_random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn bytes_used(&self) -> u64 {
        let linked: BTreeSet<u64> = self.names_live.values().copied().collect();
        linked.iter().filter_map(|id| self.inodes.get(id)).map(|i| i.live.len() as u64).sum()
    }

    fn check_sync(&mut self) -> io::Result<()> {
        if self.sync_fail_at == Some(self.syncs_done) {
            self.sync_fail_at = None;
            return Err(io::Error::other("injected fault: sync failed once (EIO)"));
        }
        if std::mem::take(&mut self.sync_fail_once) {
            return Err(io::Error::other("injected fault: sync failed once (EIO)"));
        }
        if let Some(left) = self.syncs_left.as_mut() {
            if *left == 0 {
                return Err(io::Error::other("injected fault: sync failed (EIO)"));
            }
            *left -= 1;
        }
        self.syncs_done += 1;
        Ok(())
    }

    fn check_write(&mut self, inode: u64, end: u64) -> io::Result<()> {
        if let Some(left) = self.writes_left.as_mut() {
            if *left == 0 {
                return Err(io::Error::other("injected fault: write failed (EIO)"));
            }
            *left -= 1;
        }
        if let Some(limit) = self.space_limit_bytes {
            let current = self.inodes.get(&inode).map(|i| i.live.len() as u64).unwrap_or(0);
            if end > current && self.bytes_used() + (end - current) > limit {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
        }
        Ok(())
    }

    fn inode_mut(&mut self, id: u64) -> io::Result<&mut Inode> {
        self.inodes
            .get_mut(&id)
            .ok_or_else(|| io::Error::other(format!("fault storage: inode {id} vanished")))
    }
}

fn apply(image: &mut Vec<u8>, op: &PendingOp) {
    match op {
        PendingOp::Write { offset, data, .. } => write_into(image, *offset, data),
        PendingOp::SetLen { len } => image.resize(*len as usize, 0),
    }
}

fn write_into(image: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let start = offset as usize;
    let end = start + data.len();
    if image.len() < end {
        image.resize(end, 0);
    }
    image[start..end].copy_from_slice(data);
}

/// Holds every sync of a [`FaultStorage`] until dropped ([`FaultStorage::hold_syncs`]).
#[must_use = "the syncs are released when the hold is dropped"]
pub struct SyncHold {
    state: Arc<Mutex<FsState>>,
}

impl Drop for SyncHold {
    fn drop(&mut self) {
        self.state.lock().syncs_held = false;
    }
}

/// An in-memory file system with a durable and a live image per file; cheap to clone
/// (clones share the same files), so a test keeps one handle as its fault controller.
#[derive(Clone)]
pub struct FaultStorage {
    state: Arc<Mutex<FsState>>,
}

impl std::fmt::Debug for FaultStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.lock();
        f.debug_struct("FaultStorage").field("files", &state.names_live.keys().collect::<Vec<_>>()).finish()
    }
}

impl FaultStorage {
    /// An empty storage; `seed` decides every random crash outcome.
    pub fn new(seed: u64) -> Self {
        FaultStorage { state: Arc::new(Mutex::new(FsState::new(seed))) }
    }

    /// Power loss: a new storage holding only what was durable.
    pub fn crash(&self) -> FaultStorage {
        self.crash_with(CrashMode::DropUnsynced)
    }

    /// A crash: a new storage built from the durable directory entries and file images,
    /// with unsynced writes of those files treated as `mode` says.
    pub fn crash_with(&self, mode: CrashMode) -> FaultStorage {
        let mut state = self.state.lock();
        let seed = state.next_random();
        let mut next = FsState::new(seed);
        next.dirs = state.dirs.clone();
        next.no_direct_io = state.no_direct_io;
        // The most recent unsynced write of a file that survives is the one a tear hits.
        let durable_ids: BTreeSet<u64> = state.names_durable.values().copied().collect();
        let last_order = durable_ids
            .iter()
            .filter_map(|id| state.inodes.get(id))
            .flat_map(|i| i.pending.iter())
            .filter_map(|op| match op {
                PendingOp::Write { order, .. } => Some(*order),
                PendingOp::SetLen { .. } => None,
            })
            .max();
        let names: Vec<(PathBuf, u64)> = state.names_durable.iter().map(|(p, id)| (p.clone(), *id)).collect();
        let mut rebuilt: HashMap<u64, u64> = HashMap::new();
        for (path, id) in names {
            let new_id = match rebuilt.get(&id) {
                Some(new_id) => *new_id,
                None => {
                    let inode = state.inodes.get(&id).cloned().unwrap_or_default();
                    let mut image = inode.durable.clone();
                    for op in &inode.pending {
                        let keep = match mode {
                            CrashMode::DropUnsynced => false,
                            CrashMode::KeepUnsynced | CrashMode::TearLastWrite | CrashMode::ZeroLastWrite => {
                                true
                            }
                            CrashMode::KeepRandomUnsynced => state.next_random() & 1 == 1,
                        };
                        if !keep {
                            continue;
                        }
                        match op {
                            PendingOp::Write { offset, data, order } if Some(*order) == last_order => {
                                if mode == CrashMode::TearLastWrite {
                                    let cut = (state.next_random() % data.len().max(1) as u64) as usize;
                                    write_into(&mut image, *offset, &data[..cut]);
                                } else if mode == CrashMode::ZeroLastWrite {
                                    write_into(&mut image, *offset, &vec![0u8; data.len()]);
                                } else {
                                    apply(&mut image, op);
                                }
                            }
                            _ => apply(&mut image, op),
                        }
                    }
                    let new_id = next.inode_next;
                    next.inode_next += 1;
                    next.inodes.insert(
                        new_id,
                        Inode {
                            live: image.clone(),
                            durable: image,
                            pending: Vec::new(),
                            lost_writes: false,
                            errors: 0,
                        },
                    );
                    rebuilt.insert(id, new_id);
                    new_id
                }
            };
            next.names_live.insert(path.clone(), new_id);
            next.names_durable.insert(path, new_id);
        }
        FaultStorage { state: Arc::new(Mutex::new(next)) }
    }

    /// Makes the next sync (file or directory) fail once.
    pub fn fail_next_sync(&self) {
        self.state.lock().sync_fail_once = true;
    }

    /// Makes `open_direct` refuse, as on a file system without `O_DIRECT`.
    pub fn disable_direct_io(&self) {
        self.state.lock().no_direct_io = true;
    }

    /// Makes every file sync take `delay` (slept before it takes effect, outside the lock).
    pub fn set_sync_delay(&self, delay: std::time::Duration) {
        self.state.lock().sync_delay = delay;
    }

    /// Until the returned hold is dropped, every file sync waits (before it takes effect):
    /// a test shows what happens before a write can be durable, without racing a clock.
    /// Dropped on a panic too, so that a failing test does not hang on a held sync.
    pub fn hold_syncs(&self) -> SyncHold {
        self.state.lock().syncs_held = true;
        SyncHold { state: self.state.clone() }
    }

    /// Lets `count` more syncs succeed, then makes the next one fail, once.
    pub fn fail_one_sync_after(&self, count: u64) {
        let mut state = self.state.lock();
        state.sync_fail_at = Some(state.syncs_done + count);
    }

    /// Lets `count` more syncs succeed, then makes every later sync fail.
    pub fn fail_syncs_after(&self, count: u64) {
        self.state.lock().syncs_left = Some(count);
    }

    /// Lets `count` more writes succeed, then makes every later write fail with EIO.
    pub fn fail_writes_after(&self, count: u64) {
        self.state.lock().writes_left = Some(count);
    }

    /// Writes that would grow the linked files past `bytes` in total fail with ENOSPC.
    pub fn set_space_limit(&self, bytes: Option<u64>) {
        self.state.lock().space_limit_bytes = bytes;
    }

    /// Removes every injected fault (sync and write failures, space limit).
    pub fn clear_faults(&self) {
        let mut state = self.state.lock();
        state.syncs_left = None;
        state.sync_fail_once = false;
        state.sync_fail_at = None;
        state.writes_left = None;
        state.space_limit_bytes = None;
    }

    /// Bytes held by the files currently linked in the directory tree.
    pub fn bytes_used(&self) -> u64 {
        self.state.lock().bytes_used()
    }

    /// Successful syncs (file and directory) so far.
    pub fn syncs_done(&self) -> u64 {
        self.state.lock().syncs_done
    }

    /// The live content of `path` (what a read sees now), if the file exists.
    pub fn read_live(&self, path: &Path) -> Option<Vec<u8>> {
        let state = self.state.lock();
        let id = state.names_live.get(path)?;
        state.inodes.get(id).map(|i| i.live.clone())
    }

    /// The durable content of `path`, if its directory entry is durable.
    pub fn read_durable(&self, path: &Path) -> Option<Vec<u8>> {
        let state = self.state.lock();
        let id = state.names_durable.get(path)?;
        state.inodes.get(id).map(|i| i.durable.clone())
    }

    /// Flips bits (`xor`) of the byte at `offset` of `path` in both images: media damage.
    pub fn corrupt(&self, path: &Path, offset: u64, xor: u8) -> io::Result<()> {
        let mut state = self.state.lock();
        let id = *state.names_live.get(path).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("{} not found", path.display()))
        })?;
        let inode = state.inode_mut(id)?;
        for image in [&mut inode.live, &mut inode.durable] {
            if let Some(byte) = image.get_mut(offset as usize) {
                *byte ^= xor;
            }
        }
        Ok(())
    }
}

impl Storage for FaultStorage {
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn StorageFile>> {
        let mut state = self.state.lock();
        if let Some(&id) = state.names_live.get(path) {
            let errors = state.inode_mut(id)?.errors;
            return Ok(FaultFile::handle(&self.state, id, errors));
        }
        if !create {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("{} not found", path.display())));
        }
        let parent = path.parent().unwrap_or(Path::new("")).to_path_buf();
        if !state.dirs.contains(&parent) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("directory {} does not exist", parent.display()),
            ));
        }
        let id = state.inode_next;
        state.inode_next += 1;
        state.inodes.insert(id, Inode::default());
        state.names_live.insert(path.to_path_buf(), id);
        Ok(FaultFile::handle(&self.state, id, 0))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut state = self.state.lock();
        state
            .names_live
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{} not found", path.display())))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.state.lock();
        let id = state.names_live.remove(from).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("{} not found", from.display()))
        })?;
        state.names_live.insert(to.to_path_buf(), id);
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let state = self.state.lock();
        if !state.dirs.contains(dir) {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("{} not found", dir.display())));
        }
        Ok(state.names_live.keys().filter(|p| p.parent() == Some(dir)).cloned().collect())
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.state.lock();
        for ancestor in dir.ancestors() {
            state.dirs.insert(ancestor.to_path_buf());
        }
        Ok(())
    }

    fn open_direct(&self, path: &Path) -> io::Result<Option<Arc<dyn StorageFile>>> {
        let mut state = self.state.lock();
        if state.no_direct_io {
            return Ok(None);
        }
        let Some(&id) = state.names_live.get(path) else {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("{} not found", path.display())));
        };
        let errors = state.inode_mut(id)?.errors;
        Ok(Some(Arc::new(FaultFile {
            state: self.state.clone(),
            inode: id,
            errors_seen: errors.into(),
            direct: true,
        })))
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.state.lock();
        state.check_sync()?;
        let in_dir = |p: &PathBuf| p.parent() == Some(dir);
        state.names_durable.retain(|p, _| !in_dir(p));
        let live: Vec<(PathBuf, u64)> =
            state.names_live.iter().filter(|(p, _)| in_dir(p)).map(|(p, id)| (p.clone(), *id)).collect();
        state.names_durable.extend(live);
        Ok(())
    }
}

/// One open file of a [`FaultStorage`]; survives removal of its name, like a real handle.
struct FaultFile {
    state: Arc<Mutex<FsState>>,
    inode: u64,
    /// The inode's error count this handle has reported (sampled at open), as the
    /// kernel's per-open-file `f_wb_err`: a handle shared by concurrent syncs reports an
    /// error to one of them only, and the others "succeed" without the dropped data.
    errors_seen: std::sync::atomic::AtomicU64,
    /// Opened by `open_direct`: writes must be aligned and are durable when they return.
    direct: bool,
}

impl FaultFile {
    fn handle(state: &Arc<Mutex<FsState>>, inode: u64, errors: u64) -> Arc<dyn StorageFile> {
        Arc::new(FaultFile { state: state.clone(), inode, errors_seen: errors.into(), direct: false })
    }

    /// An `O_DIRECT | O_DSYNC` write: the kernel first writes back dirty cached pages of
    /// the range, then writes the data to the device before returning.
    fn write_direct(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let align = DIRECT_ALIGN;
        if !offset.is_multiple_of(align as u64)
            || !buf.len().is_multiple_of(align)
            || !(buf.as_ptr() as usize).is_multiple_of(align)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("direct write of {} bytes at {offset} is not {align}-aligned (EINVAL)", buf.len()),
            ));
        }
        // The write waits for the device like a sync does (O_DSYNC), outside the lock, so
        // that concurrent direct writes overlap.
        let delay = self.state.lock().sync_delay;
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let mut state = self.state.lock();
        state.check_write(self.inode, offset + buf.len() as u64)?;
        let inode = state.inode_mut(self.inode)?;
        let end = offset + buf.len() as u64;
        let (overlapping, rest): (Vec<PendingOp>, Vec<PendingOp>) =
            std::mem::take(&mut inode.pending).into_iter().partition(|op| match op {
                PendingOp::Write { offset: o, data, .. } => *o < end && o + data.len() as u64 > offset,
                _ => false,
            });
        for op in &overlapping {
            apply(&mut inode.durable, op);
        }
        inode.pending = rest;
        write_into(&mut inode.live, offset, buf);
        write_into(&mut inode.durable, offset, buf);
        Ok(())
    }
}

impl FaultFile {
    fn sync(&self) -> io::Result<()> {
        let delay = self.state.lock().sync_delay;
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        // Polled: a test-only gate, held for a moment.
        while self.state.lock().syncs_held {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let mut state = self.state.lock();
        if let Err(e) = state.check_sync() {
            // As Linux does after a writeback error: the dirty pages are marked clean and
            // their data never reaches the disk, so a later sync "succeeds" without it.
            let inode = state.inode_mut(self.inode)?;
            if !inode.pending.is_empty() {
                inode.pending.clear();
                inode.lost_writes = true;
            }
            inode.errors += 1;
            self.errors_seen.store(inode.errors, std::sync::atomic::Ordering::Relaxed);
            return Err(e);
        }
        let inode = state.inode_mut(self.inode)?;
        let pending = std::mem::take(&mut inode.pending);
        for op in &pending {
            apply(&mut inode.durable, op);
        }
        if self.errors_seen.swap(inode.errors, std::sync::atomic::Ordering::Relaxed) != inode.errors {
            return Err(io::Error::other("write-back error reported to this handle (EIO)"));
        }
        debug_assert!(inode.lost_writes || inode.durable == inode.live);
        Ok(())
    }
}

impl StorageFile for FaultFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut state = self.state.lock();
        let inode = state.inode_mut(self.inode)?;
        let start = (offset as usize).min(inode.live.len());
        let n = buf.len().min(inode.live.len() - start);
        buf[..n].copy_from_slice(&inode.live[start..start + n]);
        Ok(n)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self.direct {
            return self.write_direct(buf, offset);
        }
        let mut state = self.state.lock();
        state.check_write(self.inode, offset + buf.len() as u64)?;
        state.write_order += 1;
        let order = state.write_order;
        let inode = state.inode_mut(self.inode)?;
        write_into(&mut inode.live, offset, buf);
        inode.pending.push(PendingOp::Write { offset, data: buf.to_vec(), order });
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        self.sync()
    }

    fn sync_all(&self) -> io::Result<()> {
        self.sync()
    }

    fn len(&self) -> io::Result<u64> {
        let mut state = self.state.lock();
        Ok(state.inode_mut(self.inode)?.live.len() as u64)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut state = self.state.lock();
        state.check_write(self.inode, len)?;
        let inode = state.inode_mut(self.inode)?;
        inode.live.resize(len as usize, 0);
        inode.pending.push(PendingOp::SetLen { len });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (FaultStorage, PathBuf) {
        let fs = FaultStorage::new(7);
        let dir = PathBuf::from("/log");
        fs.create_dir_all(&dir).unwrap();
        (fs, dir)
    }

    #[test]
    fn a_failed_sync_drops_unsynced_data_and_each_handle_reports_it_once() {
        let (fs, dir) = setup();
        let path = dir.join("f");
        let a = fs.open(&path, true).unwrap();
        let b = fs.open(&path, false).unwrap();
        fs.sync_dir(&dir).unwrap();
        a.write_all_at(b"kept", 0).unwrap();
        a.sync_data().unwrap();
        a.write_all_at(b"lost", 4).unwrap();
        fs.fail_one_sync_after(0);
        assert!(a.sync_data().is_err(), "the injected failure");
        assert!(a.sync_data().is_ok(), "a handle reports an error once");
        assert!(b.sync_data().is_err(), "another handle reports the same error on its next sync");
        assert!(b.sync_data().is_ok());
        assert_eq!(fs.read_live(&path).as_deref(), Some(&b"keptlost"[..]), "the cache still shows it");
        assert_eq!(fs.read_durable(&path).as_deref(), Some(&b"kept"[..]), "the disk never got it");
        let c = fs.open(&path, false).unwrap();
        assert!(c.sync_data().is_ok(), "a handle opened after the error does not report it");
    }

    #[test]
    fn unsynced_writes_and_entries_are_lost_at_power_loss() {
        let (fs, dir) = setup();
        let a = dir.join("a");
        let file = fs.open(&a, true).unwrap();
        file.write_all_at(b"durable", 0).unwrap();
        file.sync_data().unwrap();
        // The entry of `a` is not durable yet: the whole file vanishes.
        assert!(fs.crash().read_live(&a).is_none());
        fs.sync_dir(&dir).unwrap();
        file.write_all_at(b"LOST", 0).unwrap();
        let after = fs.crash();
        assert_eq!(after.read_live(&a).unwrap(), b"durable");
        assert_eq!(fs.crash_with(CrashMode::KeepUnsynced).read_live(&a).unwrap(), b"LOSTble");
        assert_eq!(fs.crash_with(CrashMode::ZeroLastWrite).read_live(&a).unwrap(), b"\0\0\0\0ble");
        let torn = fs.crash_with(CrashMode::TearLastWrite).read_live(&a).unwrap();
        assert_eq!(torn.len(), 7);
        assert!(torn.ends_with(b"ble"));
    }

    #[test]
    fn removal_and_rename_need_a_directory_sync() {
        let (fs, dir) = setup();
        let (a, b) = (dir.join("a"), dir.join("b"));
        fs.open(&a, true).unwrap().sync_all().unwrap();
        fs.sync_dir(&dir).unwrap();
        fs.rename(&a, &b).unwrap();
        let crashed = fs.crash();
        assert!(crashed.read_live(&a).is_some() && crashed.read_live(&b).is_none());
        fs.sync_dir(&dir).unwrap();
        let crashed = fs.crash();
        assert!(crashed.read_live(&a).is_none() && crashed.read_live(&b).is_some());
        assert_eq!(crashed.list(&dir).unwrap(), vec![b]);
    }

    #[test]
    fn sync_failures_and_space_limit() {
        let (fs, dir) = setup();
        let file = fs.open(&dir.join("a"), true).unwrap();
        fs.fail_syncs_after(1);
        file.sync_data().unwrap();
        assert!(file.sync_data().is_err());
        assert!(fs.sync_dir(&dir).is_err());
        fs.clear_faults();
        file.sync_data().unwrap();
        fs.set_space_limit(Some(100));
        file.write_all_at(&[1; 100], 0).unwrap();
        let err = file.write_all_at(&[1; 1], 100).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
        // Overwriting allocated space needs no new room.
        file.write_all_at(&[2; 10], 50).unwrap();
    }

    #[test]
    fn same_seed_same_crash() {
        let run = || {
            let (fs, dir) = setup();
            let file = fs.open(&dir.join("a"), true).unwrap();
            fs.sync_dir(&dir).unwrap();
            for i in 0..20u8 {
                file.write_all_at(&[i + 1; 8], u64::from(i) * 8).unwrap();
            }
            fs.crash_with(CrashMode::KeepRandomUnsynced).read_live(&dir.join("a")).unwrap()
        };
        assert_eq!(run(), run());
    }
}

//! The file layer under the durable engines.
//!
//! Engines never call `std::fs` directly: they go through [`Storage`], so that tests can
//! swap in a fault-injecting implementation (power loss, torn writes, failed syncs, a full
//! disk) and check what survives: `testing::fault`, behind the `testing` feature.
//! [`StdStorage`] is the real thing. Assumptions about the
//! media, as the on-disk format relies on them: data is durable only after `sync_data`
//! returns; a new or removed file is durable only after `sync_dir` of its directory; a
//! write that was in flight at a crash may be torn at any byte.

mod std_storage;

pub use std_storage::StdStorage;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A directory tree of files, real or simulated.
pub trait Storage: Send + Sync + 'static {
    /// Opens a file for reading and writing, creating it (empty) when `create` is set.
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn StorageFile>>;
    /// Removes a file (durable after `sync_dir`).
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Renames a file (durable after `sync_dir`).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// The files directly inside `dir`, sorted by name.
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>>;
    /// Creates `dir` and its parents if missing.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Makes creations, removals and renames inside `dir` durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Opens an existing file for synchronous direct writes (`O_DIRECT | O_DSYNC`): a
    /// write through the returned handle is durable when it returns, and its offset, length
    /// and buffer address must be multiples of [`DIRECT_ALIGN`]. `None` when the storage or
    /// file system has no such mode; callers then write and `sync_data` as usual.
    fn open_direct(&self, _path: &Path) -> io::Result<Option<Arc<dyn StorageFile>>> {
        Ok(None)
    }
}

/// Alignment of offsets, lengths and buffers of direct writes (see [`Storage::open_direct`]).
pub const DIRECT_ALIGN: usize = 4096;

/// One open file, shared by threads: every call takes an explicit offset.
#[allow(clippy::len_without_is_empty)]
pub trait StorageFile: Send + Sync {
    /// Reads up to `buf.len()` bytes at `offset`; returns the count (0 at end of file).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Writes all of `buf` at `offset`.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes the data written so far durable (fdatasync).
    fn sync_data(&self) -> io::Result<()>;
    /// Makes data and metadata durable (fsync).
    fn sync_all(&self) -> io::Result<()>;
    /// The current length.
    fn len(&self) -> io::Result<u64>;
    /// Grows or shrinks the file.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Reserves `len` bytes and zero-fills them once, so later syncs flush no metadata.
    fn preallocate(&self, len: u64) -> io::Result<()> {
        let current = self.len()?;
        if current >= len {
            return Ok(());
        }
        let zeros = vec![0u8; 1 << 20];
        let mut offset = current;
        while offset < len {
            let n = ((len - offset) as usize).min(zeros.len());
            self.write_all_at(&zeros[..n], offset)?;
            offset += n as u64;
        }
        self.sync_all()
    }
    /// Reads exactly `buf.len()` bytes at `offset`, failing on a short file.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let n = self.read_at(&mut buf[done..], offset + done as u64)?;
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short read"));
            }
            done += n;
        }
        Ok(())
    }
    /// The raw descriptor when this is a real file (for mmap); `None` when simulated.
    fn raw_fd(&self) -> Option<i32> {
        None
    }
}

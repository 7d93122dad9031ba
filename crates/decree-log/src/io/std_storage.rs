//! The real file system.

use super::{Storage, StorageFile};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `Storage` backed by the operating system's files.
#[derive(Debug, Default, Clone, Copy)]
pub struct StdStorage;

impl Storage for StdStorage {
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn StorageFile>> {
        let file = OpenOptions::new().read(true).write(true).create(create).truncate(false).open(path)?;
        Ok(Arc::new(StdFile { file }))
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                out.push(entry.path());
            }
        }
        out.sort();
        Ok(out)
    }
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
    fn open_direct(&self, path: &Path) -> io::Result<Option<Arc<dyn StorageFile>>> {
        use std::os::unix::fs::OpenOptionsExt;
        let opened =
            OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT | libc::O_DSYNC).open(path);
        match opened {
            Ok(file) => Ok(Some(Arc::new(StdFile { file }))),
            // tmpfs and some other file systems refuse O_DIRECT.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

struct StdFile {
    file: File,
}

impl StorageFile for StdFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.file.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn sync_all(&self) -> io::Result<()> {
        self.file.sync_all()
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }
    fn preallocate(&self, len: u64) -> io::Result<()> {
        let current = self.len()?;
        if current >= len {
            return Ok(());
        }
        // fallocate reserves the blocks; writing zeros once marks the extents written, so
        // later fdatasync calls need not update metadata for unwritten extents.
        let fd = self.file.as_raw_fd();
        let rc = unsafe { libc::fallocate(fd, 0, current as libc::off_t, (len - current) as libc::off_t) };
        if rc != 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EOPNOTSUPP) {
                return Err(err);
            }
        }
        let zeros = vec![0u8; 1 << 20];
        let mut offset = current;
        while offset < len {
            let n = ((len - offset) as usize).min(zeros.len());
            self.file.write_all_at(&zeros[..n], offset)?;
            offset += n as u64;
        }
        self.file.sync_all()
    }
    fn raw_fd(&self) -> Option<i32> {
        Some(self.file.as_raw_fd())
    }
}

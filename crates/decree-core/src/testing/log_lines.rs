//! The log lines a piece of code writes, captured as text: tests that check what a line
//! names (the trace of a recovered transaction).

use parking_lot::Mutex;
use std::sync::Arc;

/// Where the subscriber writes: one shared buffer.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Buffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What `f` returns, and the lines written under a plain-text subscriber while it ran
/// (on this thread).
pub fn lines_of<T>(f: impl FnOnce() -> T) -> (T, String) {
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt().with_ansi(false).with_writer(move || writer.clone()).finish();
    let result = tracing::subscriber::with_default(subscriber, f);
    let bytes = buffer.0.lock().clone();
    (result, String::from_utf8_lossy(&bytes).into_owned())
}

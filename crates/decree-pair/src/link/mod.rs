//! The replication link's runtime: the primary's [`leader`] dials its backup's
//! [`follower`], and both obey the rules of [`crate::rules`] for every frame.
//!
//! Not here: the server (which decides when a member leads, feeds the leader its records
//! and waits on the tickets the follower's acknowledgements confirm) and TLS on the link
//! (issue 19). Both sides read frames with [`read_message`], which holds at most one frame
//! of [`crate::wire::LINK_FRAME_BYTES_MAX`] bytes, and write them through one writer task
//! fed by a bounded channel.

pub mod follower;
pub mod leader;

use crate::wire::{LinkError, LinkMessage, LINK_FRAME_BYTES_MAX};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// Frames queued for one link's writer at most: a peer that stops reading stops its
/// sender, it does not fill memory.
pub const OUTGOING_FRAMES_MAX: usize = 64;

/// Why a link ended.
#[derive(Debug, thiserror::Error)]
pub enum LinkEnd {
    /// The peer closed or the socket failed.
    #[error("link closed: {0}")]
    Closed(String),
    /// The peer sent a frame that does not parse, or one the rules call a protocol error.
    #[error("{0}")]
    Protocol(String),
    /// The log or the state file failed: the member stops (fail-stop).
    #[error("{0}")]
    Storage(String),
    /// The member was deposed by a newer epoch (a leader) or told to stop.
    #[error("{0}")]
    Stopped(String),
}

impl From<LinkError> for LinkEnd {
    fn from(e: LinkError) -> Self {
        LinkEnd::Protocol(e.to_string())
    }
}

/// Reads the next frame into `buf` (which keeps bytes of the frame after it).
pub async fn read_message<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
) -> Result<LinkMessage, LinkEnd> {
    loop {
        if let Some((message, used)) = LinkMessage::decode(buf)? {
            buf.drain(..used);
            return Ok(message);
        }
        let mut chunk = [0u8; 16 << 10];
        let n = reader.read(&mut chunk).await.map_err(|e| LinkEnd::Closed(e.to_string()))?;
        if n == 0 {
            return Err(LinkEnd::Closed("the peer closed the link".into()));
        }
        assert!(buf.len() + n <= LINK_FRAME_BYTES_MAX + chunk.len(), "decode refuses longer frames first");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The writer task of one link: sends what the channel brings until it closes or fails.
pub fn spawn_writer<W: AsyncWrite + Unpin + Send + 'static>(mut writer: W) -> mpsc::Sender<LinkMessage> {
    let (tx, mut rx) = mpsc::channel::<LinkMessage>(OUTGOING_FRAMES_MAX);
    tokio::spawn(async move {
        let mut out = Vec::new();
        while let Some(message) = rx.recv().await {
            out.clear();
            message.encode(&mut out);
            while let Ok(next) = rx.try_recv() {
                next.encode(&mut out);
                if out.len() >= 64 << 10 {
                    break;
                }
            }
            if writer.write_all(&out).await.is_err() || writer.flush().await.is_err() {
                return;
            }
        }
        let _ = writer.shutdown().await;
    });
    tx
}

#[cfg(test)]
mod tests;

//! The replication link's runtime: the primary's [`leader`] dials its backup's
//! [`follower`], and both obey the rules of [`crate::rules`] for every frame.
//!
//! Not here: the server (which decides when a member leads, feeds the leader its records
//! and waits on the tickets the follower's acknowledgements confirm) and the certificates
//! of TLS on the link: a [`Transport`] given by the server turns each TCP connection into
//! the stream the frames go over (TLS with the pair's certificates, or plaintext on
//! loopback), so this crate holds no cryptography. Both sides read frames with
//! [`read_message`], which holds at most one frame of [`crate::wire::LINK_FRAME_BYTES_MAX`]
//! bytes, and write them through one writer task fed by a bounded channel.
//!
//! What each end does with a frame is sans-IO ([`LinkStep`]): [`leader::Leader::on_frame`]
//! and [`follower::Follower::on_frame`] take a frame and return the frames to send, and
//! the tokio loops here only move bytes and wake-ups, so that a simulation on one thread
//! runs the same steps with a virtual network and clock.

mod dialled;
pub mod follower;
pub mod leader;
pub mod stall;

use crate::wire::{LinkError, LinkMessage, LINK_FRAME_BYTES_MAX};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// A byte stream a link's frames can go over.
pub trait LinkIo: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> LinkIo for T {}

/// The stream of one link, once its transport has opened it.
pub type LinkStream = Box<dyn LinkIo>;

/// A transport's opening of one connection: the stream, or why the peer was refused.
pub type Opening = Pin<Box<dyn Future<Output = Result<LinkStream, String>> + Send>>;

/// How a link's TCP connection becomes the stream its frames go over, on each side. The
/// server's TLS transport proves each member to the other by certificate here, before any
/// frame is read: a peer it refuses never reaches the rules or the log.
pub trait Transport: Send + Sync {
    /// The primary's side, on a connection it dialled.
    fn dial(&self, stream: TcpStream) -> Opening;
    /// The backup's side, on a connection it accepted from `from`.
    fn accept(&self, stream: TcpStream, from: SocketAddr) -> Opening;
    /// What a failed read or write of an open link means (a TLS alert from the peer, for
    /// example), for the link's end reason.
    fn explain(&self, error: &std::io::Error) -> String {
        error.to_string()
    }
}

/// How long an idle link waits before TCP probes its peer, the probes' interval and count,
/// and how long data sent may stay unacknowledged by the peer's kernel: a peer whose
/// machine lost power, or a path that broke, ends the link within about
/// [`LINK_SILENCE_MAX`] on both ends (the primary's `ACK_TIMEOUT` covers its end at the
/// protocol's level too; a backup has no other way to notice).
const KEEPALIVE_IDLE: std::time::Duration = std::time::Duration::from_secs(2);
const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
const KEEPALIVE_PROBES: u32 = 3;

/// The longest a dead peer keeps a link open at the TCP level.
pub const LINK_SILENCE_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// Sets a link connection's socket options: no Nagle delay, keepalive probes and a user
/// timeout, so that a half-open connection ends instead of holding the link forever
/// (issue 32, defect 6). A failure to set them is logged, not fatal.
pub(crate) fn tune(stream: &tokio::net::TcpStream) {
    let _ = stream.set_nodelay(true);
    let socket = socket2::SockRef::from(stream);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    if let Err(e) = socket.set_tcp_keepalive(&keepalive) {
        tracing::warn!(error = %e, "the link's TCP keepalive could not be set");
    }
    if let Err(e) = socket.set_tcp_user_timeout(Some(LINK_SILENCE_MAX)) {
        tracing::warn!(error = %e, "the link's TCP_USER_TIMEOUT could not be set");
    }
}

/// Whether a peer's `Hello` naming `node` and `member` may come from this pair's other
/// member: the same node, the other member id (issue 32, defects 7 and 11).
pub(crate) fn check_peer(
    own_node: u32,
    own_member: crate::epoch::MemberId,
    node: u32,
    member: crate::epoch::MemberId,
) -> Result<(), LinkEnd> {
    if node == own_node && member != own_member {
        return Ok(());
    }
    Err(LinkEnd::Protocol(format!(
        "a hello names node {node}, member {}: this is member {} of node {own_node}",
        member.get(),
        own_member.get()
    )))
}

/// What a member's status says of its link.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkReport {
    /// A link is open, past its transport's checks.
    pub connected: bool,
    /// Why the last link ended or could not open, if one did.
    pub last_end: Option<String>,
    /// Links opened since this end started.
    pub opens_total: u64,
    /// Links that ended, and openings that failed or were refused, since this end started.
    pub ends_total: u64,
}

impl LinkReport {
    /// A report that goes on counting from `earlier`'s totals (the member's previous role's
    /// end of the link), with no link open.
    pub fn continuing(earlier: &LinkReport) -> LinkReport {
        LinkReport {
            connected: false,
            last_end: earlier.last_end.clone(),
            opens_total: earlier.opens_total,
            ends_total: earlier.ends_total,
        }
    }

    /// Notes an open link.
    pub fn opened(&mut self) {
        self.connected = true;
        self.opens_total += 1;
    }

    /// Notes the end of the open link (or a failed opening when none is open), and why.
    pub fn ended(&mut self, why: String) {
        self.connected = false;
        self.last_end = Some(why);
        self.ends_total += 1;
    }

    /// Notes a peer refused while opening: the link being served, if one is, stays open.
    pub fn refused(&mut self, why: String) {
        self.last_end = Some(why);
        self.ends_total += 1;
    }
}

/// Frames over plain TCP: a link on loopback, or on a network the operator declared
/// trusted (`insecure_plaintext`).
pub struct Plaintext;

impl Transport for Plaintext {
    fn dial(&self, stream: TcpStream) -> Opening {
        Box::pin(async move { Ok(Box::new(stream) as LinkStream) })
    }
    fn accept(&self, stream: TcpStream, _from: SocketAddr) -> Opening {
        Box::pin(async move {
            // A link frame starts with its length, whose first byte is 0 (frames are at
            // most 4 MiB); a TLS handshake record starts with 0x16. Both ends speak first,
            // so the peek returns at once.
            let mut first = [0u8; 1];
            match stream.peek(&mut first).await {
                Ok(0) => Err("the peer closed the link before its first frame".to_string()),
                Ok(_) if first[0] == TLS_HANDSHAKE_RECORD => {
                    Err("the peer speaks TLS on the link (a member \
                     with [pair.tls]) and this member has none: give both members the same [pair.tls]"
                        .to_string())
                }
                Ok(_) => Ok(Box::new(stream) as LinkStream),
                Err(e) => Err(e.to_string()),
            }
        })
    }
}

/// The first byte of a TLS connection (a handshake record).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

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
    /// The transport refused the peer (its certificate), or the peer refused this member.
    #[error("{0}")]
    Refused(String),
    /// The log or the state file failed: the member stops (fail-stop).
    #[error("{0}")]
    Storage(String),
    /// The member was deposed by a newer epoch (a leader) or told to stop.
    #[error("{0}")]
    Stopped(String),
}

/// What one sans-IO step of either end asks its runtime to do: send these frames, in
/// order, then end the link if `end` says so. The tokio runtime of this module and the
/// simulator (`decree-sim`) carry out the same steps.
#[derive(Debug, Default)]
pub struct LinkStep {
    /// Frames to send, in order.
    pub send: Vec<LinkMessage>,
    /// The link ends, after `send` is sent.
    pub end: Option<LinkEnd>,
}

impl LinkStep {
    /// This step's frames, then the end of the link.
    pub(crate) fn ends(mut self, end: LinkEnd) -> LinkStep {
        self.end = Some(end);
        self
    }
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
    transport: &dyn Transport,
) -> Result<LinkMessage, LinkEnd> {
    loop {
        if let Some((message, used)) = LinkMessage::decode(buf)? {
            buf.drain(..used);
            return Ok(message);
        }
        let mut chunk = [0u8; 16 << 10];
        let n = reader.read(&mut chunk).await.map_err(|e| LinkEnd::Closed(transport.explain(&e)))?;
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

//! The pair's shared secret on a plaintext link (`pair.secret_file`): each member proves
//! to the other that it holds the secret before any link frame is read (issue 32, defect
//! 11: without it, any local user could send a `Hello` with a newer epoch and depose the
//! primary, or inject decisions into the backup).
//!
//! The opening is a challenge and response both ways, with HMAC-SHA256 over fresh nonces
//! of both ends, so that nothing seen on one opening proves anything on another, and the
//! dialler proves itself only after the listener has (a listener that cannot prove the
//! secret learns nothing it could replay). What the frames are is in `docs/replication.md`,
//! "Authentication", with vectors in `docs/vectors/link.json`.
//!
//! This authenticates the opening, not every frame: on loopback, where it may be used, no
//! other user can write into an established TCP connection. Across machines the link needs
//! TLS (`link_tls.rs`), which protects every byte.

use crate::config::ConfigError;
use decree_pair::link::{LinkStream, Opening, Transport};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Bytes of a nonce, and of a MAC (HMAC-SHA256).
pub const NONCE_BYTES: usize = 32;
const MAC_BYTES: usize = 32;

/// The shortest secret accepted: 32 bytes, as many as the MAC's key strength.
pub const SECRET_BYTES_MIN: usize = 32;

/// The version byte of the authentication frames: the link's own.
const VERSION: u8 = 1;

/// What the listener's MAC covers after its label: the dialler's nonce, then its own.
const LISTENER_LABEL: &[u8] = b"decree link listener";
/// What the dialler's MAC covers after its label: the listener's nonce, then its own. The
/// two labels differ so that neither end's proof can be reflected as the other's.
const DIALLER_LABEL: &[u8] = b"decree link dialler";

/// Body bytes of the largest authentication frame (`Proof`).
const AUTH_BODY_BYTES_MAX: usize = NONCE_BYTES + MAC_BYTES;

/// The frames of an opening, in the link's framing (length, version, type, body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthFrame {
    /// Dialler to listener, first: the dialler's nonce.
    Challenge { nonce: [u8; NONCE_BYTES] },
    /// Listener to dialler: the listener's nonce and its MAC over both nonces.
    Proof { nonce: [u8; NONCE_BYTES], mac: [u8; MAC_BYTES] },
    /// Dialler to listener, once the listener proved itself: the dialler's MAC.
    Answer { mac: [u8; MAC_BYTES] },
    /// Listener to dialler, last: whether the dialler's MAC was right.
    Verdict { accepted: bool },
}

impl AuthFrame {
    fn kind(&self) -> u8 {
        match self {
            AuthFrame::Challenge { .. } => 16,
            AuthFrame::Proof { .. } => 17,
            AuthFrame::Answer { .. } => 18,
            AuthFrame::Verdict { .. } => 19,
        }
    }

    /// The frame's bytes, length prefix included.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(AUTH_BODY_BYTES_MAX);
        match self {
            AuthFrame::Challenge { nonce } => body.extend_from_slice(nonce),
            AuthFrame::Proof { nonce, mac } => {
                body.extend_from_slice(nonce);
                body.extend_from_slice(mac);
            }
            AuthFrame::Answer { mac } => body.extend_from_slice(mac),
            AuthFrame::Verdict { accepted } => body.push(u8::from(*accepted)),
        }
        let mut out = Vec::with_capacity(6 + body.len());
        out.extend_from_slice(&(2 + body.len() as u32).to_be_bytes());
        out.push(VERSION);
        out.push(self.kind());
        out.extend_from_slice(&body);
        out
    }

    /// Reads a frame from what follows its length prefix (`version`, `type`, body).
    pub fn decode(rest: &[u8]) -> Result<AuthFrame, String> {
        let [version, kind, body @ ..] = rest else {
            return Err("a frame of fewer than 2 bytes".into());
        };
        if *version != VERSION {
            return Err(format!("link version {version}; this member speaks {VERSION}"));
        }
        let wrong = |what: &str| format!("a {what} frame of {} body bytes", body.len());
        match kind {
            16 => Ok(AuthFrame::Challenge { nonce: body.try_into().map_err(|_| wrong("Challenge"))? }),
            17 if body.len() == NONCE_BYTES + MAC_BYTES => Ok(AuthFrame::Proof {
                nonce: body[..NONCE_BYTES].try_into().expect("length checked"),
                mac: body[NONCE_BYTES..].try_into().expect("length checked"),
            }),
            17 => Err(wrong("Proof")),
            18 => Ok(AuthFrame::Answer { mac: body.try_into().map_err(|_| wrong("Answer"))? }),
            19 => match body {
                [0] => Ok(AuthFrame::Verdict { accepted: false }),
                [1] => Ok(AuthFrame::Verdict { accepted: true }),
                _ => Err(wrong("Verdict")),
            },
            1..=5 => Err(format!(
                "a link frame (type {kind}) before any proof of the pair's secret: the peer has no \
                 pair.secret_file (give both members the same one), or runs a decree older than the link's \
                 authentication"
            )),
            other => Err(format!("an unknown frame type {other} where an authentication frame belongs")),
        }
    }
}

/// What the listener signs: its label, the dialler's nonce, then its own.
pub fn listener_signs(dialler: &[u8; NONCE_BYTES], listener: &[u8; NONCE_BYTES]) -> Vec<u8> {
    [LISTENER_LABEL, dialler, listener].concat()
}

/// What the dialler signs: its label, the listener's nonce, then its own.
pub fn dialler_signs(dialler: &[u8; NONCE_BYTES], listener: &[u8; NONCE_BYTES]) -> Vec<u8> {
    [DIALLER_LABEL, listener, dialler].concat()
}

/// HMAC-SHA256 of `signed` under the pair's key.
pub fn mac(key: &hmac::Key, signed: &[u8]) -> [u8; MAC_BYTES] {
    hmac::sign(key, signed).as_ref().try_into().expect("HMAC-SHA256 is 32 bytes")
}

/// Whether `tag` is the MAC of `signed` (compared in constant time).
fn verified(key: &hmac::Key, signed: &[u8], tag: &[u8; MAC_BYTES]) -> bool {
    hmac::verify(key, signed, tag).is_ok()
}

/// A plaintext link authenticated by the pair's secret.
pub struct LinkSecret {
    pub(crate) key: hmac::Key,
    random: SystemRandom,
}

impl LinkSecret {
    /// Reads the secret from `path`, which only its owner may read.
    pub fn load(path: &Path) -> Result<LinkSecret, ConfigError> {
        let named = |what: String| ConfigError(format!("pair.secret_file {}: {what}", path.display()));
        let metadata = std::fs::metadata(path).map_err(|e| named(format!("cannot be read: {e}")))?;
        let mode = metadata.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(named(format!(
                "other users may read it (mode {mode:04o}): `chmod 600` it, since whoever reads it can \
                 act as this pair's member"
            )));
        }
        let bytes = std::fs::read(path).map_err(|e| named(format!("cannot be read: {e}")))?;
        LinkSecret::from_secret(bytes.trim_ascii()).map_err(named)
    }

    /// The transport for `secret` (surrounding whitespace already removed).
    pub fn from_secret(secret: &[u8]) -> Result<LinkSecret, String> {
        if secret.len() < SECRET_BYTES_MIN {
            return Err(format!(
                "{} bytes of secret; at least {SECRET_BYTES_MIN} are needed (make one with \
                 `head -c 32 /dev/urandom | base64 > FILE && chmod 600 FILE` and copy it to the other member)",
                secret.len()
            ));
        }
        Ok(LinkSecret { key: hmac::Key::new(hmac::HMAC_SHA256, secret), random: SystemRandom::new() })
    }

    fn nonce(&self) -> Result<[u8; NONCE_BYTES], String> {
        let mut nonce = [0u8; NONCE_BYTES];
        self.random.fill(&mut nonce).map_err(|_| "the system's random source failed".to_string())?;
        Ok(nonce)
    }

    async fn dial_opening(self: Arc<Self>, mut stream: TcpStream) -> Result<LinkStream, String> {
        let ours = self.nonce()?;
        write_frame(&mut stream, &AuthFrame::Challenge { nonce: ours }).await?;
        let AuthFrame::Proof { nonce: theirs, mac: proof } = read_frame(&mut stream).await? else {
            return Err("the peer answered the challenge with another frame than its proof".into());
        };
        if !verified(&self.key, &listener_signs(&ours, &theirs), &proof) {
            return Err(
                "the peer could not prove the pair's secret: its pair.secret_file differs from this \
                        member's, or it is not this pair's member"
                    .into(),
            );
        }
        write_frame(&mut stream, &AuthFrame::Answer { mac: mac(&self.key, &dialler_signs(&ours, &theirs)) })
            .await?;
        match read_frame(&mut stream).await? {
            AuthFrame::Verdict { accepted: true } => Ok(Box::new(stream) as LinkStream),
            AuthFrame::Verdict { accepted: false } => {
                Err("the peer refused this member's proof of the pair's \
                                                           secret: the two members' pair.secret_file differ"
                    .into())
            }
            _ => Err("the peer answered the proof with another frame than its verdict".into()),
        }
    }

    async fn accept_opening(self: Arc<Self>, mut stream: TcpStream) -> Result<LinkStream, String> {
        let AuthFrame::Challenge { nonce: theirs } = read_frame(&mut stream).await? else {
            return Err("the peer's first frame is not a challenge".into());
        };
        let ours = self.nonce()?;
        let proof = AuthFrame::Proof { nonce: ours, mac: mac(&self.key, &listener_signs(&theirs, &ours)) };
        write_frame(&mut stream, &proof).await?;
        let AuthFrame::Answer { mac: answer } = read_frame(&mut stream).await? else {
            return Err("the peer answered the proof with another frame than its own".into());
        };
        let accepted = verified(&self.key, &dialler_signs(&theirs, &ours), &answer);
        write_frame(&mut stream, &AuthFrame::Verdict { accepted }).await?;
        if !accepted {
            return Err(
                "the peer's proof of the pair's secret is wrong: its pair.secret_file differs from this \
                        member's, or it is not this pair's member"
                    .into(),
            );
        }
        Ok(Box::new(stream) as LinkStream)
    }
}

/// Reads one authentication frame, and no byte after it.
async fn read_frame(stream: &mut TcpStream) -> Result<AuthFrame, String> {
    let mut length = [0u8; 4];
    stream.read_exact(&mut length).await.map_err(|e| closed_while_opening(&e))?;
    if length[0] == TLS_HANDSHAKE_RECORD {
        return Err("the peer speaks TLS on the link (a member with [pair.tls]) and this member has \
                    pair.secret_file: give both members the same [pair.tls], or both the same secret"
            .into());
    }
    let length = u32::from_be_bytes(length) as usize;
    if !(2..=2 + AUTH_BODY_BYTES_MAX).contains(&length) {
        return Err(format!(
            "a frame of {length} bytes where an authentication frame (at most {}) belongs: the peer has no \
             pair.secret_file, or is not a decree pair member",
            2 + AUTH_BODY_BYTES_MAX
        ));
    }
    let mut rest = vec![0u8; length];
    stream.read_exact(&mut rest).await.map_err(|e| closed_while_opening(&e))?;
    AuthFrame::decode(&rest)
}

async fn write_frame(stream: &mut TcpStream, frame: &AuthFrame) -> Result<(), String> {
    stream.write_all(&frame.encode()).await.map_err(|e| closed_while_opening(&e))
}

fn closed_while_opening(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => {
            "the peer closed the link while proving the pair's secret".into()
        }
        _ => format!("the link failed while proving the pair's secret: {e}"),
    }
}

/// The first byte of a TLS connection (a handshake record).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// The transport handed to the link's ends: the secret behind an `Arc`, since each opening
/// runs in a task of its own.
pub struct SharedSecret(pub Arc<LinkSecret>);

impl Transport for SharedSecret {
    fn dial(&self, stream: TcpStream) -> Opening {
        Box::pin(self.0.clone().dial_opening(stream))
    }
    fn accept(&self, stream: TcpStream, _from: SocketAddr) -> Opening {
        Box::pin(self.0.clone().accept_opening(stream))
    }
}

#[cfg(test)]
mod tests;

//! Whether a session's connection is still open, asked without blocking before a `Decide`
//! is written (docs/protocol.md, "What a client does", step 5).
//!
//! A server that restarted or closed the session (an idle timeout) has closed its end: the
//! socket is readable and a peek reads the end of the stream, or a reset. A `Decide`
//! written then would be lost unread, and the client could only say "unknown" and wait for
//! the server's recovery; checking first lets it say "rolled back" and free the branches at
//! once. A readable socket that holds bytes proves nothing either way (for TLS they may be
//! a close alert): the write goes ahead, and a lost answer is asked with `Outcome` later.

use std::os::fd::RawFd;

/// Why the connection on `fd` is known to be closed by the server; `None` when it may be
/// open (nothing to read, or bytes waiting).
pub(crate) fn ended(fd: RawFd) -> Option<String> {
    let mut byte = [0u8; 1];
    // SAFETY: a valid descriptor owned by the caller and a one-byte buffer that outlives
    // the call; MSG_PEEK leaves the byte (if any) in the socket.
    let n = unsafe { libc::recv(fd, byte.as_mut_ptr().cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    match n {
        0 => Some("the server closed the session (end of stream) before the decision was written".into()),
        n if n > 0 => None,
        _ => {
            let e = std::io::Error::last_os_error();
            match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => None,
                _ => Some(format!("the session's connection failed before the decision was written: {e}")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn an_open_quiet_or_talking_peer_is_not_ended_and_a_closed_one_is() {
        let (a, mut b) = UnixStream::pair().unwrap();
        assert_eq!(ended(a.as_raw_fd()), None, "quiet");
        b.write_all(b"x").unwrap();
        assert_eq!(ended(a.as_raw_fd()), None, "bytes waiting prove nothing");
        drop(b);
        assert_eq!(ended(a.as_raw_fd()), None, "the waiting byte comes first");
        let (c, d) = UnixStream::pair().unwrap();
        drop(d);
        let why = ended(c.as_raw_fd()).expect("closed");
        assert!(why.contains("end of stream"), "{why}");
        let (e, f) = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| Ok((std::net::TcpStream::connect(l.local_addr()?)?, l.accept()?.0)))
            .unwrap();
        assert_eq!(ended(e.as_raw_fd()), None);
        f.shutdown(std::net::Shutdown::Write).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(ended(e.as_raw_fd()).is_some(), "a FIN is the end");
    }
}

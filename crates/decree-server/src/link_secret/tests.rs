//! The pair secret's opening: the vectors of `docs/vectors/link.json` (written by Python's
//! `hmac`, not this code), and openings over real loopback sockets with the right secret, a
//! wrong one, none, and TLS.

use super::*;
use serde_json::Value;
use tokio::net::TcpListener;

fn vectors() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/vectors/link.json");
    let all: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("vector file")).expect("JSON");
    all["authentication"].clone()
}

fn bytes<const N: usize>(v: &Value, field: &str) -> [u8; N] {
    hex::decode(v[field].as_str().unwrap_or_else(|| panic!("{field} missing"))).unwrap().try_into().unwrap()
}

#[test]
fn the_vectors_frames_and_macs_are_what_this_code_computes() {
    let v = vectors();
    let secret = LinkSecret::from_secret(v["secret"].as_str().unwrap().as_bytes()).unwrap();
    let (dialler, listener) = (bytes::<32>(&v, "dialler_nonce"), bytes::<32>(&v, "listener_nonce"));
    let listener_tag = mac(&secret.key, &listener_signs(&dialler, &listener));
    let dialler_tag = mac(&secret.key, &dialler_signs(&dialler, &listener));
    assert_eq!(listener_tag, bytes::<32>(&v, "listener_mac"));
    assert_eq!(dialler_tag, bytes::<32>(&v, "dialler_mac"));
    assert_ne!(listener_tag, dialler_tag, "the labels keep the two proofs apart");
    let expected = [
        AuthFrame::Challenge { nonce: dialler },
        AuthFrame::Proof { nonce: listener, mac: listener_tag },
        AuthFrame::Answer { mac: dialler_tag },
        AuthFrame::Verdict { accepted: true },
        AuthFrame::Verdict { accepted: false },
    ];
    let frames = v["frames"].as_array().unwrap();
    assert_eq!(frames.len(), expected.len());
    for (vector, frame) in frames.iter().zip(expected) {
        let stored = hex::decode(vector["hex"].as_str().unwrap()).unwrap();
        assert_eq!(frame.encode(), stored, "{}", vector["name"]);
        assert_eq!(AuthFrame::decode(&stored[4..]).unwrap(), frame, "{}", vector["name"]);
    }
    for vector in v["invalid"].as_array().unwrap() {
        let stored = hex::decode(vector["hex"].as_str().unwrap()).unwrap();
        let error = AuthFrame::decode(&stored[4..]).unwrap_err();
        assert!(error.contains(vector["error"].as_str().unwrap()), "{}: {error}", vector["name"]);
    }
}

#[test]
fn decoding_any_short_or_odd_frame_is_an_error_not_a_panic() {
    for length in 0..80 {
        for kind in [0u8, 1, 5, 16, 17, 18, 19, 20, 255] {
            let mut rest = vec![1, kind];
            rest.resize(length.max(2), 0xab);
            rest.truncate(length);
            let _ = AuthFrame::decode(&rest);
        }
    }
    assert!(AuthFrame::decode(&[2, 16]).unwrap_err().contains("version 2"));
}

fn secret(text: &str) -> Arc<LinkSecret> {
    Arc::new(LinkSecret::from_secret(text.as_bytes()).unwrap())
}

const RIGHT: &str = "the-pair-secret-of-this-test-0123456789";
const WRONG: &str = "another-secret-of-the-same-length-012345";

/// Opens one connection between a dialler with `dialler` and a listener with `listener`,
/// and gives both ends' results; an opened pair carries a byte each way.
async fn open(
    dialler: Arc<LinkSecret>,
    listener: Arc<LinkSecret>,
) -> (Result<(), String>, Result<(), String>) {
    let socket = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let accepting = tokio::spawn(async move {
        let (stream, from) = socket.accept().await.unwrap();
        let mut opened = SharedSecret(listener).accept(stream, from).await?;
        opened.write_all(b"L").await.unwrap();
        let mut byte = [0u8; 1];
        opened.read_exact(&mut byte).await.unwrap();
        assert_eq!(&byte, b"D");
        Ok(())
    });
    let dialled = async {
        let stream = TcpStream::connect(addr).await.unwrap();
        let mut opened = SharedSecret(dialler).dial(stream).await?;
        opened.write_all(b"D").await.unwrap();
        let mut byte = [0u8; 1];
        opened.read_exact(&mut byte).await.unwrap();
        assert_eq!(&byte, b"L");
        Ok(())
    }
    .await;
    (dialled, accepting.await.unwrap())
}

#[tokio::test]
async fn members_with_the_same_secret_open_the_link() {
    let (dialled, accepted) = open(secret(RIGHT), secret(RIGHT)).await;
    assert_eq!(dialled, Ok(()));
    assert_eq!(accepted, Ok(()));
}

#[tokio::test]
async fn a_wrong_secret_is_refused_on_both_ends_with_the_reason() {
    let (dialled, accepted) = open(secret(WRONG), secret(RIGHT)).await;
    // The dialler checks the listener's proof first and stops there: it never proves
    // anything to a listener that could not prove the secret.
    let dialled = dialled.unwrap_err();
    assert!(dialled.contains("could not prove the pair's secret"), "{dialled}");
    let accepted = accepted.unwrap_err();
    assert!(accepted.contains("closed the link while proving"), "{accepted}");
}

/// A listener with the right secret accepting one connection, and that connection: the
/// test speaks for the dialler by hand.
async fn listener_with_the_right_secret() -> (TcpStream, tokio::task::JoinHandle<Result<(), String>>) {
    let socket = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let accepting = tokio::spawn(async move {
        let (stream, from) = socket.accept().await.unwrap();
        SharedSecret(secret(RIGHT)).accept(stream, from).await.map(|_| ())
    });
    (TcpStream::connect(addr).await.unwrap(), accepting)
}

#[tokio::test]
async fn a_dialler_that_answers_wrongly_gets_a_refusal_verdict() {
    // A dialler that skips the listener's proof and answers with a made-up MAC.
    let (mut stream, accepting) = listener_with_the_right_secret().await;
    write_frame(&mut stream, &AuthFrame::Challenge { nonce: [7; NONCE_BYTES] }).await.unwrap();
    assert!(matches!(read_frame(&mut stream).await.unwrap(), AuthFrame::Proof { .. }));
    write_frame(&mut stream, &AuthFrame::Answer { mac: [9; 32] }).await.unwrap();
    assert_eq!(read_frame(&mut stream).await.unwrap(), AuthFrame::Verdict { accepted: false });
    let refused = accepting.await.unwrap().unwrap_err();
    assert!(refused.contains("proof of the pair's secret is wrong"), "{refused}");
}

#[tokio::test]
async fn a_hello_without_proof_and_a_tls_handshake_are_refused_by_name() {
    let hello = hex::decode("00000017010100000000000003010100000007000000000000000c").unwrap();
    for (first, expected) in [
        (hello, "before any proof of the pair's secret"),
        (vec![0x16, 3, 1, 0, 200, 1], "speaks TLS"),
        (vec![0, 1, 0, 0, 1, 1], "where an authentication frame"),
    ] {
        let (mut stream, accepting) = listener_with_the_right_secret().await;
        stream.write_all(&first).await.unwrap();
        let refused = accepting.await.unwrap().unwrap_err();
        assert!(refused.contains(expected), "{refused}");
    }
}

#[test]
fn a_secret_file_readable_by_others_or_too_short_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pair.secret");
    std::fs::write(&path, format!("{RIGHT}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let open = LinkSecret::load(&path).err().expect("mode 0644 refused").to_string();
    assert!(open.contains("chmod 600") && open.contains("0644"), "{open}");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let loaded = LinkSecret::load(&path).expect("mode 0600 accepted");
    // The trailing newline is not part of the secret: a file written by `echo` and one
    // written without it hold the same secret.
    assert_eq!(mac(&loaded.key, b"x"), mac(&LinkSecret::from_secret(RIGHT.as_bytes()).unwrap().key, b"x"));
    std::fs::write(&path, "short\n").unwrap();
    let short = LinkSecret::load(&path).err().expect("5 bytes refused").to_string();
    assert!(short.contains("5 bytes of secret"), "{short}");
    let missing = LinkSecret::load(&dir.path().join("none")).err().expect("missing refused").to_string();
    assert!(missing.contains("cannot be read"), "{missing}");
}

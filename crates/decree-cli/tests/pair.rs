//! Two `decree serve` processes as a primary + backup pair, promoted by `decree promote`.
//!
//! The bug this guards against: a decision acknowledged by the primary that the promoted
//! backup does not hold after the primary is killed, a backup that serves clients, or a
//! deposed primary that comes back and leads again. Decisions name the dummy resource
//! managers, which the servers finish themselves.

use decree_client::RemoteDecisions;
use decree_core::{BranchRecord, Decision, DecisionStore, Origin, Outcome, Xid};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child killed and reaped when the test ends, so that a failed assertion leaves no
/// server running.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// One member's files: its configuration, log directory and client socket.
struct Member {
    config: PathBuf,
    socket: PathBuf,
}

fn member(dir: &Path, name: &str, id: u8, link: u16, peer_link: u16, peer: &str) -> Member {
    member_with(dir, name, id, link, peer_link, peer, "")
}

/// A member whose configuration ends with `extra` (a `[pair.tls]` section, for example).
fn member_with(dir: &Path, name: &str, id: u8, link: u16, peer_link: u16, peer: &str, extra: &str) -> Member {
    let socket = dir.join(format!("{name}.sock"));
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(
        &config,
        format!(
            "node = 5\nlog_dir = \"{}\"\nengine = \"journal\"\nunix = \"{}\"\n\
             [pair]\nmember = {id}\nlink = \"127.0.0.1:{link}\"\npeer_link = \"127.0.0.1:{peer_link}\"\n\
             peer_clients = \"unix:{}\"\n\
             [[rm]]\nname = \"dummy-0\"\nkind = \"dummy\"\n[[rm]]\nname = \"dummy-1\"\nkind = \"dummy\"\n{extra}",
            dir.join(name).display(),
            socket.display(),
            dir.join(format!("{peer}.sock")).display()
        ),
    )
    .unwrap();
    Member { config, socket }
}

fn serve(m: &Member) -> Reaped {
    // A killed member leaves its socket behind; its successor binds it again (the control
    // socket first, so that once the client socket exists `decree status` is answered).
    let _ = std::fs::remove_file(&m.socket);
    // Its log goes beside its configuration, for a failing run to read.
    let log =
        std::fs::OpenOptions::new().create(true).append(true).open(m.config.with_extension("log")).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_decree"))
        .args(["serve", "-v", "--config"])
        .arg(&m.config)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starts decree serve");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !m.socket.exists() {
        assert!(Instant::now() < deadline, "no socket after 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    Reaped(child)
}

/// Runs `decree <args> --config <m>`; returns (success, stdout + stderr).
fn decree(args: &[&str], m: &Member) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_decree"))
        .args(args)
        .arg("--config")
        .arg(&m.config)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn status(m: &Member) -> serde_json::Value {
    let (ok, text) = decree(&["status"], m);
    let log = std::fs::read_to_string(m.config.with_extension("log")).unwrap_or_default();
    assert!(ok, "{text}\nits log:\n{log}");
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn connect(m: &Member) -> Result<RemoteDecisions, String> {
    RemoteDecisions::connect(&format!("unix:{}", m.socket.display())).map_err(|e| e.to_string())
}

fn decision(store: &RemoteDecisions, session: u64, sequence: u64) -> Decision {
    let xid = Xid::decree(Origin { node: store.node(), incarnation: store.incarnation(), session, sequence });
    let branches = vec![
        BranchRecord { rm: "dummy-0".into(), branch: 0 },
        BranchRecord { rm: "dummy-1".into(), branch: 1 },
    ];
    Decision { xid, branches }
}

#[test]
fn a_promoted_backup_holds_every_decision_the_killed_primary_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let (link_a, link_b) = (free_port(), free_port());
    let a = member(dir.path(), "a", 1, link_a, link_b, "b");
    let b = member(dir.path(), "b", 2, link_b, link_a, "a");
    let mut server_a = serve(&a);
    let _server_b = serve(&b);

    // Both start as backups: neither serves clients, and neither caught up with anyone.
    let why = connect(&b).err().expect("a backup serves no client");
    assert!(why.contains("backup member of a pair") && why.contains("a.sock"), "{why}");
    assert_eq!(status(&a)["role"], "backup");
    let (ok, why) = decree(&["promote"], &a);
    assert!(!ok && why.contains("has not caught up"), "{why}");

    // A new pair's first promotion is forced: nobody holds anything yet.
    let (ok, text) = decree(&["promote", "--force"], &a);
    assert!(ok, "{text}");
    assert!(text.contains("member 1 leads epoch 1.1"), "{text}");
    eventually("the backup caught up", || status(&b)["caught_up"] == true);
    eventually("the primary is strict", || status(&a)["strict"] == true);
    let (ok, why) = decree(&["promote", "--force"], &a);
    assert!(!ok && why.contains("already leads epoch 1.1"), "{why}");

    let store = connect(&a).expect("the primary serves");
    assert_eq!(store.incarnation(), (1 << 8) | 1, "the epoch is the incarnation");
    // A client given both members finds the primary (the backup refuses it first).
    let both = format!("unix:{},unix:{}", b.socket.display(), a.socket.display());
    let follower = RemoteDecisions::connect(&both).expect("whichever member serves");
    assert_eq!(follower.endpoint().to_string(), format!("unix:{}", a.socket.display()));
    let session = store.open_session().unwrap();
    let decided: Vec<Xid> = (1..=50)
        .map(|sequence| {
            let d = decision(&store, session, sequence);
            store.decide(&d).expect("acknowledged with the backup");
            d.xid
        })
        .collect();

    // The first 25 finish (their completions go with the next request of the session):
    // the backup forgets their decisions and remembers their outcomes.
    for xid in &decided[..25] {
        store.complete(xid).unwrap();
    }
    store.decide(&decision(&store, session, 51)).unwrap();
    eventually("the backup forgot the finished decisions", || status(&b)["live_decisions"] == 26);

    // The primary dies; the operator promotes the backup, which caught up.
    server_a.0.kill().unwrap();
    server_a.0.wait().unwrap();
    drop(store);
    let (ok, text) = decree(&["promote"], &b);
    assert!(ok, "{text}");
    assert!(text.contains("member 2 leads epoch 2.2"), "{text}");
    let store = connect(&b).expect("the new primary serves");
    // The unfinished ones from the decisions the backup holds, the finished ones from the
    // outcome memory it received (without it they would be unknown: an earlier epoch's Xid
    // with no decision).
    for xid in &decided {
        assert_eq!(store.outcome(xid).unwrap(), Outcome::Committed, "{xid}");
    }
    // The client given both members asks the new primary, never guessing.
    assert_eq!(follower.outcome(&decided[49]).unwrap(), Outcome::Committed);
    assert_eq!(follower.endpoint().to_string(), format!("unix:{}", b.socket.display()));
    let stale = follower.open_session().expect_err("its Xids would carry the old epoch");
    assert!(stale.to_string().contains("another member of its pair leads now"), "{stale}");
    let session = store.open_session().unwrap();
    store.decide(&decision(&store, session, 1)).expect("the new primary decides alone");

    // The old primary returns: it rejoins as a backup of the newer epoch.
    let _server_a = serve(&a);
    eventually("the old primary rejoined as a caught-up backup", || {
        let s = status(&a);
        s["role"] == "backup" && s["epoch"] == "2.2" && s["caught_up"] == true
    });
    assert!(connect(&a).is_err(), "the old primary serves no client any more");
    eventually("the new primary is strict again", || status(&b)["strict"] == true);
    store.decide(&decision(&store, session, 2)).expect("acknowledged with the rejoined backup");
}

/// A loopback TCP proxy whose link can be cut: while cut, open connections are closed and
/// new ones refused at once.
struct Proxy {
    port: u16,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    open: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Proxy {
    fn start(to: u16) -> Proxy {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let open = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (cut2, open2) = (cut.clone(), open.clone());
        std::thread::spawn(move || {
            for inbound in listener.incoming() {
                let Ok(inbound) = inbound else { continue };
                if cut2.load(Ordering::SeqCst) {
                    continue; // dropped: refused
                }
                let Ok(outbound) = std::net::TcpStream::connect(("127.0.0.1", to)) else { continue };
                let mut tracked = open2.lock().unwrap();
                tracked.push(inbound.try_clone().unwrap());
                tracked.push(outbound.try_clone().unwrap());
                for (mut from, mut into) in
                    [(inbound.try_clone().unwrap(), outbound.try_clone().unwrap()), (outbound, inbound)]
                {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut into);
                        let _ = into.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Proxy { port, cut, open }
    }
    fn set_cut(&self, cut: bool) {
        self.cut.store(cut, std::sync::atomic::Ordering::SeqCst);
        if cut {
            for s in self.open.lock().unwrap().drain(..) {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

/// Decides in a thread (the answer may wait for the backup) and returns its handle.
fn decide_later(
    store: &std::sync::Arc<RemoteDecisions>,
    session: u64,
    sequence: u64,
) -> std::thread::JoinHandle<Xid> {
    let store = store.clone();
    std::thread::spawn(move || {
        let d = decision(&store, session, sequence);
        store.decide(&d).expect("acknowledged once the backup holds it");
        d.xid
    })
}

/// The primary never acknowledges what only its own disk holds: with the link cut, or the
/// backup killed, a decide waits; when the link returns or the backup restarts, the backup
/// catches up and the decide is acknowledged; every acknowledged decision is then on the
/// backup, as its promotion shows.
#[test]
fn a_cut_link_or_a_dead_backup_holds_acknowledgements_until_the_backup_holds_the_decision() {
    let dir = tempfile::tempdir().unwrap();
    let (link_a, link_b) = (free_port(), free_port());
    let proxy = Proxy::start(link_b);
    let a = member(dir.path(), "a", 1, link_a, proxy.port, "b");
    let b = member(dir.path(), "b", 2, link_b, link_a, "a");
    let mut server_a = serve(&a);
    let mut server_b = serve(&b);
    let (ok, text) = decree(&["promote", "--force"], &a);
    assert!(ok, "{text}");
    eventually("the primary is strict", || status(&a)["strict"] == true);
    let store = std::sync::Arc::new(connect(&a).unwrap());
    let session = store.open_session().unwrap();
    let mut acknowledged = vec![decide_later(&store, session, 1).join().unwrap()];

    proxy.set_cut(true);
    let waiting = decide_later(&store, session, 2);
    std::thread::sleep(Duration::from_millis(500));
    assert!(!waiting.is_finished(), "no acknowledgement while the link is cut");
    // `decree status` shows the cut link on both sides and the decision waiting for it.
    eventually("the primary reports the link down", || status(&a)["link"]["connected"] == false);
    let cut = status(&a);
    assert_eq!(cut["strict"], true, "a cut link never makes the primary go alone: {cut}");
    assert_eq!(cut["lag"]["decisions_waiting"], 1, "{cut}");
    assert!(cut["lag"]["records"].as_u64().unwrap() >= 1, "{cut}");
    assert!(cut["lag"]["oldest_ms"].as_f64().unwrap() >= 400.0, "waiting since the cut: {cut}");
    assert!(cut["link"]["last_end"].as_str().is_some(), "{cut}");
    eventually("the backup reports the link down", || status(&b)["link"]["connected"] == false);
    proxy.set_cut(false);
    acknowledged.push(waiting.join().unwrap());
    eventually("the primary reports the link up, nothing waiting", || {
        let up = status(&a);
        up["link"]["connected"] == true && up["lag"]["decisions_waiting"] == 0
    });

    server_b.0.kill().unwrap();
    server_b.0.wait().unwrap();
    let waiting = decide_later(&store, session, 3);
    std::thread::sleep(Duration::from_millis(500));
    assert!(!waiting.is_finished(), "no acknowledgement while the backup is down");
    server_b = serve(&b);
    acknowledged.push(waiting.join().unwrap());
    eventually("the backup caught up again", || status(&b)["caught_up"] == true);

    // Every acknowledged decision is on the backup: kill the primary, promote it, ask.
    server_a.0.kill().unwrap();
    server_a.0.wait().unwrap();
    let (ok, text) = decree(&["promote"], &b);
    assert!(ok, "{text}");
    let new_primary = connect(&b).unwrap();
    for xid in &acknowledged {
        assert_eq!(new_primary.outcome(xid).unwrap(), Outcome::Committed, "{xid}");
    }
    drop(server_b);
}

/// The pair's certificates for one test: a CA, and a member certificate for each name.
struct PairCerts {
    dir: PathBuf,
    ca: PathBuf,
}

impl PairCerts {
    fn new(dir: &Path, ca_name: &str, members: &[&str]) -> PairCerts {
        let dir = dir.join(ca_name);
        std::fs::create_dir_all(&dir).unwrap();
        let ca = decree_server::testing::TestCa::new(ca_name);
        let ca_file = ca.write_ca(&dir.join("ca.pem"));
        for name in members {
            ca.member(&dir, name);
        }
        PairCerts { dir, ca: ca_file }
    }

    /// The `[pair.tls]` section of a member presenting `own` and expecting `peer`.
    fn section(&self, own: &str, trusted: &PairCerts, peer: &str) -> String {
        format!(
            "[pair.tls]\ncert = \"{}\"\nkey = \"{}\"\nca = \"{}\"\npeer_name = \"{peer}\"\n",
            self.dir.join(format!("{own}.pem")).display(),
            self.dir.join(format!("{own}.key")).display(),
            trusted.ca.display()
        )
    }
}

/// The replication link runs TLS with the pair's certificates: a pair whose members hold
/// certificates of its CA naming each other replicates, and a backup killed primary's
/// successor holds what was acknowledged.
#[test]
fn a_pair_replicates_over_tls_with_certificates_naming_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let certs = PairCerts::new(dir.path(), "pair-ca", &["decree-a", "decree-b"]);
    let (link_a, link_b) = (free_port(), free_port());
    let a =
        member_with(dir.path(), "a", 1, link_a, link_b, "b", &certs.section("decree-a", &certs, "decree-b"));
    let b =
        member_with(dir.path(), "b", 2, link_b, link_a, "a", &certs.section("decree-b", &certs, "decree-a"));
    let server_a = serve(&a);
    let _server_b = serve(&b);
    let (ok, text) = decree(&["promote", "--force"], &a);
    assert!(ok, "{text}");
    eventually("the primary is strict over TLS", || status(&a)["strict"] == true);
    assert_eq!(status(&a)["link"]["connected"], true);
    let store = connect(&a).unwrap();
    let session = store.open_session().unwrap();
    let decisions: Vec<Decision> = (1..=10).map(|n| decision(&store, session, n)).collect();
    for d in &decisions {
        store.decide(d).unwrap();
    }
    drop(server_a);
    let (ok, text) = decree(&["promote"], &b);
    assert!(ok, "{text}");
    let new_primary = connect(&b).unwrap();
    for d in &decisions {
        assert_eq!(new_primary.outcome(&d.xid).unwrap(), Outcome::Committed, "{}", d.xid);
    }
}

/// The bug this guards against: a member that takes replicated records from anyone who
/// reaches its link port, or sends them to anyone listening on its peer's address. A
/// backup with a certificate of another CA, a primary whose certificate names someone
/// else, and a plaintext member are each refused during the handshake, with the reason
/// on both sides (`decree status` and the log); the primary then acknowledges only alone,
/// and nothing of its records reaches the refused member's log.
#[test]
fn a_peer_without_a_certificate_of_the_pair_naming_it_is_refused_on_the_link() {
    let dir = tempfile::tempdir().unwrap();
    let ours = PairCerts::new(dir.path(), "pair-ca", &["decree-a", "decree-b", "decree-c"]);
    let theirs = PairCerts::new(dir.path(), "other-ca", &["decree-b"]);
    let cases = [
        // (the primary's section, the backup's section, what the primary says, what the backup says)
        (
            ours.section("decree-a", &ours, "decree-b"),
            theirs.section("decree-b", &ours, "decree-a"),
            "the backup's certificate does not chain to pair.tls.ca",
            "the primary refused this member's certificate",
        ),
        (
            ours.section("decree-c", &ours, "decree-b"),
            ours.section("decree-b", &ours, "decree-a"),
            "the backup refused this member's certificate",
            "the primary's certificate does not name \"decree-a\"",
        ),
        (String::new(), ours.section("decree-b", &ours, "decree-a"), "", "does not speak TLS on the link"),
        (
            ours.section("decree-a", &ours, "decree-b"),
            String::new(),
            "does the backup speak TLS on its link?",
            "this member has none",
        ),
    ];
    for (n, (primary_tls, backup_tls, primary_says, backup_says)) in cases.iter().enumerate() {
        let case = dir.path().join(format!("case-{n}"));
        std::fs::create_dir_all(&case).unwrap();
        let (link_a, link_b) = (free_port(), free_port());
        let a = member_with(&case, "a", 1, link_a, link_b, "b", primary_tls);
        let b = member_with(&case, "b", 2, link_b, link_a, "a", backup_tls);
        let mut server_a = serve(&a);
        let _server_b = serve(&b);
        let (ok, text) = decree(&["promote", "--force"], &a);
        assert!(ok, "case {n}: {text}");
        eventually("the backup refused a link", || status(&b)["link"]["last_end"].is_string());
        let refused = status(&b);
        let said = refused["link"]["last_end"].as_str().unwrap();
        assert!(said.contains(backup_says), "case {n}: the backup says {said:?}");
        if !primary_says.is_empty() {
            eventually("the primary reports the refusal", || {
                status(&a)["link"]["last_end"].as_str().is_some_and(|s| s.contains(primary_says))
            });
        }
        // Alone, the primary acknowledges; nothing of it reaches the refused backup.
        let store = connect(&a).unwrap();
        let session = store.open_session().unwrap();
        for sequence in 1..=3 {
            store.decide(&decision(&store, session, sequence)).unwrap();
        }
        std::thread::sleep(Duration::from_millis(300));
        assert!(server_a.0.try_wait().unwrap().is_none(), "case {n}: the primary lives");
        let backup = status(&b);
        assert_eq!(backup["live_decisions"], 0, "case {n}: {backup}");
        assert_eq!(backup["caught_up"], false, "case {n}: {backup}");
        assert_eq!(status(&a)["strict"], false, "case {n}: no backup caught up");
        let log = std::fs::read_to_string(b.config.with_extension("log")).unwrap();
        assert!(log.contains(backup_says), "case {n}: the backup's log names the refusal:\n{log}");
    }
}

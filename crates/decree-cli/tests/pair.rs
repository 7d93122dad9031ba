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
    let socket = dir.join(format!("{name}.sock"));
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(
        &config,
        format!(
            "node = 5\nlog_dir = \"{}\"\nengine = \"journal\"\nunix = \"{}\"\n\
             [pair]\nmember = {id}\nlink = \"127.0.0.1:{link}\"\npeer_link = \"127.0.0.1:{peer_link}\"\n\
             peer_clients = \"unix:{}\"\n\
             [[rm]]\nname = \"dummy-0\"\nkind = \"dummy\"\n[[rm]]\nname = \"dummy-1\"\nkind = \"dummy\"\n",
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
    proxy.set_cut(false);
    acknowledged.push(waiting.join().unwrap());

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

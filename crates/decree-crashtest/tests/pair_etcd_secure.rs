//! A pair elected on a real etcd that asks for mutual TLS and a password (`[pair.etcd.tls]`,
//! `user` and `password_file`), and a member started while etcd is down. Each test runs its
//! own single-member etcd (`/usr/bin/etcd`) on free loopback ports, its data under
//! /dev/shm: client TLS with `--client-cert-auth` on one port, certificates made by
//! `decree_server::testing::TestCa`; a second, plaintext port serves only this file's setup
//! of etcd's users and roles through etcd's JSON gateway (the `etcd-client` crate would make
//! this test crate's build need protoc), then authentication is turned on. Skipped, saying
//! so, when `DECREE_TEST_ETCD` is not set (the members' `decree` is built with the `etcd`
//! feature only then) or etcd is not installed.
//!
//! The bugs these guard against: a member that cannot use etcd's TLS or its password; a
//! member refused by etcd (wrong password, a client certificate of another CA, a user
//! without permission on the pair's keys, plaintext to a TLS port) that exits, takes part
//! in the election, or says nothing an operator can act on; a member that exits when etcd
//! is down at its start instead of serving as a backup; a member whose etcd token dies with
//! an etcd restart and that can then no longer write. Times are printed, never asserted.

mod common;

use common::pair_member::*;
use decree_server::testing::{CertFiles, TestCa, Validity};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ETCD: &str = "/usr/bin/etcd";

/// The members' lease, as in pair_etcd.rs.
const LEASE_TTL_S: u64 = 1;

/// The password of the user `decree` and of the user `outsider` (who has no role).
const PASSWORD: &str = "correct horse";

/// Whether this file's tests run; says why not.
fn runs() -> bool {
    if decree_server::testing::etcd::endpoints().is_none() {
        eprintln!("{}", decree_server::testing::etcd::SKIPPED);
        return false;
    }
    if !Path::new(ETCD).exists() {
        eprintln!("skipped: {ETCD} is not installed (scripts/test-etcd.sh installs it)");
        return false;
    }
    true
}

/// A single-member etcd with client TLS (`--client-cert-auth`) on `tls_port`, a plaintext
/// port for the setup, and authentication on: users `root`, `decree` (readwrite on
/// `/decree/`) and `outsider` (no role).
struct SecureEtcd {
    dir: PathBuf,
    data: PathBuf,
    tls_port: u16,
    plain_port: u16,
    peer_port: u16,
    server: CertFiles,
    ca: PathBuf,
    process: Option<Reaped>,
}

impl SecureEtcd {
    fn start(dir: &Path, ca: &TestCa) -> SecureEtcd {
        let data =
            PathBuf::from(format!("/dev/shm/decree-etcd-secure-{}-{}", std::process::id(), free_port()));
        let mut etcd = SecureEtcd {
            dir: dir.to_path_buf(),
            data,
            tls_port: free_port(),
            plain_port: free_port(),
            peer_port: free_port(),
            server: ca.server(dir, "etcd-server", Validity::Current),
            ca: ca.write_ca(&dir.join("etcd-ca.pem")),
            process: None,
        };
        etcd.restart();
        let deadline = Instant::now() + Duration::from_secs(20);
        while etcd.post("/v3/maintenance/status", "{}").is_none() {
            assert!(Instant::now() < deadline, "etcd does not answer:\n{}", etcd.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        etcd.enable_auth();
        etcd
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default()
    }

    /// Starts (again) the killed etcd on its ports, with its data.
    fn restart(&mut self) {
        let url = |scheme: &str, port: u16| format!("{scheme}://127.0.0.1:{port}");
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("etcd.log")).unwrap();
        let child = Command::new(ETCD)
            .args(["--name", "secure", "--data-dir"])
            .arg(&self.data)
            .arg("--listen-client-urls")
            .arg(format!("{},{}", url("https", self.tls_port), url("http", self.plain_port)))
            .arg("--advertise-client-urls")
            .arg(url("https", self.tls_port))
            .arg("--listen-peer-urls")
            .arg(url("http", self.peer_port))
            .arg("--initial-advertise-peer-urls")
            .arg(url("http", self.peer_port))
            .arg("--initial-cluster")
            .arg(format!("secure={}", url("http", self.peer_port)))
            .arg("--cert-file")
            .arg(&self.server.cert)
            .arg("--key-file")
            .arg(&self.server.key)
            .arg("--trusted-ca-file")
            .arg(&self.ca)
            .args(["--client-cert-auth", "--heartbeat-interval", "10", "--election-timeout", "100"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd");
        self.process = Some(Reaped(child));
    }

    /// SIGKILLs etcd (its data stays).
    fn kill(&mut self) {
        drop(self.process.take());
    }

    /// `https://127.0.0.1:<tls port>`.
    fn endpoint(&self) -> String {
        format!("https://127.0.0.1:{}", self.tls_port)
    }

    /// POSTs `body` to etcd's JSON gateway on the plaintext port; the answer's body, `None`
    /// while etcd does not answer.
    fn post(&self, path: &str, body: &str) -> Option<serde_json::Value> {
        self.post_as(None, path, body)
    }

    /// [`SecureEtcd::post`] with an authentication token.
    fn post_as(&self, token: Option<&str>, path: &str, body: &str) -> Option<serde_json::Value> {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.plain_port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        let authorization = token.map_or(String::new(), |t| format!("Authorization: {t}\r\n"));
        let request = format!(
            "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             {authorization}Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        serde_json::from_str(answer.split_once("\r\n\r\n")?.1).ok()
    }

    /// Users, roles and permissions, then authentication on (what `etcdctl user add`,
    /// `role add`, `role grant-permission --prefix`, `user grant-role` and `auth enable` do).
    fn enable_auth(&self) {
        let (key, end) = (base64(b"/decree/"), base64(b"/decree0"));
        let steps = [
            ("/v3/auth/role/add", r#"{"name":"root"}"#.to_string()),
            ("/v3/auth/user/add", format!(r#"{{"name":"root","password":"{PASSWORD}"}}"#)),
            ("/v3/auth/user/grant", r#"{"user":"root","role":"root"}"#.to_string()),
            ("/v3/auth/role/add", r#"{"name":"decree"}"#.to_string()),
            (
                "/v3/auth/role/grant",
                format!(
                    r#"{{"name":"decree","perm":{{"permType":"READWRITE","key":"{key}","range_end":"{end}"}}}}"#
                ),
            ),
            ("/v3/auth/user/add", format!(r#"{{"name":"decree","password":"{PASSWORD}"}}"#)),
            ("/v3/auth/user/grant", r#"{"user":"decree","role":"decree"}"#.to_string()),
            ("/v3/auth/user/add", format!(r#"{{"name":"outsider","password":"{PASSWORD}"}}"#)),
            ("/v3/auth/enable", "{}".to_string()),
        ];
        for (path, body) in steps {
            let answer = self.post(path, &body).unwrap_or_else(|| panic!("{path}: no answer"));
            assert!(answer.get("error").is_none(), "{path} {body}: {answer}");
        }
        let anonymous = self.post("/v3/kv/range", &format!(r#"{{"key":"{key}"}}"#)).expect("an answer");
        assert!(anonymous.get("error").is_some(), "authentication is not on: {anonymous}");
    }
}

impl SecureEtcd {
    /// Whether pair `pair`'s sync record names the process `run` (read as root): the
    /// primary recorded that backup in sync, so that it may take over.
    fn in_sync(&self, pair: &str, run: &str) -> bool {
        let login = format!(r#"{{"name":"root","password":"{PASSWORD}"}}"#);
        let Some(token) =
            self.post("/v3/auth/authenticate", &login).and_then(|a| a["token"].as_str().map(str::to_string))
        else {
            return false;
        };
        let key = base64(format!("/decree/{pair}/sync").as_bytes());
        let Some(answer) = self.post_as(Some(&token), "/v3/kv/range", &format!(r#"{{"key":"{key}"}}"#))
        else {
            return false;
        };
        let value = answer["kvs"][0]["value"].as_str().map(unbase64).unwrap_or_default();
        let record: serde_json::Value = serde_json::from_slice(&value).unwrap_or_default();
        record["members"].as_array().is_some_and(|members| members.iter().any(|m| m["run"] == run))
    }
}

impl Drop for SecureEtcd {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

/// Standard base64 (etcd's JSON gateway takes keys so).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            let c = if i <= chunk.len() { ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char } else { '=' };
            out.push(c);
        }
    }
    out
}

/// Standard base64 decoded (etcd's JSON gateway answers values so).
fn unbase64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let digits: Vec<u8> = text.bytes().filter(|&c| c != b'=').map(value).collect();
    let mut out = Vec::new();
    for chunk in digits.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, d)| n | u32::from(*d) << (18 - 6 * i));
        out.extend(n.to_be_bytes()[1..chunk.len()].iter());
    }
    out
}

/// How a member reaches etcd: `[pair.etcd]`'s endpoint, user, password and TLS files.
#[derive(Clone)]
struct Access {
    endpoint: String,
    user: &'static str,
    password: &'static str,
    /// CA, certificate, key: `None` for plaintext.
    tls: Option<(PathBuf, CertFiles)>,
}

/// Writes member `name` (id `id`) of pair `pair` in `dir`: it listens for its primary's
/// link on `link` and dials `peer_link`.
fn member(dir: &Path, name: &'static str, id: u8, links: (u16, u16), pair: &str, access: &Access) -> Member {
    let (config, socket) = (dir.join(format!("{name}.toml")), dir.join(format!("{name}.sock")));
    let peer = if name == "a" { "b" } else { "a" };
    let password_file = dir.join(format!("{name}.password"));
    std::fs::write(&password_file, format!("{}\n", access.password)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&password_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let tls = access.tls.as_ref().map_or(String::new(), |(ca, files)| {
        format!(
            "[pair.etcd.tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n",
            ca.display(),
            files.cert.display(),
            files.key.display()
        )
    });
    let text = format!(
        "node = 7\nlog_dir = \"{}\"\nengine = \"journal\"\nunix = \"{}\"\n\
         [pair]\nmember = {id}\nlink = \"127.0.0.1:{}\"\npeer_link = \"127.0.0.1:{}\"\n\
         peer_clients = \"unix:{}\"\nsecret_file = \"{}\"\n\
         [pair.etcd]\nendpoints = [\"{}\"]\npair = \"{pair}\"\nlease_ttl_s = {LEASE_TTL_S}\n\
         user = \"{}\"\npassword_file = \"{}\"\n{tls}\
         [[rm]]\nname = \"dummy-0\"\nkind = \"dummy\"\n[[rm]]\nname = \"dummy-1\"\nkind = \"dummy\"\n",
        dir.join(name).display(),
        socket.display(),
        links.0,
        links.1,
        dir.join(format!("{peer}.sock")).display(),
        decree_server::testing::pair_secret(dir).unwrap().display(),
        access.endpoint,
        access.user,
        password_file.display(),
    );
    std::fs::write(&config, text).unwrap();
    Member { name, log: config.with_extension("log"), config, socket }
}

/// The pair's two members, `a` (1) and `b` (2), both with `access`.
fn pair(dir: &Path, pair_name: &str, access: &Access) -> (Member, Member) {
    let links = (free_port(), free_port());
    (
        member(dir, "a", 1, links, pair_name, access),
        member(dir, "b", 2, (links.1, links.0), pair_name, access),
    )
}

/// The CA of the test's etcd, etcd itself, and the access of a well-configured member.
fn secure_etcd(dir: &Path) -> (SecureEtcd, Access) {
    let ca = TestCa::new("decree test etcd CA");
    let etcd = SecureEtcd::start(dir, &ca);
    let access = Access {
        endpoint: etcd.endpoint(),
        user: "decree",
        password: PASSWORD,
        tls: Some((etcd.ca.clone(), ca.client(dir, "decree-member", Validity::Current))),
    };
    (etcd, access)
}

#[test]
fn a_pair_on_etcd_with_tls_and_a_password_elects_acknowledges_and_fails_over() {
    if !runs() {
        return;
    }
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let (etcd, access) = secure_etcd(dir.path());
    let name = pair_name("secure");
    let (a, b) = pair(dir.path(), &name, &access);
    let mut servers = [Some(serve(&a)), Some(serve(&b))];
    let (primary, backup) = wait_strict(&a, &b);
    let p = if std::ptr::eq(primary, &a) { 0 } else { 1 };
    let s = status(primary).expect("the primary answers");
    assert_eq!(s["etcd"]["state"], "ok", "{s}");
    let led = epoch(primary);
    let acknowledged = decide(primary, 100);
    let run = status(backup).expect("the backup answers")["etcd"]["run"].clone();
    eventually("the primary records its backup in sync", &[primary, backup], || {
        etcd.in_sync(&name, run.as_str().unwrap_or_default())
    });

    // The primary dies: the backup, in sync, is elected over TLS with its password.
    drop(servers[p].take());
    let took = eventually("the backup leads", &[primary, backup], || {
        status(backup).is_some_and(|s| s["role"] == "primary" && s["epoch_raw"].as_u64() > Some(led))
    });
    eprintln!("SIGKILL of the primary to the backup leading on a TLS etcd with a password: {took:?}");
    all_committed(backup, &acknowledged);
    eprintln!("secure pair test: {:?}", started.elapsed());
}

/// A member etcd refuses, each for one reason: what its log and `decree status` must say.
struct Hostile {
    what: &'static str,
    access: Access,
    says: &'static str,
}

#[test]
fn a_member_etcd_refuses_serves_as_a_backup_says_why_and_nothing_acknowledged_is_lost() {
    if !runs() {
        return;
    }
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let (etcd, good) = secure_etcd(dir.path());
    let stranger = TestCa::new("a CA etcd never heard of").client(dir.path(), "stranger", Validity::Current);
    let hostile = [
        Hostile {
            what: "a wrong password",
            access: Access { password: "wrong", ..good.clone() },
            says: "refused user decree's password",
        },
        Hostile {
            what: "a client certificate of another CA",
            access: Access { tls: Some((etcd.ca.clone(), stranger)), ..good.clone() },
            says: "refused this member's client certificate",
        },
        Hostile {
            what: "a user without permission on the pair's keys",
            access: Access { user: "outsider", ..good.clone() },
            says: "etcd user outsider may not read and write /decree/",
        },
        Hostile {
            what: "a plaintext endpoint on etcd's TLS port",
            access: Access {
                endpoint: format!("http://127.0.0.1:{}", etcd.tls_port),
                tls: None,
                ..good.clone()
            },
            says: "the endpoint speaks TLS, not plaintext",
        },
    ];
    let (name, links) = (pair_name("refused"), (free_port(), free_port()));
    let a = member(dir.path(), "a", 1, links, &name, &good);
    let mut primary = Some(serve(&a));
    eventually("member a leads alone", &[&a], || status(&a).is_some_and(|s| s["role"] == "primary"));
    let led = epoch(&a);
    let mut acknowledged = decide(&a, 20);

    // Member b, each time refused for one reason, starts all the same, says why in its log
    // and its status, takes no part in the election, and is a backup like any other.
    let mut backup = None;
    let mut b = None;
    for case in &hostile {
        drop(backup.take());
        let m = b.insert(member(dir.path(), "b", 2, (links.1, links.0), &name, &case.access));
        backup = Some(serve(m));
        let m = &*m;
        eventually(&format!("b ({}) says etcd refuses it", case.what), &[m], || {
            status(m).is_some_and(|s| {
                s["role"] == "backup"
                    && s["etcd"]["state"] == "refused"
                    && s["etcd"]["error"].as_str().is_some_and(|e| e.contains(case.says))
            })
        });
        let log = std::fs::read_to_string(&m.log).unwrap();
        assert!(log.contains(case.says), "{}: the log does not say {:?}:\n{}", case.what, case.says, tail(m));
        eprintln!("{}: {}", case.what, status(m).expect("b answers")["etcd"]["error"]);
        eventually("a leads strictly with b caught up", &[&a, m], || strict_pair(&a, m));
        acknowledged.extend(decide(&a, 10));
        let s = status(m).expect("b answers");
        assert!(s["role"] == "backup" && s["etcd"]["lease"].is_null() && s["etcd"]["campaigns"] == 0, "{s}");
    }

    // A configuration the member can check alone is not an outage: it exits at once,
    // naming the file.
    let missing = dir.path().join("missing-cert.pem");
    let mut files = CertFiles { cert: missing.clone(), key: missing.clone() };
    files.key.set_extension("key");
    let broken = Access { tls: Some((etcd.ca.clone(), files)), ..good.clone() };
    let c = member(dir.path(), "c", 2, (free_port(), links.0), &name, &broken);
    let out = Command::new(common::decree_bin()).args(["serve", "--config"]).arg(&c.config).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains(&missing.display().to_string()), "{}: {said}", out.status);

    // The primary dies and comes back while the refused member runs: the refused member
    // never leads, and the primary, restarted, leads again with every acknowledged decision.
    drop(primary.take());
    primary = Some(serve(&a));
    let b = b.expect("b ran");
    eventually("a leads again", &[&a, &b], || {
        status(&a).is_some_and(|s| s["role"] == "primary" && s["epoch_raw"].as_u64() > Some(led))
    });
    all_committed(&a, &acknowledged);
    let s = status(&b).expect("b answers");
    assert!(s["role"] == "backup" && s["etcd"]["state"] == "refused", "{s}");
    drop((backup, primary));
    eprintln!("refused-member test: {:?}", started.elapsed());
}

#[test]
fn a_member_started_while_etcd_is_down_serves_as_a_backup_then_joins_the_election() {
    if !runs() {
        return;
    }
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let (mut etcd, access) = secure_etcd(dir.path());
    let name = pair_name("etcd-down");
    let (a, b) = pair(dir.path(), &name, &access);
    let mut servers = [Some(serve(&a)), Some(serve(&b))];
    let (primary, backup) = wait_strict(&a, &b);
    let q = if std::ptr::eq(primary, &a) { 1 } else { 0 };
    let led = epoch(primary);
    let mut acknowledged = decide(primary, 50);

    // etcd is down and the backup restarts: it starts, says etcd is unreachable (naming the
    // endpoint), serves as a backup and catches up with the primary, which dials it.
    etcd.kill();
    drop(servers[q].take());
    servers[q] = Some(serve(backup));
    eventually("the restarted backup says etcd is unreachable", &[backup], || {
        status(backup).is_some_and(|s| {
            s["role"] == "backup"
                && s["etcd"]["state"] == "unreachable"
                && s["etcd"]["error"].as_str().is_some_and(|e| e.contains(&etcd.endpoint()))
        })
    });
    let log = std::fs::read_to_string(&backup.log).unwrap();
    assert!(
        log.contains("etcd is unreachable") && log.contains(&etcd.endpoint()),
        "the log does not say that etcd is unreachable:\n{}",
        tail(backup)
    );
    eventually("the restarted backup catches up without etcd", &[primary, backup], || {
        status(backup).is_some_and(|s| s["caught_up"] == true && s["role"] == "backup")
    });

    // etcd returns (every token it had issued is gone): the backup takes its lease, and is
    // the backup of the primary, which records it in sync.
    etcd.restart();
    // etcd is back, every token it had issued gone: the primary keeps its epoch, or, its
    // lease lapsed meanwhile (a loaded machine), steps down and is elected again. Either
    // way the pair settles: strict, the backup's process recorded in sync by the primary
    // (with a new token), both members holding a lease.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (primary, backup) = loop {
        assert!(Instant::now() < deadline, "the pair never settled:\n{}\n{}", tail(&a), tail(&b));
        let (primary, backup) = wait_strict(&a, &b);
        let run = status(backup).map(|s| s["etcd"]["run"].clone()).unwrap_or_default();
        let leased = [primary, backup].iter().all(|m| status(m).is_some_and(|s| s["etcd"]["state"] == "ok"));
        if !leased || !etcd.in_sync(&name, run.as_str().unwrap_or_default()) {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        match try_decide(primary, 10, &mut acknowledged) {
            Ok(()) => break (primary, backup),
            Err(e) => eprintln!("the pair changed roles meanwhile ({e}): settling again"),
        }
    };
    let (p, q) = if std::ptr::eq(primary, &a) { (0, 1) } else { (1, 0) };
    eprintln!(
        "etcd back: {} leads, epoch {} (led {led} before the outage)",
        primary.name,
        if epoch(primary) == led { "unchanged" } else { "new" }
    );

    // The primary dies: the backup started while etcd was down is elected, with every
    // acknowledged decision.
    let before = epoch(primary);
    drop(servers[p].take());
    eventually("the backup leads", &[primary, backup], || {
        status(backup).is_some_and(|s| s["role"] == "primary" && s["epoch_raw"].as_u64() > Some(before))
    });
    all_committed(backup, &acknowledged);
    drop(servers[q].take());
    eprintln!("etcd-down test: {:?}", started.elapsed());
}

//! Kill -9 of a pair's primary under the bank workload: the backup is promoted, the killed
//! member comes back as the backup, and the databases must still balance.
//!
//! The bug this guards against: a failover that loses or splits a transfer. A primary that
//! acknowledges a decision its backup does not hold (the promoted backup then rolls the
//! transfer back), a new primary that commits a transaction nobody decided or rolls back
//! one that was decided, phase two left half done, a branch of the dead primary's epoch
//! left prepared (holding its locks), or a pair that no longer serves, cannot promote its
//! caught-up backup or never becomes strict again after a failover. Any of these shows up
//! in the databases as an acknowledged transfer missing, a transfer in one database only,
//! money created or destroyed, or a decree branch left prepared.
//!
//! Two `decree serve` members (journal logs in temporary directories, `[[rm]]` entries for
//! the two test databases so that a new primary finishes phase two and recovers) form a
//! pair; the first promotion is forced, then the test waits until the primary is strict.
//! Each cycle runs `decree-bank run --state A,B` through the pair and SIGKILLs the primary,
//! in one of three ways: alone at a random moment (two cycles in five: the workload then
//! fails over by itself, connecting to the new primary and asking it the outcome of each
//! transfer whose decide got no answer, its `RESOLVED` lines); together with the workload
//! at a random moment (the new primary alone must finish what was decided); or right after
//! the workload killed itself at a crash point, once the pair acknowledged a transfer's
//! decision and before its phase two began or with one branch committed (the new primary
//! must commit that transfer). Then the test promotes the other member with `decree
//! promote` (not forced: it caught up), restarts the killed member (it rejoins as the
//! backup) and waits until the new primary is strict. A short workload run must then
//! succeed through the new primary, and once the new primary's recovery has settled every
//! prepared branch (polled), the databases must hold in both every acknowledged transfer,
//! every one resolved as committed and every one decided at a crash point, none resolved
//! as rolled back, none in one only, and the same total. Cycles: DECREE_PAIR_KILL_CYCLES
//! (default 50 per database pair); seed: DECREE_PAIR_KILL_SEED. The `decree` binary is
//! built by the test (`cargo build -p decree-cli` with this test's profile and target
//! directory), so the servers are never a stale build. On a failure the temporary
//! directory (member logs, configurations, acknowledged ids) is kept and its path printed.

mod common;

use decree_crashtest::{BankConfig, CrashPoint, PairKind, Snapshot};
use rand::Rng;
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant};

const BANK_BIN: &str = env!("CARGO_BIN_EXE_decree-bank");
/// Longest wait for a process, a promotion, strictness, or the recovery of the branches.
const WAIT_MAX: Duration = Duration::from_secs(60);
const WORKERS: &str = "3";
const ACCOUNTS: u32 = 40;
/// The members' periodic recovery pass. A branch whose PREPARE the dying workload's
/// worker finished after the new primary's first pass waits for the next pass; the
/// default (a minute) would make each such cycle wait that long.
const PERIODIC_PASS_MS: u64 = 500;
/// Longest random delay between the workload's READY and the primary's SIGKILL.
const KILL_DELAY_MAX_MS: u64 = 400;
/// Longest delay the link proxies add (one way), drawn per cycle; half the cycles add none.
const LINK_DELAY_MAX_MS: u64 = 20;

/// A child killed and reaped when dropped, so that a failed assertion leaves nothing running.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The temporary directory, kept (and its path printed) when the test fails.
struct Scratch(Option<tempfile::TempDir>);

impl Scratch {
    fn path(&self) -> &Path {
        self.0.as_ref().expect("present until dropped").path()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(dir) = self.0.take() {
                eprintln!("kept for a look: {}", dir.keep().display());
            }
        }
    }
}

/// The `decree` binary of this workspace, built once per test process with the profile
/// and target directory of this test (cargo releases its lock while tests run).
fn decree_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test's own path");
        // target/<profile>/deps/<test>: the binary goes to target/<profile>/decree.
        let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps");
        let target_dir = profile_dir.parent().expect("target/");
        let profile = profile_dir.file_name().and_then(|p| p.to_str()).expect("a profile name");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        build.args(["build", "-q", "-p", "decree-cli", "--bin", "decree", "--target-dir"]).arg(target_dir);
        // What cargo sets for this test's run only: some build scripts rerun when one of
        // them changes (ring's tracks CARGO_MANIFEST_DIR), which would rebuild half the
        // workspace at every run and again at the next plain `cargo build`.
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            let per_run = ["CARGO_PKG_", "CARGO_BIN_EXE_"].iter().any(|p| name.starts_with(p))
                || [
                    "CARGO_MANIFEST_DIR",
                    "CARGO_MANIFEST_PATH",
                    "CARGO_CRATE_NAME",
                    "CARGO_BIN_NAME",
                    "CARGO_PRIMARY_PACKAGE",
                    "CARGO_TARGET_TMPDIR",
                    "CARGO_RUSTC_CURRENT_DIR",
                    "OUT_DIR",
                ]
                .contains(&name.as_ref());
            if per_run {
                build.env_remove(name.as_ref());
            }
        }
        match profile {
            "debug" => {}
            "release" => {
                build.arg("--release");
            }
            other => {
                build.args(["--profile", other]);
            }
        }
        let status = build.current_dir(env!("CARGO_MANIFEST_DIR")).status().expect("run cargo build");
        assert!(status.success(), "cargo build -p decree-cli failed: {status}");
        let bin = profile_dir.join("decree");
        assert!(bin.exists(), "cargo built decree-cli but {} is missing", bin.display());
        bin
    })
}

/// A proxy on loopback in front of a member's link listener at `target`, which delays
/// every byte by `delay` microseconds each way (read at the moment the bytes arrive).
/// A SIGKILL right after the pair acknowledged a decision then lands before the bytes of
/// a decision acknowledged too early could reach the backup. Returns its port.
fn delaying_proxy(target: u16, delay: Arc<AtomicU64>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the link proxy");
    let port = listener.local_addr().expect("its port").port();
    std::thread::spawn(move || {
        for inbound in listener.incoming() {
            let Ok(inbound) = inbound else { continue };
            // The member behind it is down: the dialler sees the link close at once.
            let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)) else { continue };
            for (from, to) in [(&inbound, &outbound), (&outbound, &inbound)] {
                let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) else { continue };
                delayed_pipe(from, to, delay.clone());
            }
        }
    });
    port
}

/// Copies `from` to `to`, each chunk `delay` microseconds after it arrived. When either
/// side ends, the queued bytes are delivered and both sockets are shut down, so that the
/// member on the other side sees the link close.
fn delayed_pipe(mut from: TcpStream, mut to: TcpStream, delay: Arc<AtomicU64>) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let reader_side = from.try_clone().expect("clone a proxied socket");
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            let due = Instant::now() + Duration::from_micros(delay.load(Ordering::Relaxed));
            if tx.send((due, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    });
    std::thread::spawn(move || {
        for (due, bytes) in rx {
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = reader_side.shutdown(Shutdown::Both);
    });
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A TOML basic string.
fn toml_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// One pair member's files: its configuration, client socket and stderr log.
struct Member {
    name: &'static str,
    /// The `decree` binary, by the name its processes run under.
    bin: PathBuf,
    config: PathBuf,
    socket: PathBuf,
    log: PathBuf,
}

/// What both members' configurations share.
struct Site<'a> {
    dir: &'a Path,
    /// The `decree` binary, by the name its processes run under.
    bin: &'a Path,
    node: u32,
    bank: &'a BankConfig,
}

impl Member {
    fn write(site: &Site<'_>, name: &'static str, id: u8, links: (u16, u16), peer: &str) -> Member {
        let socket = site.dir.join(format!("{name}.sock"));
        let config = site.dir.join(format!("{name}.toml"));
        let kind_b = match site.bank.kind {
            PairKind::PgPg => "postgres",
            PairKind::PgMariaDb => "mariadb",
        };
        let text = format!(
            "node = {}\nlog_dir = {}\nengine = \"journal\"\nunix = {}\n\
             [recovery]\nperiodic_pass_ms = {PERIODIC_PASS_MS}\n\
             [pair]\nmember = {id}\nlink = \"127.0.0.1:{}\"\npeer_link = \"127.0.0.1:{}\"\npeer_clients = {}\n\
             [[rm]]\nname = \"bank-a\"\nkind = \"postgres\"\ndsn = {}\n\
             [[rm]]\nname = \"bank-b\"\nkind = \"{kind_b}\"\ndsn = {}\n",
            site.node,
            toml_str(&site.dir.join(name).display().to_string()),
            toml_str(&socket.display().to_string()),
            links.0,
            links.1,
            toml_str(&format!("unix:{}", site.dir.join(format!("{peer}.sock")).display())),
            toml_str(&site.bank.dsn_a),
            toml_str(&site.bank.dsn_b),
        );
        std::fs::write(&config, text).expect("write a member's configuration");
        Member { name, bin: site.bin.to_path_buf(), log: config.with_extension("log"), config, socket }
    }

    fn serve(&self) -> Reaped {
        // A killed member leaves its socket behind: wait for the new one.
        let _ = std::fs::remove_file(&self.socket);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).expect("log file");
        let child = Command::new(&self.bin)
            .args(["serve", "-v", "--config"])
            .arg(&self.config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start decree serve");
        let mut server = Reaped(child);
        let deadline = Instant::now() + WAIT_MAX;
        while !self.socket.exists() {
            if let Ok(Some(status)) = server.0.try_wait() {
                panic!("member {} exited at start ({status}):\n{}", self.name, self.log_tail());
            }
            assert!(Instant::now() < deadline, "member {} has no socket after {WAIT_MAX:?}", self.name);
            std::thread::sleep(Duration::from_millis(10));
        }
        server
    }

    /// Runs `decree <args> --config <member>`; returns (success, stdout + stderr).
    fn decree(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(&self.bin)
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .output()
            .expect("run decree");
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    }

    fn status(&self) -> serde_json::Value {
        let (ok, text) = self.decree(&["status"]);
        assert!(ok, "decree status of member {}: {text}\nits log:\n{}", self.name, self.log_tail());
        serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    /// The end of the member's log, for failure messages.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

/// The two members, the processes running them, and which one leads.
struct Pair {
    members: [Member; 2],
    servers: [Option<Reaped>; 2],
    primary: usize,
    /// Both client sockets, as the workload is given them.
    addresses: String,
    /// The delay the link proxies add to every byte, in microseconds.
    link_delay: Arc<AtomicU64>,
}

impl Pair {
    /// Starts both members as backups, force-promotes the first (a new pair) and waits
    /// until it is strict.
    fn start(site: &Site<'_>) -> Pair {
        let link_delay = Arc::new(AtomicU64::new(0));
        let links = (free_port(), free_port());
        // Each member dials its peer's link through a proxy that delays the bytes.
        let proxies =
            (delaying_proxy(links.0, link_delay.clone()), delaying_proxy(links.1, link_delay.clone()));
        let a = Member::write(site, "a", 1, (links.0, proxies.1), "b");
        let b = Member::write(site, "b", 2, (links.1, proxies.0), "a");
        let addresses = format!("unix:{},unix:{}", a.socket.display(), b.socket.display());
        let servers = [Some(a.serve()), Some(b.serve())];
        let pair = Pair { members: [a, b], servers, primary: 0, addresses, link_delay };
        let (ok, text) = pair.members[0].decree(&["promote", "--force"]);
        assert!(ok && text.contains("leads epoch"), "first promotion: {text}");
        pair.wait_strict("the first promotion");
        pair
    }

    /// Waits until the primary is strict again and the other member is its caught-up backup.
    fn wait_strict(&self, context: &str) {
        let (primary, backup) = (&self.members[self.primary], &self.members[1 - self.primary]);
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            let (p, b) = (primary.status(), backup.status());
            if p["role"] == "primary"
                && p["strict"] == true
                && b["role"] == "backup"
                && b["caught_up"] == true
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{context}: not strict after {WAIT_MAX:?}: primary {p}, backup {b}\n\
                 primary's log:\n{}\nbackup's log:\n{}",
                primary.log_tail(),
                backup.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILLs the primary, promotes the other member (not forced) and restarts the killed
    /// one, which rejoins as the backup. Returns the new primary's raw epoch.
    fn fail_over(&mut self, context: &str) -> u64 {
        let killed = self.primary;
        let mut server = self.servers[killed].take().expect("the primary runs");
        server.0.kill().expect("SIGKILL the primary");
        let status = server.0.wait().expect("reap the primary");
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{context}: the primary ended before the kill");
        self.primary = 1 - killed;
        let promoted = &self.members[self.primary];
        let (ok, text) = promoted.decree(&["promote"]);
        assert!(
            ok && text.contains("leads epoch"),
            "{context}: promotion of the caught-up backup {} failed: {text}\nits log:\n{}",
            promoted.name,
            promoted.log_tail()
        );
        self.servers[killed] = Some(self.members[killed].serve());
        promoted.status()["epoch_raw"].as_u64().expect("a raw epoch")
    }
}

/// How the test runs `decree-bank` against its tables and its pair.
struct Bank {
    pair: PairKind,
    prefix: String,
    node: u32,
}

impl Bank {
    fn command(&self, sub: &str) -> Command {
        let mut c = Command::new(BANK_BIN);
        c.arg(sub).args(["--pair", self.pair.name(), "--prefix", &self.prefix]).args([
            "--accounts",
            &ACCOUNTS.to_string(),
            "--node",
            &self.node.to_string(),
        ]);
        c
    }

    /// Starts `run` through the pair; its stdout lines arrive on the receiver, its stderr
    /// goes to `stderr`, its acknowledged ids to `acked`.
    fn run(
        &self,
        addresses: &str,
        acked: &Path,
        stderr: &Path,
        extra: &[&str],
    ) -> (Reaped, mpsc::Receiver<String>) {
        let err = std::fs::File::create(stderr).expect("workload stderr file");
        let mut child = self
            .command("run")
            .args(["--state", addresses, "--workers", WORKERS])
            .arg("--acked-file")
            .arg(acked)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .expect("spawn decree-bank run");
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().expect("stdout is piped");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        (Reaped(child), rx)
    }
}

/// Waits until the child exits (None after `timeout`).
fn wait_exit(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits for the workload's READY line; returns the lines read so far.
fn wait_ready(
    lines: &mpsc::Receiver<String>,
    child: &mut Child,
    context: &str,
    stderr: &Path,
) -> Vec<String> {
    let mut seen = Vec::new();
    let deadline = Instant::now() + WAIT_MAX;
    while !seen.last().is_some_and(|l: &String| l.starts_with("READY")) {
        match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => seen.push(line),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                let why = std::fs::read_to_string(stderr).unwrap_or_default();
                panic!("{context}: the workload never became ready: {why}");
            }
        }
    }
    seen
}

/// Reads the acknowledged ids a workload appended to `file` into `acked`; returns how many.
fn read_acked(file: &Path, acked: &mut HashSet<String>, context: &str) -> usize {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut count = 0;
    for id in text.lines() {
        assert!(acked.insert(id.to_string()), "{context}: transfer {id} acknowledged twice");
        count += 1;
    }
    count
}

/// What the cycles found, over the whole loop.
#[derive(Default)]
struct Totals {
    /// Transfers whose commit returned Ok.
    acked: HashSet<String>,
    /// Transfers whose decision the pair acknowledged before the workload killed itself at
    /// a crash point (before or during phase two): the new primary must commit them.
    decided: HashSet<String>,
    /// Transfers whose decide got no answer and the new primary answered committed.
    resolved_committed: HashSet<String>,
    /// ... rolled back: they must be in neither database.
    resolved_rolled_back: HashSet<String>,
    /// ... unknown (or heuristic): both or neither, like any transfer.
    resolved_other: u64,
    /// Failover runs whose workload had lost no decide in flight.
    no_doubt: u64,
    /// Cycles by mode: primary alone, workload and primary, crash points decided and
    /// phase-two.
    modes: [u64; 4],
}

/// The cycle's killed workload: it must have lost its primary, failed over to the new one
/// and resolved its doubtful transfers there.
fn finish_killed_workload(
    child: &mut Child,
    lines: &mpsc::Receiver<String>,
    mut seen: Vec<String>,
    epoch: u64,
    stderr: &Path,
    totals: &mut Totals,
    context: &str,
) {
    let status = wait_exit(child, WAIT_MAX);
    let why = std::fs::read_to_string(stderr).unwrap_or_default();
    let Some(status) = status else {
        let _ = child.kill();
        panic!("{context}: the workload did not finish its failover within {WAIT_MAX:?}: {why}");
    };
    // The reader thread ends with the pipe: every line is in the channel now or soon.
    seen.extend(lines.iter());
    assert!(status.success(), "{context}: the workload failed ({status}): {why}\nits output: {seen:?}");
    assert!(
        seen.iter().any(|l| l.starts_with("STORE-LOST")),
        "{context}: the workload never lost its primary: {seen:?}"
    );
    let expected = format!("FAILED-OVER incarnation={epoch} ");
    assert!(
        seen.iter().any(|l| l.starts_with(&expected)),
        "{context}: the workload did not fail over to epoch {epoch}: {seen:?}"
    );
    let mut doubts = 0;
    for line in &seen {
        let Some(rest) = line.strip_prefix("RESOLVED ") else { continue };
        doubts += 1;
        let (id, outcome) = rest.split_once(' ').expect("RESOLVED <id> <outcome>");
        match outcome {
            "committed" => totals.resolved_committed.insert(id.to_string()),
            "rolled-back" => totals.resolved_rolled_back.insert(id.to_string()),
            _ => {
                totals.resolved_other += 1;
                true
            }
        };
    }
    if doubts == 0 {
        totals.no_doubt += 1;
    }
}

/// Polls until no branch of `node` is prepared (the new primary's recovery ran) or
/// `WAIT_MAX` passed, then checks the invariant and the transfers resolved as rolled back.
fn check(config: &BankConfig, node: u32, totals: &Totals, context: &str) {
    let deadline = Instant::now() + WAIT_MAX;
    let snapshot = loop {
        let snapshot = Snapshot::take(config, node).expect("read both databases");
        let settled = snapshot.prepared_a.is_empty() && snapshot.prepared_b.is_empty();
        if settled || Instant::now() >= deadline {
            break snapshot;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let must_hold: HashSet<String> =
        totals.acked.iter().chain(&totals.resolved_committed).chain(&totals.decided).cloned().collect();
    let mut violations = snapshot.violations(config, &must_hold);
    let mut gone: Vec<&String> = totals
        .resolved_rolled_back
        .iter()
        .filter(|id| snapshot.transfers_a.contains_key(*id) || snapshot.transfers_b.contains_key(*id))
        .collect();
    gone.sort();
    violations.extend(gone.into_iter().map(|id| format!("transfer {id} answered rolled back but present")));
    assert!(violations.is_empty(), "{context}: invariant broken:\n  {}", violations.join("\n  "));
}

/// What every cycle needs besides the pair.
struct Loop<'a> {
    bank: &'a Bank,
    config: &'a BankConfig,
    dir: &'a Path,
    seed: u64,
}

/// How a cycle kills.
#[derive(Debug, Clone, Copy)]
enum Mode {
    /// SIGKILL of the primary alone, at a random moment: the workload fails over.
    Primary,
    /// SIGKILL of the workload, then at once of the primary, at a random moment: the new
    /// primary alone finishes what the workload had decided.
    Both,
    /// The workload kills itself at this point of its nth transaction (its decision
    /// acknowledged by the pair, phase two not begun or half done); the test kills the
    /// primary as soon as the workload is dead.
    Point(CrashPoint, u64),
}

impl Mode {
    fn index(self) -> usize {
        match self {
            Mode::Primary => 0,
            Mode::Both => 1,
            Mode::Point(CrashPoint::PhaseTwo, _) => 3,
            Mode::Point(..) => 2,
        }
    }
}

/// One cycle: the workload through the pair, the primary killed (with the workload, in
/// some modes), the other promoted, the killed one back as the backup, a run that must
/// succeed, and the checks.
fn cycle(l: &Loop<'_>, pair: &mut Pair, cycle: u64, rng: &mut impl Rng, totals: &mut Totals) {
    let mode = match cycle % 5 {
        0 | 1 => Mode::Primary,
        2 => Mode::Both,
        3 => Mode::Point(CrashPoint::Decided, rng.gen_range(1..=8)),
        _ => Mode::Point(CrashPoint::PhaseTwo, rng.gen_range(1..=8)),
    };
    totals.modes[mode.index()] += 1;
    let delay_ms = if rng.gen_bool(0.5) { 0 } else { rng.gen_range(1..=LINK_DELAY_MAX_MS) };
    pair.link_delay.store(delay_ms * 1000, Ordering::Relaxed);
    let context = format!(
        "{} cycle {cycle} ({mode:?}, link delay {delay_ms} ms, primary member {}), seed {}",
        l.bank.pair.name(),
        pair.primary + 1,
        l.seed
    );
    let (acked, stderr) = (l.dir.join(format!("acked-{cycle}")), l.dir.join(format!("workload-{cycle}.log")));
    let (seed_run, nth) = (
        rng.gen::<u64>().to_string(),
        match mode {
            Mode::Point(_, nth) => nth.to_string(),
            _ => String::new(),
        },
    );
    let mut extra = vec!["--seed", seed_run.as_str(), "--failover-wait-s", "120"];
    if let Mode::Point(point, _) = mode {
        extra.extend(["--crash-point", point.name(), "--crash-at", nth.as_str()]);
    }
    let (mut child, lines) = l.bank.run(&pair.addresses, &acked, &stderr, &extra);
    let why = || std::fs::read_to_string(&stderr).unwrap_or_default();
    let mut seen = wait_ready(&lines, &mut child.0, &context, &stderr);
    if let Mode::Point(..) = mode {
        let status = wait_exit(&mut child.0, WAIT_MAX);
        let killed = status.is_some_and(|s| s.signal() == Some(libc::SIGKILL));
        assert!(killed, "{context}: expected the crash point's SIGKILL, got {status:?}: {}", why());
    } else {
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..=KILL_DELAY_MAX_MS)));
        if let Ok(Some(status)) = child.0.try_wait() {
            panic!("{context}: the workload ended before the kill ({status}): {}", why());
        }
    }
    if let Mode::Both = mode {
        child.0.kill().expect("SIGKILL the workload");
        child.0.wait().expect("reap the workload");
    }
    let epoch = pair.fail_over(&context);
    if let Mode::Primary = mode {
        finish_killed_workload(&mut child.0, &lines, seen, epoch, &stderr, totals, &context);
    } else {
        seen.extend(lines.iter());
        let points: Vec<&str> = seen.iter().filter_map(|l| l.strip_prefix("CRASH-POINT ")).collect();
        if let Mode::Point(point, _) = mode {
            let id = match points[..] {
                [line] => line.strip_prefix(point.name()).map(str::trim),
                _ => None,
            };
            let id = id.unwrap_or_else(|| panic!("{context}: no CRASH-POINT line: {seen:?}"));
            totals.decided.insert(id.to_string());
        }
    }
    read_acked(&acked, &mut totals.acked, &context);
    pair.wait_strict(&context);
    serves(l, pair, cycle, totals, &context);
    check(l.config, l.bank.node, totals, &context);
}

/// The new primary serves: a short run through the pair must succeed and acknowledge.
fn serves(l: &Loop<'_>, pair: &Pair, cycle: u64, totals: &mut Totals, context: &str) {
    let (acked, stderr) =
        (l.dir.join(format!("acked-{cycle}-after")), l.dir.join(format!("after-{cycle}.log")));
    let (mut child, lines) = l.bank.run(&pair.addresses, &acked, &stderr, &["--transfers-max", "3"]);
    let status = wait_exit(&mut child.0, WAIT_MAX);
    let why = std::fs::read_to_string(&stderr).unwrap_or_default();
    let Some(status) = status else {
        panic!("{context}: the run through the new primary did not end within {WAIT_MAX:?}: {why}");
    };
    // The process is gone: its stdout ends, and so does the reader's channel.
    let out: Vec<String> = lines.iter().collect();
    assert!(
        status.success() && out.iter().any(|l| l.starts_with("DONE")),
        "{context}: the new primary does not serve ({status}): {why}\n{out:?}"
    );
    let after = read_acked(&acked, &mut totals.acked, context);
    assert!(after > 0, "{context}: the run after the failover acknowledged nothing");
}

fn pair_kill_loop(kind: PairKind, prefix: &str, node: u32) {
    let Some(config) = common::bank_config(kind, prefix, ACCOUNTS) else { return };
    let (seed, mut rng) = common::seeded_rng("DECREE_PAIR_KILL_SEED");
    let cycles = common::env_count("DECREE_PAIR_KILL_CYCLES", 50);
    let scratch = Scratch(Some(tempfile::tempdir().expect("temp dir")));
    let dir = scratch.path();
    let bank = Bank { pair: kind, prefix: prefix.into(), node };
    let setup = bank.command("setup").arg("--reset").output().expect("run decree-bank setup");
    assert!(setup.status.success(), "setup failed: {}", String::from_utf8_lossy(&setup.stderr));
    // The members run under a name of their own (a link to the binary), which a broad
    // `killall decree` by someone else on a shared machine does not stop mid-loop.
    let bin = dir.join("decree-pair-member");
    std::os::unix::fs::symlink(decree_bin(), &bin).expect("link the decree binary");
    let started = Instant::now();
    let mut pair = Pair::start(&Site { dir, bin: &bin, node, bank: &config });
    let mut totals = Totals::default();
    let l = Loop { bank: &bank, config: &config, dir, seed };
    for n in 0..cycles {
        cycle(&l, &mut pair, n, &mut rng, &mut totals);
    }
    assert!(!totals.acked.is_empty(), "{}: no transfer was ever acknowledged", kind.name());
    eprintln!(
        "{}: {cycles} cycles (primary killed alone / with the workload / after the workload's crash \
         points decided, phase-two: {:?}), {} transfers acknowledged, {} decided at a crash point, \
         decides without an answer resolved by the new primary: {} committed, {} rolled back, {} \
         unknown ({} failovers had none), {:.1} s",
        kind.name(),
        totals.modes,
        totals.acked.len(),
        totals.decided.len(),
        totals.resolved_committed.len(),
        totals.resolved_rolled_back.len(),
        totals.resolved_other,
        totals.no_doubt,
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn pair_kill_loop_postgres_postgres() {
    pair_kill_loop(PairKind::PgPg, "pair_pgpg", 0x00C0_0011);
}

#[test]
fn pair_kill_loop_postgres_mariadb() {
    pair_kill_loop(PairKind::PgMariaDb, "pair_pgm", 0x00C0_0012);
}

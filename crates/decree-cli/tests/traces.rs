//! Issue 36: one trace per transaction, across the client and `decree serve`. An OTLP/HTTP
//! receiver inside this test (a small HTTP server decoding `ExportTraceServiceRequest`
//! protobufs) records every span that the real client (this process, configured by the
//! standard `OTEL_*` variables) and a real `decree serve` (configured by `[tracing]`)
//! export, for transactions over two real PostgreSQL databases:
//!
//! - a commit: the client's transaction, prepare and commit of each branch, decide and
//!   complete; the server's decide (a child of the client's decide), its log write and
//!   its completion; all in one trace, the Xid on every span;
//! - a rollback: the client's rollback of each branch and the server's answer to the
//!   client's `Outcome` question, in the trace of the application's span;
//! - a transaction finished by recovery after its client died: a child process decides,
//!   commits its first branch, stalls in the second's commit and is killed with SIGKILL;
//!   the server commits that branch in a recovery pass whose branch span links to the dead
//!   client's decide span (and the rows are in both databases).
//!
//! The bug it guards against: spans that do not join (a lost or misread trace-context
//! field, a server span with no parent, a recovery span with no link), which leave an
//! operator with pieces instead of a transaction.

use decree_client::RemoteDecisions;
use decree_core::{ResourceManager, RmError, Session, TmConfig, TransactionManager, Vote, Xid};
use decree_rm::{PgFactory, PgHandle, PgRm};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use prost::Message;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the test waits for spans or the server before failing (a failure bound, not
/// a performance target).
const WAIT_MAX: Duration = Duration::from_secs(60);
/// The line by which the child client says it has decided and stalls.
const DECIDED_LINE: &str = "TRACES_CHILD_DECIDED ";

/// One span as the receiver recorded it.
#[derive(Debug, Clone)]
struct Recorded {
    service: String,
    resource: HashMap<String, String>,
    name: String,
    trace_id: String,
    span_id: String,
    parent: String,
    links: Vec<(String, String)>,
    attributes: HashMap<String, String>,
}

type Spans = Arc<Mutex<Vec<Recorded>>>;

fn text(kv: &[KeyValue]) -> HashMap<String, String> {
    kv.iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(s)) => s.clone(),
                Some(any_value::Value::IntValue(i)) => i.to_string(),
                Some(any_value::Value::BoolValue(b)) => b.to_string(),
                Some(any_value::Value::DoubleValue(d)) => d.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), v)
        })
        .collect()
}

/// Starts the OTLP/HTTP receiver; returns its base URL and what it records.
fn receiver() -> (String, Spans) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let spans: Spans = Arc::default();
    let recorded = spans.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let Some(body) = read_request(&mut stream) else { continue };
            let request = ExportTraceServiceRequest::decode(&body[..]).expect("an ExportTraceServiceRequest");
            let mut out = recorded.lock().unwrap();
            for rs in request.resource_spans {
                let resource = text(&rs.resource.map(|r| r.attributes).unwrap_or_default());
                let service = resource.get("service.name").cloned().unwrap_or_default();
                for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                    out.push(Recorded {
                        service: service.clone(),
                        resource: resource.clone(),
                        name: span.name,
                        trace_id: hex::encode(span.trace_id),
                        span_id: hex::encode(span.span_id),
                        parent: hex::encode(span.parent_span_id),
                        links: span
                            .links
                            .iter()
                            .map(|l| (hex::encode(&l.trace_id), hex::encode(&l.span_id)))
                            .collect(),
                        attributes: text(&span.attributes),
                    });
                }
            }
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
        }
    });
    (url, spans)
}

/// Reads one HTTP/1.1 request and returns its body (by `Content-Length`).
fn read_request(stream: &mut std::net::TcpStream) -> Option<Vec<u8>> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(body)
}

/// Waits until `pick` finds what it looks for among the recorded spans.
fn wait_for<T>(spans: &Spans, what: &str, pick: impl Fn(&[Recorded]) -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        if let Some(found) = pick(&spans.lock().unwrap()) {
            return found;
        }
        if Instant::now() > deadline {
            let names: Vec<String> = spans
                .lock()
                .unwrap()
                .iter()
                .map(|s| format!("{}:{}:{}", s.service, s.name, s.trace_id))
                .collect();
            panic!("no {what} within {WAIT_MAX:?}; recorded: {names:#?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The spans of one trace, once every name in `names` is among them.
fn trace_with(spans: &Spans, trace_id: &str, names: &[&str]) -> Vec<Recorded> {
    wait_for(spans, &format!("trace {trace_id} with {names:?}"), |all| {
        let trace: Vec<Recorded> = all.iter().filter(|s| s.trace_id == trace_id).cloned().collect();
        names.iter().all(|n| trace.iter().any(|s| s.name == *n)).then_some(trace)
    })
}

fn one<'a>(trace: &'a [Recorded], service: &str, name: &str) -> &'a Recorded {
    let found: Vec<&Recorded> = trace.iter().filter(|s| s.service == service && s.name == name).collect();
    assert_eq!(found.len(), 1, "one {service} span {name} in {trace:#?}");
    found[0]
}

/// A child process (`decree serve`, the child client); killed on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(dir: &Path, collector: &str, dsn_a: &str, dsn_b: &str) -> (Killed, String) {
    let socket = dir.join("d.sock");
    let config = dir.join("decree.toml");
    std::fs::write(
        &config,
        format!(
            "node = 3\nlog_dir = \"{}\"\nengine = \"journal\"\nunix = \"{}\"\n\
             [recovery]\nrecheck_after_close_ms = 100\n\
             [tracing]\nendpoint = \"{collector}\"\nexport_delay_ms = 50\n\
             [[rm]]\nname = \"pg-a\"\nkind = \"postgres\"\ndsn = \"{dsn_a}\"\n\
             [[rm]]\nname = \"pg-b\"\nkind = \"postgres\"\ndsn = \"{dsn_b}\"\n",
            dir.join("log").display(),
            socket.display()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_decree"))
        .args(["serve", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .spawn()
        .expect("starts decree serve");
    let deadline = Instant::now() + WAIT_MAX;
    while !socket.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("decree serve exited early with {status}");
        }
        assert!(Instant::now() < deadline, "no socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    (Killed(child), format!("unix:{}", socket.display()))
}

fn dsn(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(dsn) => Some(dsn),
        Err(_) => {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
            assert!(!ci, "CI=true but {var} is not set: run scripts/test-dbs.sh start and eval its env");
            eprintln!(
                "skipped: {var} is not set (scripts/test-dbs.sh start; eval \"$(scripts/test-dbs.sh env)\")"
            );
            None
        }
    }
}

/// A session of the coordinator over the server, with a PostgreSQL connection per
/// database (the second one wrapped by `wrap`), and the handles to run SQL on them.
fn session(
    endpoint: &str,
    dsns: [&str; 2],
    wrap: impl FnOnce(Box<dyn ResourceManager>) -> Box<dyn ResourceManager>,
) -> (Session, [PgHandle; 2], Arc<RemoteDecisions>) {
    let store = Arc::new(RemoteDecisions::connect(endpoint).expect("connects"));
    let factories: Vec<Arc<dyn decree_core::RmFactory>> = vec![
        Arc::new(PgFactory::new("pg-a", dsns[0]).unwrap()),
        Arc::new(PgFactory::new("pg-b", dsns[1]).unwrap()),
    ];
    let tm = TransactionManager::with_store(store.clone(), TmConfig::default(), factories).unwrap();
    let (a, b) = (PgRm::connect("pg-a", dsns[0]).unwrap(), PgRm::connect("pg-b", dsns[1]).unwrap());
    let handles = [a.handle(), b.handle()];
    let session = Session::open(&tm, vec![Box::new(a), wrap(Box::new(b))]).unwrap();
    (session, handles, store)
}

/// Inserts `id` into `table` on both connections, in the current transaction's branches.
fn insert(handles: &[PgHandle; 2], table: &str, id: i64) {
    for h in handles {
        h.client().unwrap().execute(&format!("INSERT INTO {table} VALUES ($1)"), &[&id]).unwrap();
    }
}

/// How many rows with `id` `table` holds in each database.
fn rows(dsns: [&str; 2], table: &str, id: i64) -> [i64; 2] {
    dsns.map(|dsn| {
        let rm = PgRm::connect("observer", dsn).unwrap();
        let count: i64 = rm
            .client()
            .unwrap()
            .query_one(&format!("SELECT count(*) FROM {table} WHERE id = $1"), &[&id])
            .unwrap()
            .get(0);
        count
    })
}

fn create_table(dsns: [&str; 2]) -> String {
    let table = format!("otel_{}", std::process::id());
    for dsn in dsns {
        let rm = PgRm::connect("observer", dsn).unwrap();
        rm.client()
            .unwrap()
            .batch_execute(&format!("CREATE TABLE IF NOT EXISTS {table} (id bigint)"))
            .unwrap();
    }
    table
}

/// A resource manager whose commit never returns: the child client stalls in phase two,
/// after its decision, until it is killed.
struct StallAtCommit(Box<dyn ResourceManager>);

impl ResourceManager for StallAtCommit {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn open(&mut self) -> Result<(), RmError> {
        self.0.open()
    }
    fn close(&mut self) -> Result<(), RmError> {
        self.0.close()
    }
    fn start(&mut self, xid: &Xid) -> Result<(), RmError> {
        self.0.start(xid)
    }
    fn end(&mut self, xid: &Xid) -> Result<(), RmError> {
        self.0.end(xid)
    }
    fn prepare(&mut self, xid: &Xid) -> Result<Vote, RmError> {
        self.0.prepare(xid)
    }
    fn commit(&mut self, xid: &Xid, _one_phase: bool) -> Result<(), RmError> {
        println!("{DECIDED_LINE}{}", xid.global());
        let _ = std::io::stdout().flush();
        std::thread::sleep(Duration::from_secs(600));
        Err(RmError::Unavailable("stalled".into()))
    }
    fn rollback(&mut self, xid: &Xid) -> Result<(), RmError> {
        self.0.rollback(xid)
    }
    fn recover(&mut self) -> Result<Vec<Xid>, RmError> {
        self.0.recover()
    }
    fn forget(&mut self, xid: &Xid) -> Result<(), RmError> {
        self.0.forget(xid)
    }
    fn db_system(&self) -> &'static str {
        self.0.db_system()
    }
}

/// The child client: decides a transaction over both databases, then stalls in phase two
/// (the parent kills it). Does nothing in a normal test run.
#[test]
fn child_client_entry() {
    let Ok(endpoint) = std::env::var("DECREE_TEST_TRACES_ENDPOINT") else { return };
    let (a, b) = (std::env::var("DECREE_TEST_PG_A").unwrap(), std::env::var("DECREE_TEST_PG_B").unwrap());
    let table = std::env::var("DECREE_TEST_TRACES_TABLE").unwrap();
    let _exporter = decree_otel::install_from_env("traces-child").unwrap().expect("OTEL_* variables set");
    let (mut session, handles, _store) = session(&endpoint, [&a, &b], |rm| Box::new(StallAtCommit(rm)));
    let mut tx = session.begin().unwrap();
    tx.enlist_all().unwrap();
    insert(&handles, &table, 3);
    let result = tx.commit();
    panic!("the commit should stall until the process is killed, it returned {result:?}");
}

/// Spawns the child client and waits until it has decided; returns it and its Xid.
fn spawn_child(endpoint: &str, collector: &str, table: &str) -> (Killed, String) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["child_client_entry", "--exact", "--nocapture", "--test-threads=1"])
        .env("DECREE_TEST_TRACES_ENDPOINT", endpoint)
        .env("DECREE_TEST_TRACES_TABLE", table)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", collector)
        .env("OTEL_BSP_SCHEDULE_DELAY", "50")
        .env("OTEL_SERVICE_NAME", "traces-child")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let xid = stdout
        .lines()
        .map_while(Result::ok)
        .find_map(|line| line.split_once(DECIDED_LINE).map(|(_, xid)| xid.trim().to_string()))
        .expect("the child client ended before deciding");
    (Killed(child), xid)
}

/// Checks what every span of a transaction's trace shares: its Xid.
fn assert_xid_everywhere(trace: &[Recorded], xid: &str) {
    for s in trace.iter().filter(|s| !s.name.starts_with("app.")) {
        assert_eq!(s.attributes.get("decree.xid").map(String::as_str), Some(xid), "{s:#?}");
    }
}

#[test]
fn one_trace_per_transaction_across_client_and_server() {
    let (Some(dsn_a), Some(dsn_b)) = (dsn("DECREE_TEST_PG_A"), dsn("DECREE_TEST_PG_B")) else { return };
    let dsns = [dsn_a.as_str(), dsn_b.as_str()];
    let (collector, spans) = receiver();
    let dir = tempfile::tempdir().unwrap();
    let (_server, endpoint) = serve(dir.path(), &collector, dsns[0], dsns[1]);
    let table = create_table(dsns);
    // This process is a client configured by the standard variables (one test sets them).
    std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", &collector);
    std::env::set_var("OTEL_BSP_SCHEDULE_DELAY", "50");
    std::env::set_var("OTEL_SERVICE_NAME", "traces-test");
    let exporter = decree_otel::install_from_env("unused").unwrap().expect("configured by OTEL_*");
    let (mut session, handles, store) = session(&endpoint, dsns, |rm| rm);

    // A commit.
    let mut tx = session.begin().unwrap();
    let xid = tx.xid().to_string();
    tx.enlist_all().unwrap();
    insert(&handles, &table, 1);
    tx.commit().unwrap();
    let root = wait_for(&spans, "the committed transaction's span", |all| {
        all.iter()
            .find(|s| s.name == "decree.transaction" && s.attributes.get("decree.xid") == Some(&xid))
            .cloned()
    });
    assert_eq!(root.attributes["decree.outcome"], "committed");
    let names =
        ["decree.transaction", "prepare pg-a", "prepare pg-b", "decree.decide", "commit pg-a", "commit pg-b"];
    let server_names = ["decree.server.decide", "decree.log.write"];
    let trace =
        trace_with(&spans, &root.trace_id, &[&names[..], &server_names[..], &["decree.complete"]].concat());
    assert_xid_everywhere(&trace, &xid);
    let decide = one(&trace, "traces-test", "decree.decide");
    let server_decide = one(&trace, "decree-server", "decree.server.decide");
    assert_eq!(server_decide.parent, decide.span_id, "the server's decide is a child of the client's");
    assert_eq!(one(&trace, "decree-server", "decree.log.write").parent, server_decide.span_id);
    assert_eq!(server_decide.resource["decree.node"], "3");
    assert!(server_decide.resource.contains_key("decree.epoch"), "{:?}", server_decide.resource);
    let prepare = one(&trace, "traces-test", "prepare pg-a");
    assert_eq!(
        (prepare.attributes["db.system.name"].as_str(), prepare.parent.as_str()),
        ("postgresql", root.span_id.as_str())
    );
    assert_eq!(rows(dsns, &table, 1), [1, 1]);

    // A rollback, inside an application span that then asks the server for the outcome.
    rollback_in_app_span(&mut session, &handles, &store, &table, &spans);
    // The commit's completion was buffered (completions are lazy) and goes out at the
    // latest when the session closes: the server's completion joins the commit's trace.
    session.close().unwrap();
    let trace = trace_with(&spans, &root.trace_id, &["decree.server.complete"]);
    let complete = one(&trace, "traces-test", "decree.complete");
    assert_eq!(one(&trace, "decree-server", "decree.server.complete").parent, complete.span_id);

    // A transaction finished by recovery after its client died.
    recovered_after_client_died(&endpoint, &collector, &table, &spans, dsns);
    drop(exporter);
}

fn rollback_in_app_span(
    session: &mut Session,
    handles: &[PgHandle; 2],
    store: &RemoteDecisions,
    table: &str,
    spans: &Spans,
) {
    use opentelemetry::trace::{Span, TraceContextExt, Tracer};
    let tracer = opentelemetry::global::tracer("traces-test");
    let app = tracer.start("app.rollback");
    let app_trace = app.span_context().trace_id().to_string();
    let cx = opentelemetry::Context::current_with_span(app);
    let guard = cx.clone().attach();
    let mut tx = session.begin().unwrap();
    let xid = tx.xid();
    tx.enlist_all().unwrap();
    insert(handles, table, 2);
    tx.rollback().unwrap();
    // Its session lives, so the server answers "in progress" (it saw no decision).
    assert_eq!(store.outcome(&xid).unwrap(), decree_core::Outcome::InProgress);
    drop(guard);
    cx.span().end();
    let names =
        ["app.rollback", "decree.transaction", "rollback pg-a", "rollback pg-b", "decree.server.outcome"];
    let trace = trace_with(spans, &app_trace, &names);
    assert_xid_everywhere(&trace, &xid.to_string());
    let root = one(&trace, "traces-test", "decree.transaction");
    assert_eq!(root.parent, one(&trace, "traces-test", "app.rollback").span_id);
    assert_eq!(root.attributes["decree.outcome"], "rolled_back");
    assert_eq!(
        one(&trace, "decree-server", "decree.server.outcome").attributes["decree.outcome"],
        "InProgress"
    );
}

fn recovered_after_client_died(endpoint: &str, collector: &str, table: &str, spans: &Spans, dsns: [&str; 2]) {
    let (mut child, xid) = spawn_child(endpoint, collector, table);
    // The child's decide span reaches the receiver before the child dies.
    let decide = wait_for(spans, "the child's decide span", |all| {
        all.iter()
            .find(|s| {
                s.service == "traces-child"
                    && s.name == "decree.decide"
                    && s.attributes.get("decree.xid") == Some(&xid)
            })
            .cloned()
    });
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let server_decide = trace_with(spans, &decide.trace_id, &["decree.server.decide"]);
    assert_eq!(one(&server_decide, "decree-server", "decree.server.decide").parent, decide.span_id);
    // The child committed pg-a and stalled in pg-b's commit: recovery commits pg-b, in a
    // span linked to the dead client's decide (pg-a is found finished: no call, no span).
    let recovered = wait_for(spans, "recovery's commit span for the dead client's branch", |all| {
        let found: Vec<Recorded> = all
            .iter()
            .filter(|s| s.service == "decree-server" && s.attributes.get("decree.xid") == Some(&xid))
            .filter(|s| s.name.starts_with("commit "))
            .cloned()
            .collect();
        (!found.is_empty()).then_some(found)
    });
    assert_eq!(recovered.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["commit pg-b"]);
    for s in &recovered {
        assert_eq!(s.links, vec![(decide.trace_id.clone(), decide.span_id.clone())], "{s:#?}");
        assert_eq!(s.attributes["decree.recovery"], "true");
        let pass = wait_for(spans, "the recovery pass span", |all| {
            all.iter().find(|p| p.span_id == s.parent && p.name == "decree.recovery.pass").cloned()
        });
        assert_eq!(pass.trace_id, s.trace_id);
    }
    assert_eq!(rows(dsns, table, 3), [1, 1], "recovery committed both branches");
}

//! The floor under the state-server modes' fixed-rate latency: a bare request and reply
//! over the same transport, at the same rate, from the same number of threads.
//!
//! A fixed-rate commit through the state server costs at least one round trip over a Unix
//! socket or loopback TCP, and on a virtual machine that round trip alone can take tens of
//! microseconds at the median and milliseconds at the 99.9th percentile (a vCPU that
//! halted while idle must be woken). So that `decree bench --rate` reports its latencies
//! against the machine rather than in a vacuum, this module measures, in the same
//! process, right after the runs: an echo server with one blocking thread per connection
//! (nothing between the socket and the reply), clients on the same [`Schedule`] as the
//! benchmark's threads, each sending a frame the size of a two-branch `Decide` and waiting
//! for a reply the size of `DecideOk`. Latencies are counted the same way as the commits':
//! from the scheduled slot (coordinated-omission aware) and from the send (service time).
//!
//! For a pair (`--replicas 2...`) the reference is a bare relay: the client's Unix socket
//! to a relay thread (where the primary runs) that forwards each request over loopback TCP
//! to an echo (where the backup runs, CPU 1 with `--cpus split`) and answers once the echo
//! has: the path of a replicated decision with nothing of decree in it, so that what the
//! second hop costs on this machine is measured beside what the pair adds.
//!
//! For the tls mode the reference is a bare round trip over mutual TLS 1.3 with the very
//! rustls configurations of decree's TLS listener and client (the handshake made before the
//! clock starts), so that what TLS itself costs on this machine is measured beside what it
//! costs through decree.
//!
//! Not a benchmark of decree: nothing of decree's runs here (the TLS floor borrows only its
//! configurations). Nothing asserts on speed.

use crate::client::{Mode, Variant};
use crate::cpus::CpuPlacement;
use crate::rate::Schedule;
use crate::stats::Latencies;
use crate::tx::{panic_message, run_together, BenchPoint, BenchSpec, Stop, THREADS_MAX};
use crate::BenchError;
use serde::Serialize;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Bytes of each request: about a `Decide` frame carrying a two-branch decision.
pub const REQUEST_BYTES: usize = 128;
/// Bytes of each reply: a `DecideOk` frame (length, version, type, request id).
pub const REPLY_BYTES: usize = 14;
/// The name of the reference in reports.
pub const REFERENCE_NAME: &str = "raw-round-trip";

/// The transport the reference crosses, as the benchmark's state-server modes do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// A Unix stream socket in a private temporary directory.
    Unix,
    /// TCP on 127.0.0.1 with Nagle's algorithm off (as decree's client and server set it).
    Tcp,
    /// The same TCP with mutual TLS 1.3: a throwaway CA, the configurations of decree's TLS
    /// listener ([`decree_server::tls::TlsListener`]) and client ([`decree_client::ClientTls`]).
    Tls,
    /// A Unix socket to a relay that forwards each request over loopback TCP to a second
    /// echo (on a pair's backup CPU) and answers with its reply: a pair's two hops.
    UnixRelay,
}

impl Transport {
    /// The name in reports: "unix", "tcp" or "tls" as the benchmark's `--mode`, or
    /// "unix-relay".
    pub fn name(self) -> &'static str {
        match self {
            Transport::Unix => "unix",
            Transport::Tcp => "tcp",
            Transport::Tls => "tls",
            Transport::UnixRelay => "unix-relay",
        }
    }
}

/// What one reference run measured; the fields match the fixed-rate report's.
#[derive(Debug, Clone, Serialize)]
pub struct RoundTripPoint {
    /// Always [`REFERENCE_NAME`], so that JSON readers can tell it from a run.
    pub reference: &'static str,
    /// "unix", "tcp", "tls" or "unix-relay".
    pub transport: &'static str,
    /// Client threads, each with its own connection and schedule.
    pub threads: usize,
    /// The rate asked for over all threads, round trips per second.
    pub rate_target: f64,
    /// Round trips completed by all threads.
    pub round_trips: u64,
    /// Round trips completed per second of wall time.
    pub rate_achieved: f64,
    /// Median round trip from its scheduled slot, in us.
    pub p50_us: f64,
    /// 99th percentile of the same, in us.
    pub p99_us: f64,
    /// 99.9th percentile of the same, in us.
    pub p999_us: f64,
    /// Median round trip from its send, in us.
    pub service_p50_us: f64,
    /// 99th percentile of the same, in us.
    pub service_p99_us: f64,
    /// 99.9th percentile of the same, in us.
    pub service_p999_us: f64,
}

/// A connected pair of ends, whichever the transport.
trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

/// The echo server: its listener's address and the thread accepting on it.
struct Echo {
    connect: Box<dyn Fn() -> std::io::Result<Box<dyn Stream>> + Send + Sync>,
    _dir: Option<tempfile::TempDir>,
}

fn io_error(what: &str, e: std::io::Error) -> BenchError {
    BenchError::Reference(format!("raw round trip: {what}: {e}"))
}

/// Answers every [`REQUEST_BYTES`] read with [`REPLY_BYTES`] until the peer closes (the
/// flush sends a TLS record at once, as decree's server does; plain sockets ignore it).
fn serve_echo(mut stream: impl Read + Write) {
    let mut request = [0u8; REQUEST_BYTES];
    let reply = [0u8; REPLY_BYTES];
    while stream.read_exact(&mut request).is_ok() {
        if stream.write_all(&reply).and_then(|()| stream.flush()).is_err() {
            return;
        }
    }
}

/// Runs `listener`'s accept loop on its own thread, each accepted connection answered by
/// [`serve_echo`] on a thread of its own (they end when their client hangs up, the accept
/// thread when the process does).
fn spawn_acceptor<L, S>(listener: L, accept: fn(&L) -> std::io::Result<S>) -> Result<(), BenchError>
where
    L: Send + 'static,
    S: Read + Write + Send + 'static,
{
    std::thread::Builder::new()
        .name("decree-rtt-accept".into())
        .spawn(move || loop {
            if let Ok(stream) = accept(&listener) {
                let _ = std::thread::Builder::new()
                    .name("decree-rtt-echo".into())
                    .spawn(move || serve_echo(stream));
            }
        })
        .map(|_| ())
        .map_err(|e| io_error("starting the accept thread", e))
}

/// Forwards every request of `client` over `link` and its reply back, until either closes.
fn relay(mut client: impl Read + Write, mut link: Box<dyn Stream>) {
    let mut request = [0u8; REQUEST_BYTES];
    let mut reply = [0u8; REPLY_BYTES];
    while client.read_exact(&mut request).is_ok() {
        let forwarded = link
            .write_all(&request)
            .and_then(|()| link.flush())
            .and_then(|()| link.read_exact(&mut reply))
            .and_then(|()| client.write_all(&reply));
        if forwarded.is_err() {
            return;
        }
    }
}

impl Echo {
    /// Starts the listener and its accept thread (with `cpus`, for a relay's far echo).
    fn start(transport: Transport, cpus: CpuPlacement) -> Result<Echo, BenchError> {
        match transport {
            Transport::Unix => {
                let dir = tempfile::Builder::new()
                    .prefix("decree-rtt")
                    .tempdir()
                    .map_err(|e| io_error("creating the socket directory", e))?;
                let path = dir.path().join("echo.sock");
                let listener = UnixListener::bind(&path)
                    .map_err(|e| io_error(&format!("binding {}", path.display()), e))?;
                spawn_acceptor(listener, |l| l.accept().map(|(stream, _)| stream))?;
                let connect = move || UnixStream::connect(&path).map(|s| Box::new(s) as Box<dyn Stream>);
                Ok(Echo { connect: Box::new(connect), _dir: Some(dir) })
            }
            Transport::Tcp => {
                let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                    .map_err(|e| io_error("binding 127.0.0.1", e))?;
                let address = listener.local_addr().map_err(|e| io_error("reading the port", e))?;
                spawn_acceptor(listener, |l| {
                    let (stream, _) = l.accept()?;
                    stream.set_nodelay(true)?;
                    Ok(stream)
                })?;
                let connect = move || {
                    let stream = TcpStream::connect(address)?;
                    stream.set_nodelay(true)?;
                    Ok(Box::new(stream) as Box<dyn Stream>)
                };
                Ok(Echo { connect: Box::new(connect), _dir: None })
            }
            Transport::Tls => Echo::start_tls(),
            Transport::UnixRelay => Echo::start_relay(cpus),
        }
    }

    /// The relay: a TCP echo started from a thread placed as a pair's backup (its threads
    /// inherit the CPU), and a Unix listener whose every connection gets a relay thread
    /// with a TCP connection of its own to that echo.
    fn start_relay(cpus: CpuPlacement) -> Result<Echo, BenchError> {
        let far = {
            let _placed = cpus.for_backup()?;
            Echo::start(Transport::Tcp, cpus)?
        };
        let dir = tempfile::Builder::new()
            .prefix("decree-rtt")
            .tempdir()
            .map_err(|e| io_error("creating the socket directory", e))?;
        let path = dir.path().join("relay.sock");
        let listener =
            UnixListener::bind(&path).map_err(|e| io_error(&format!("binding {}", path.display()), e))?;
        std::thread::Builder::new()
            .name("decree-rtt-accept".into())
            .spawn(move || loop {
                let Ok((client, _)) = listener.accept() else { continue };
                let Ok(link) = (far.connect)() else { continue };
                let _ = std::thread::Builder::new()
                    .name("decree-rtt-relay".into())
                    .spawn(move || relay(client, link));
            })
            .map_err(|e| io_error("starting the accept thread", e))?;
        let connect = move || UnixStream::connect(&path).map(|s| Box::new(s) as Box<dyn Stream>);
        Ok(Echo { connect: Box::new(connect), _dir: Some(dir) })
    }

    /// The TLS echo: a throwaway CA in a temporary directory, decree's own rustls
    /// configurations built from its files, and clients that finish the handshake before
    /// they are handed out.
    fn start_tls() -> Result<Echo, BenchError> {
        use decree_server::testing::{TestCa, Validity};
        let dir = tempfile::Builder::new()
            .prefix("decree-rtt")
            .tempdir()
            .map_err(|e| io_error("creating the certificate directory", e))?;
        let ca = TestCa::new("decree-bench round-trip CA");
        let ca_file = ca.write_ca(&dir.path().join("ca.pem"));
        let server = ca.server(dir.path(), "echo", Validity::Current);
        let client = ca.client(dir.path(), "decree-bench", Validity::Current);
        let listener_tls = decree_server::tls::TlsListener::load(&decree_server::config::TlsConfig {
            cert: server.cert,
            key: server.key,
            client_ca: ca_file.clone(),
            clients_allowed: Vec::new(),
        })
        .map_err(|e| BenchError::Reference(format!("raw round trip: TLS listener: {e}")))?;
        let server_config = listener_tls.rustls_config();
        let client_config = decree_client::ClientTls::from_files(&ca_file, &client.cert, &client.key)
            .map_err(|e| BenchError::Reference(format!("raw round trip: TLS client: {e}")))?
            .rustls_config();
        let listener =
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|e| io_error("binding 127.0.0.1", e))?;
        let address = listener.local_addr().map_err(|e| io_error("reading the port", e))?;
        std::thread::Builder::new()
            .name("decree-rtt-accept".into())
            .spawn(move || loop {
                let Ok((stream, _)) = listener.accept() else { continue };
                let Ok(session) = rustls::ServerConnection::new(server_config.clone()) else { continue };
                let _ = stream.set_nodelay(true);
                // The handshake runs inside the first read of the echo thread.
                let _ = std::thread::Builder::new()
                    .name("decree-rtt-echo".into())
                    .spawn(move || serve_echo(rustls::StreamOwned::new(session, stream)));
            })
            .map_err(|e| io_error("starting the accept thread", e))?;
        let connect = move || {
            let mut stream = TcpStream::connect(address)?;
            stream.set_nodelay(true)?;
            let name = rustls::pki_types::ServerName::try_from("localhost").map_err(std::io::Error::other)?;
            let mut session =
                rustls::ClientConnection::new(client_config.clone(), name).map_err(std::io::Error::other)?;
            while session.is_handshaking() {
                session.complete_io(&mut stream)?;
            }
            Ok(Box::new(rustls::StreamOwned::new(session, stream)) as Box<dyn Stream>)
        };
        Ok(Echo { connect: Box::new(connect), _dir: Some(dir) })
    }
}

/// One client thread: round trips on its schedule until `duration` has passed.
fn client_loop(
    echo: &Echo,
    rate: f64,
    threads: usize,
    index: usize,
    start: Instant,
    duration: Duration,
    failed: &AtomicBool,
) -> Result<(u64, Latencies, Latencies), BenchError> {
    let mut stream = (echo.connect)().map_err(|e| io_error("connecting", e))?;
    let mut schedule = Schedule::new(rate, threads, index, start)?;
    let (mut scheduled, mut service) = (Latencies::new(), Latencies::new());
    let request = [0u8; REQUEST_BYTES];
    let mut reply = [0u8; REPLY_BYTES];
    let mut count = 0u64;
    while start.elapsed() < duration && !failed.load(Ordering::Relaxed) {
        let slot = schedule.wait_next();
        let sent = Instant::now();
        stream.write_all(&request).and_then(|()| stream.flush()).map_err(|e| io_error("sending", e))?;
        stream.read_exact(&mut reply).map_err(|e| io_error("receiving", e))?;
        let end = Instant::now();
        scheduled.record(end.saturating_duration_since(slot));
        service.record(end.saturating_duration_since(sent));
        count += 1;
    }
    Ok((count, scheduled, service))
}

/// The transport of a fixed-rate run's same-run floor: the run's own, when it goes through a
/// state server on this machine (for the tls mode, a bare round trip over the same TLS, so
/// that `--mode tcp,tls` shows what TLS itself costs beside what it costs through decree;
/// for a pair, the bare relay of its two hops). None for the embedded mode (nothing crosses
/// a socket) or a server given by TCP address (it may be on another machine, and the
/// reference is loopback).
pub fn transport_of(variant: Variant, connect: Option<&str>) -> Option<Transport> {
    match (variant.mode, connect) {
        (Mode::Unix, None) if variant.replicas.count > 1 => Some(Transport::UnixRelay),
        (Mode::Unix, _) => Some(Transport::Unix),
        (Mode::Tcp, None) => Some(Transport::Tcp),
        (Mode::Tls, None) => Some(Transport::Tls),
        _ => None,
    }
}

/// Measures the same-run floor of the fixed-rate run `point` of `spec` (a bare round trip
/// over its transport, at its rate and thread count, for as long, on the same CPUs), where
/// it has one.
pub fn floor_of(spec: &BenchSpec, point: &BenchPoint) -> Result<Option<RoundTripPoint>, BenchError> {
    let variant = point.mode.parse::<Variant>()?;
    let (Some(rate), Some(transport)) = (spec.rate, transport_of(variant, spec.connect.as_deref())) else {
        return Ok(None);
    };
    let duration = match spec.stop {
        Stop::Duration(d) => d,
        Stop::Cycles(n) => Duration::from_secs_f64(n as f64 * point.threads as f64 / rate),
    };
    // On the CPUs of the run (`--cpus split`: clients and echo on CPU 0, as the run's
    // clients and server), so that the floor crosses what the run crossed.
    let _placed = spec.cpus.for_run()?;
    measure(transport, spec.cpus, rate, point.threads, duration).map(Some)
}

/// Measures round trips over `transport` at `rate` per second spread over `threads`
/// threads for `duration`, the way the fixed-rate benchmark schedules its commits.
pub fn measure(
    transport: Transport,
    cpus: CpuPlacement,
    rate: f64,
    threads: usize,
    duration: Duration,
) -> Result<RoundTripPoint, BenchError> {
    if threads == 0 || threads > THREADS_MAX {
        return Err(BenchError::Option(format!("--threads {threads}: expected 1 to {THREADS_MAX}")));
    }
    let echo = Echo::start(transport, cpus)?;
    let (outcomes, start, end) = run_together(threads, |index, start, failed| {
        client_loop(&echo, rate, threads, index, start, duration, failed)
    });
    let (mut scheduled, mut service, mut count) = (Latencies::new(), Latencies::new(), 0u64);
    for outcome in outcomes {
        let (n, s, v) = outcome.map_err(|p| BenchError::Panicked(panic_message(&p)))??;
        count += n;
        scheduled.merge(&s);
        service.merge(&v);
    }
    let elapsed = end.saturating_duration_since(start).as_secs_f64();
    Ok(RoundTripPoint {
        reference: REFERENCE_NAME,
        transport: transport.name(),
        threads,
        rate_target: rate,
        round_trips: count,
        rate_achieved: if elapsed > 0.0 { count as f64 / elapsed } else { 0.0 },
        p50_us: scheduled.quantile_us(0.50),
        p99_us: scheduled.quantile_us(0.99),
        p999_us: scheduled.quantile_us(0.999),
        service_p50_us: service.quantile_us(0.50),
        service_p99_us: service.quantile_us(0.99),
        service_p999_us: service.quantile_us(0.999),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scheduled_round_trip_is_counted_over_every_transport() {
        for transport in [Transport::Unix, Transport::Tcp, Transport::Tls, Transport::UnixRelay] {
            let point =
                measure(transport, CpuPlacement::Shared, 2_000.0, 2, Duration::from_millis(200)).unwrap();
            assert_eq!(point.transport, transport.name());
            // Every thread makes its first round trip at once (its slot is within 1 ms of
            // the start), so the count is at least the thread count, however slow the box.
            assert!(point.round_trips >= 2, "{transport:?}: {} round trips", point.round_trips);
            assert!(point.rate_achieved > 0.0);
            assert!(point.p50_us > 0.0 && point.p50_us <= point.p99_us && point.p99_us <= point.p999_us);
            // A round trip's service time is part of its scheduled latency.
            assert!(point.service_p50_us > 0.0 && point.service_p50_us <= point.p50_us);
            assert!(point.service_p999_us <= point.p999_us);
        }
    }

    #[test]
    fn each_server_mode_on_this_machine_has_the_floor_of_its_own_transport() {
        let single = Variant::single;
        assert_eq!(transport_of(single(Mode::Unix), None), Some(Transport::Unix));
        let remote = Some("unix:/run/decree.sock");
        assert_eq!(transport_of(single(Mode::Unix), remote), Some(Transport::Unix));
        assert_eq!(transport_of(single(Mode::Tcp), None), Some(Transport::Tcp));
        assert_eq!(transport_of(single(Mode::Tls), None), Some(Transport::Tls), "TLS is measured bare too");
        let other_machine = Some("tcp:10.0.0.7:7878");
        assert_eq!(transport_of(single(Mode::Tcp), other_machine), None, "maybe another machine");
        assert_eq!(transport_of(single(Mode::Tls), Some("tls:db.example:7879")), None);
        assert_eq!(transport_of(single(Mode::Embedded), None), None, "nothing crosses a socket");
        for pair in ["unix-pair", "unix-pair-received", "unix-pair-tls"] {
            let variant = pair.parse::<Variant>().unwrap();
            assert_eq!(transport_of(variant, None), Some(Transport::UnixRelay), "{pair}: two hops");
        }
    }

    #[test]
    fn a_split_relay_answers_and_gives_the_run_its_cpu_back() {
        let cpus = crate::cpus::cpus_of_this_thread();
        if !(cpus.contains(&0) && cpus.contains(&1)) {
            return; // --cpus split needs CPUs 0 and 1 (refused elsewhere, tested in cpus.rs).
        }
        let _run = CpuPlacement::Split.for_run().unwrap();
        let point =
            measure(Transport::UnixRelay, CpuPlacement::Split, 2_000.0, 1, Duration::from_millis(100))
                .unwrap();
        assert_eq!(point.transport, "unix-relay");
        assert!(point.round_trips >= 1 && point.p50_us > 0.0, "{point:?}");
        assert_eq!(
            crate::cpus::cpus_of_this_thread(),
            [0],
            "the run's placement is back after the relay started"
        );
    }

    #[test]
    fn bad_thread_counts_and_rates_are_refused() {
        assert!(measure(Transport::Unix, CpuPlacement::Shared, 100.0, 0, Duration::from_millis(10)).is_err());
        assert!(measure(
            Transport::Unix,
            CpuPlacement::Shared,
            100.0,
            THREADS_MAX + 1,
            Duration::from_millis(10)
        )
        .is_err());
        assert!(measure(Transport::Unix, CpuPlacement::Shared, -1.0, 1, Duration::from_millis(10)).is_err());
    }
}

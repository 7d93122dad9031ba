//! What opening one connection to the state server costs: the TCP connect, the TLS
//! handshake in the tls mode, and the protocol's `Hello`/`HelloOk`. A client pays it once
//! per connection, and sessions are long-lived, so the runs' latencies never contain it:
//! this is where it is reported.
//!
//! Measured on the run's own server just before the run, one connection at a time, each
//! closed before the next, through the client library (`RemoteDecisions::connect_with`
//! opens exactly one connection and greets the server). In the tls mode twice:
//! - `connect`: each connection with a client configuration of its own, hence a full
//!   handshake (certificates sent and checked both ways), what the first connection of a
//!   client process pays;
//! - `resumed`: every connection sharing the run's configuration, as the connections of one
//!   client do, so that rustls resumes the TLS session from a ticket the server sent on an
//!   earlier connection (no certificates; the key exchange still runs).
//!
//! In the unix and tcp modes both would be the same, so only `connect` is measured. Not a
//! benchmark of how many handshakes a server can do at once, and nothing asserts on speed.

use crate::stats::{Latencies, Summary};
use crate::BenchError;
use decree_client::{ClientOptions, ClientTlsFiles, Endpoint, RemoteDecisions};
use serde::Serialize;
use std::time::Instant;

/// Connections opened per measurement: enough for a stable median and p95 in well under a
/// second per run.
pub const HANDSHAKE_CONNECTIONS: usize = 200;

/// The connection times of one run's server, in microseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Handshake {
    /// Connections timed for each figure.
    pub connections: usize,
    /// Each connection with a client configuration of its own: a full TLS handshake in the
    /// tls mode.
    pub connect: Summary,
    /// tls only: the connections sharing one configuration, resumed from a session ticket.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resumed: Option<Summary>,
}

/// How the benchmark's clients reach the server, so that the measurement connects the same
/// way.
#[derive(Debug, Clone)]
pub struct Connector {
    /// The server's endpoint.
    pub endpoint: Endpoint,
    /// The options the run's clients use (their TLS configuration included).
    pub options: ClientOptions,
    /// The TLS files, read again for each connection of the full-handshake figure; `None`
    /// outside the tls mode.
    pub tls_files: Option<ClientTlsFiles>,
}

fn connect_error(endpoint: &Endpoint, e: impl std::fmt::Display) -> BenchError {
    BenchError::Client { context: format!("timing connections to {endpoint}"), message: e.to_string() }
}

/// Opens `connections` connections one after another, each with the options `options`
/// makes (outside the timed part), and returns their times.
fn time_connections(
    endpoint: &Endpoint,
    connections: usize,
    options: impl Fn() -> Result<ClientOptions, BenchError>,
) -> Result<Latencies, BenchError> {
    let mut times = Latencies::new();
    for _ in 0..connections {
        let options = options()?;
        let start = Instant::now();
        let store = RemoteDecisions::connect_with(endpoint.clone(), options)
            .map_err(|e| connect_error(endpoint, e))?;
        times.record(start.elapsed());
        drop(store);
    }
    Ok(times)
}

/// Times `connections` connections (twice in the tls mode, see the module documentation).
pub fn measure(connector: &Connector, connections: usize) -> Result<Handshake, BenchError> {
    let endpoint = &connector.endpoint;
    let shared = || Ok(connector.options.clone());
    let Some(files) = &connector.tls_files else {
        let connect = time_connections(endpoint, connections, shared)?.summary();
        return Ok(Handshake { connections, connect, resumed: None });
    };
    let fresh = || {
        let tls = files.load().map_err(|e| connect_error(endpoint, e))?;
        Ok(ClientOptions { tls, ..connector.options.clone() })
    };
    let connect = time_connections(endpoint, connections, fresh)?.summary();
    let resumed = time_connections(endpoint, connections, shared)?.summary();
    Ok(Handshake { connections, connect, resumed: Some(resumed) })
}

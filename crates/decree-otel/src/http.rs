//! A blocking HTTP/1.1 client for the OTLP exporter: one POST per export batch over a
//! plain TCP connection, from the batch processor's own thread.
//!
//! OpenTelemetry's exporter takes any [`HttpClient`]; its built-in ones bring reqwest or
//! hyper and an async runtime. Exports are rare (one request per batch, from one thread),
//! so a connection per request over `std::net` is enough and adds no dependency. Only
//! `http://` endpoints: a collector on the same host or network (an agent) is the usual
//! set-up; TLS to a remote collector is the agent's job. Every read and write has the
//! exporter's timeout, and a response is read up to [`RESPONSE_BYTES_MAX`].

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// The most of a response that is read (a collector answers with a small protobuf).
pub const RESPONSE_BYTES_MAX: usize = 1 << 20;

/// The exporter's HTTP client: blocking, one connection per request.
#[derive(Debug, Clone)]
pub struct BlockingHttp {
    /// Bound of the connect and of each read and write.
    pub timeout: Duration,
}

#[async_trait::async_trait]
impl HttpClient for BlockingHttp {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        post(self.timeout, request)
    }
}

/// Sends `request` and reads the whole response (the server closes the connection).
fn post(timeout: Duration, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
    let uri = request.uri();
    if uri.scheme_str() != Some("http") {
        return Err(format!(
            "OTLP endpoint {uri}: only http:// is supported (run a local collector for TLS)"
        )
        .into());
    }
    let host = uri.host().ok_or_else(|| format!("OTLP endpoint {uri} names no host"))?;
    let port = uri.port_u16().unwrap_or(80);
    let addr = (host, port).to_socket_addrs()?.next().ok_or_else(|| format!("{host} resolves to nothing"))?;
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut head =
        format!("{} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n", request.method());
    for (name, value) in request.headers() {
        head.push_str(&format!("{name}: {}\r\n", value.to_str().unwrap_or("")));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", request.body().len()));
    stream.write_all(head.as_bytes())?;
    stream.write_all(request.body())?;
    let mut raw = Vec::new();
    stream.take(RESPONSE_BYTES_MAX as u64).read_to_end(&mut raw)?;
    parse_response(&raw)
}

/// The status and body of a whole HTTP/1.1 response (`Content-Length` or read to the end).
fn parse_response(raw: &[u8]) -> Result<Response<Bytes>, HttpError> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or("HTTP response without a header end")?;
    let head = std::str::from_utf8(&raw[..end])?;
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in HTTP response {:?}", head.lines().next()))?;
    let body = Bytes::copy_from_slice(&raw[end + 4..]);
    Ok(Response::builder().status(status).body(body)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_gives_its_status_and_body() {
        let r = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").unwrap();
        assert_eq!((r.status().as_u16(), &r.body()[..]), (200, &b"ok"[..]));
        assert!(parse_response(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(parse_response(b"garbage\r\n\r\n").is_err());
    }
}

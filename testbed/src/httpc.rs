//! A minimal HTTP/1.1 client for the kubelet's readiness probes and the CLI's calls to
//! the testbed API server.
//!
//! One request per connection (`Connection: close`), body read to EOF. It is deliberately
//! small: the kubelet's prober does the same (k8s.io/kubernetes `pkg/probe/http`: a GET
//! with `User-Agent: kube-probe/<major>.<minor>`, success on 200 ≤ status < 400).
//! It must run on the runtime whose thread sits in the wanted network namespace
//! (see [`crate::netns`]): the socket is created where `connect` runs.

use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// User-Agent the testbed kubelet's probes send (the kubelet's, for v1.32).
pub const KUBE_PROBE_USER_AGENT: &str = "kube-probe/1.32";

/// Largest response body read (bytes); the rest is dropped.
const MAX_BODY: usize = 16 * 1024 * 1024;

/// A parsed response: status code and raw body.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

/// Errors: connect/IO failures, a timeout, or an unparseable status line.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("{addr}: {source}")]
    Io {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{addr}: no answer within {timeout:?}")]
    Timeout { addr: SocketAddr, timeout: Duration },
    #[error("{addr}: malformed HTTP response")]
    Malformed { addr: SocketAddr },
}

/// Sends `method path` to `addr` with the given extra headers and body; returns the
/// status and body. The whole exchange is bounded by `timeout`.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> Result<Response, HttpError> {
    match tokio::time::timeout(timeout, exchange(addr, method, path, headers, body)).await {
        Ok(r) => r,
        Err(_) => Err(HttpError::Timeout { addr, timeout }),
    }
}

async fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Response, HttpError> {
    let io = |source| HttpError::Io { addr, source };
    let mut stream = TcpStream::connect(addr).await.map_err(io)?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(k);
        req.push_str(": ");
        req.push_str(v);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).await.map_err(io)?;
    stream.write_all(body).await.map_err(io)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = stream.read(&mut chunk).await.map_err(io)?;
        if n == 0 || buf.len() > MAX_BODY {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    parse(addr, &buf)
}

/// Parses a whole HTTP/1.1 response (status line, headers, body; chunked bodies
/// decoded). `addr` only names the peer in errors. Errors: [`HttpError::Malformed`].
pub(crate) fn parse(addr: SocketAddr, buf: &[u8]) -> Result<Response, HttpError> {
    let bad = || HttpError::Malformed { addr };
    let head_end = find(buf, b"\r\n\r\n").ok_or_else(bad)?;
    let head = std::str::from_utf8(&buf[..head_end]).map_err(|_| bad())?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().ok_or_else(bad)?;
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let raw = &buf[head_end + 4..];
    let body = if chunked { dechunk(raw) } else { raw.to_vec() };
    Ok(Response { status, body })
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = find(raw, b"\r\n") {
        let size = std::str::from_utf8(&raw[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next().unwrap_or("").trim(), 16).ok());
        let Some(size) = size else { break };
        if size == 0 {
            break;
        }
        let start = eol + 2;
        let end = (start + size).min(raw.len());
        out.extend_from_slice(&raw[start..end]);
        raw = raw.get(end + 2..).unwrap_or(&[]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr() -> SocketAddr {
        "127.0.0.1:1".parse().unwrap()
    }

    #[test]
    fn parses_status_and_plain_body() {
        let r = parse(
            addr(),
            b"HTTP/1.1 503 Service Unavailable\r\nA: b\r\n\r\nno",
        )
        .unwrap();
        assert_eq!(r.status, 503);
        assert_eq!(r.body, b"no");
    }

    #[test]
    fn parses_chunked_body() {
        let r = parse(
            addr(),
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.body, b"abcde");
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse(addr(), b"garbage").is_err());
    }
}

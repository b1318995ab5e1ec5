//! Hostile clients against the real `target-server serve` binary on 127.0.0.1 (no
//! testbed): oversized heads and bodies, more connections than the limit, slowloris.
//! The limits are the binary's defaults (`target_server::http::{MAX_HEAD_BYTES,
//! MAX_HEADERS, MAX_BODY_BYTES, MAX_CONNECTIONS, HEADER_READ_TIMEOUT}`), so these tests
//! pin down the stated numbers, not test-only ones.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};
use target_server::http::{
    HEADER_READ_TIMEOUT, MAX_BODY_BYTES, MAX_CONNECTIONS, MAX_HEADERS, MAX_HEAD_BYTES,
};

const BIN: &str = env!("CARGO_BIN_EXE_target-server");

/// Scheduling slack allowed on top of a stated deadline (2 shared cores).
const TOLERANCE: Duration = Duration::from_millis(1500);

/// `target-server serve --port 0`, killed on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(pod: &str) -> Server {
        let mut child = Command::new(BIN)
            .args(["serve", "--port", "0"])
            .env("POD_NAME", pod)
            .env_remove("POD_NAMESPACE")
            .env_remove("POD_IP")
            .env_remove("NODE_NAME")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn target-server");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(a) = line.strip_prefix("target-server: listening on ") {
                    if let Ok(a) = a.parse::<SocketAddr>() {
                        let _ = tx.send(a.port());
                    }
                }
                eprintln!("[child] {line}");
            }
        });
        let port = match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(p) => p,
            Err(_) => {
                let _ = child.kill();
                panic!("target-server did not report its port");
            }
        };
        Server { child, port }
    }

    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("read timeout");
        s
    }

    /// Resident set size of the server process, bytes (`VmRSS` in /proc).
    fn rss_bytes(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .expect("VmRSS")
            * 1024
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes `req` (ignoring a reset: the server may close before reading it all), reads
/// to EOF; returns the status code (None if the server closed without answering).
fn exchange(s: &mut TcpStream, req: &[u8]) -> Option<u16> {
    let _ = s.write_all(req);
    read_status(s)
}

fn read_status(s: &mut TcpStream) -> Option<u16> {
    let mut resp = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => resp.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("read: {e}"),
        }
    }
    let text = String::from_utf8_lossy(&resp);
    text.strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
}

fn get_root(server: &Server) -> Option<u16> {
    exchange(
        &mut server.connect(),
        b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    )
}

#[test]
fn a_request_head_over_the_cap_is_431_and_one_just_under_it_is_served() {
    let server = Server::start("tgt-head");
    // One header line that takes the head past MAX_HEAD_BYTES.
    let big = format!(
        "GET / HTTP/1.1\r\nHost: t\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(MAX_HEAD_BYTES)
    );
    assert_eq!(exchange(&mut server.connect(), big.as_bytes()), Some(431));
    // A head of MAX_HEAD_BYTES − 100 bytes is an ordinary request.
    let pad = MAX_HEAD_BYTES - 100;
    let ok = format!(
        "GET / HTTP/1.1\r\nHost: t\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(pad)
    );
    assert_eq!(exchange(&mut server.connect(), ok.as_bytes()), Some(200));
    // A head that never ends (no blank line) is cut at the buffer cap, not buffered on.
    let mut s = server.connect();
    let endless = vec![b'a'; 8 * MAX_HEAD_BYTES];
    let started = Instant::now();
    let status = exchange(
        &mut s,
        &[b"GET / HTTP/1.1\r\nX-Pad: ".as_slice(), &endless].concat(),
    );
    assert!(
        matches!(status, Some(431) | None),
        "endless head got {status:?}"
    );
    assert!(
        started.elapsed() < HEADER_READ_TIMEOUT,
        "cut by size, not by time"
    );
}

#[test]
fn more_header_lines_than_the_cap_is_431() {
    let server = Server::start("tgt-headers");
    let mut req = String::from("GET / HTTP/1.1\r\nHost: t\r\n");
    for i in 0..MAX_HEADERS + 1 {
        req.push_str(&format!("X-{i}: v\r\n"));
    }
    req.push_str("\r\n");
    assert_eq!(exchange(&mut server.connect(), req.as_bytes()), Some(431));
    let mut req = String::from("GET / HTTP/1.1\r\nHost: t\r\n");
    for i in 0..MAX_HEADERS - 2 {
        req.push_str(&format!("X-{i}: v\r\n"));
    }
    req.push_str("\r\n");
    assert_eq!(exchange(&mut server.connect(), req.as_bytes()), Some(200));
}

#[test]
fn a_large_body_is_413_without_being_read_and_a_small_one_is_ignored() {
    let server = Server::start("tgt-body");
    // Announces 100 GB and sends the first MiB: answered 413 at once, the rest unread.
    let mut s = server.connect();
    let started = Instant::now();
    let head = "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 100000000000\r\n\r\n";
    let _ = s.write_all(head.as_bytes());
    let _ = s.write_all(&vec![b'x'; 1 << 20]);
    assert_eq!(read_status(&mut s), Some(413));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "413 took {:?}",
        started.elapsed()
    );
    // Chunked: length unknown, also 413.
    let chunked =
        "POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    assert_eq!(
        exchange(&mut server.connect(), chunked.as_bytes()),
        Some(413)
    );
    // At the cap: served as usual.
    let body = "b".repeat(MAX_BODY_BYTES as usize);
    let small = format!(
        "GET / HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    assert_eq!(exchange(&mut server.connect(), small.as_bytes()), Some(200));
}

#[test]
fn a_slow_header_client_is_dropped_at_the_header_timeout() {
    let server = Server::start("tgt-slowloris");
    // Slowloris: one byte every 300 ms, never finishing the head.
    let mut s = server.connect();
    let started = Instant::now();
    let writer = {
        let mut w = s.try_clone().expect("clone");
        thread::spawn(move || {
            for b in b"GET / HTTP/1.1\r\nHost: t\r\nX-Slow: ".iter().cycle() {
                if w.write_all(&[*b]).is_err() {
                    return;
                }
                thread::sleep(Duration::from_millis(300));
            }
        })
    };
    let status = read_status(&mut s);
    let took = started.elapsed();
    // hyper answers 408 on a header timeout or just closes; either way no 200.
    assert!(matches!(status, None | Some(408)), "got {status:?}");
    assert!(
        took >= HEADER_READ_TIMEOUT - Duration::from_millis(200)
            && took <= HEADER_READ_TIMEOUT + TOLERANCE,
        "slowloris dropped after {took:?}, header timeout {HEADER_READ_TIMEOUT:?}"
    );
    let _ = s.shutdown(std::net::Shutdown::Both);
    let _ = writer.join();
    // A client that connects and sends nothing at all goes the same way.
    let mut silent = server.connect();
    let started = Instant::now();
    let status = read_status(&mut silent);
    let took = started.elapsed();
    assert!(matches!(status, None | Some(408)), "got {status:?}");
    assert!(
        took <= HEADER_READ_TIMEOUT + TOLERANCE,
        "silent client dropped after {took:?}"
    );
}

#[test]
fn past_the_connection_limit_a_legit_request_waits_for_a_slot_and_is_served() {
    let server = Server::start("tgt-limit");
    let rss_before = server.rss_bytes();
    // Fill every slot with a client that sent almost a whole head and stops (each costs
    // the server a buffer of that head), then wait until all are accepted.
    let partial = format!(
        "GET / HTTP/1.1\r\nX-Pad: {}",
        "p".repeat(MAX_HEAD_BYTES - 64)
    );
    let started = Instant::now();
    let mut idle: Vec<TcpStream> = (0..MAX_CONNECTIONS)
        .map(|_| {
            let mut s = server.connect();
            s.write_all(partial.as_bytes()).expect("write partial head");
            s
        })
        .collect();
    thread::sleep(Duration::from_millis(500));
    let rss_full = server.rss_bytes();
    // The limit+1th: connects (backlog), but is not answered while the slots are held.
    let mut legit = server.connect();
    legit
        .write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .expect("write");
    legit
        .set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    let mut b = [0u8; 1];
    match legit.read(&mut b) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => {
            panic!("the limit+1th connection was answered while all slots were held: {other:?}")
        }
    }
    // Once the idle holders hit the header timeout, the legit one is served.
    legit
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let status = read_status(&mut legit);
    let waited = started.elapsed();
    assert_eq!(status, Some(200));
    assert!(
        waited <= HEADER_READ_TIMEOUT + TOLERANCE,
        "served after {waited:?}: slots should free within the header timeout"
    );
    // The holders were dropped by the server (EOF, or a 408).
    for s in &mut idle {
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        assert!(matches!(read_status(s), None | Some(408)));
    }
    let growth = rss_full.saturating_sub(rss_before);
    eprintln!(
        "rss: idle server {} KiB, with {MAX_CONNECTIONS} near-full heads {} KiB (+{} KiB)",
        rss_before / 1024,
        rss_full / 1024,
        growth / 1024
    );
    // 128 connections × (16 KiB read buffer + task) must stay a few MiB.
    assert!(growth < 16 << 20, "RSS grew by {growth} bytes");
    // And the server is fine afterwards.
    assert_eq!(get_root(&server), Some(200));
}

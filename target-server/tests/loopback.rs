//! Loopback tests of the real `target-server` binary (127.0.0.1, port 0 / free ports):
//! `serve` identity/readiness/SIGTERM, and `probe` against `serve` and against small
//! in-test targets (late listener, wrong peer, works-then-breaks), its report, its
//! termination log and SIGTERM handling.

use firstpacket_report::{MAX_SOURCE_REPORT_BYTES, SOURCE_REPORT_SCHEMA};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_target-server");

/// A spawned `target-server` whose HTTP port was read from its stderr.
struct Proc {
    child: Child,
    port: u16,
    spawned: Instant,
    /// Every stderr line so far.
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    fn spawn(args: &[&str], env: &[(&str, &str)]) -> Proc {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .env_remove("POD_IP")
            .env_remove("NODE_NAME")
            // No kubelet here: tests that want `ready_at` send the kube-probe themselves.
            .env("FIRSTPACKET_READY_WAIT", "0s")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let spawned = Instant::now();
        let mut child = cmd.spawn().expect("spawn target-server");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&lines);
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("target-server: listening on ") {
                    if let Ok(a) = addr.parse::<SocketAddr>() {
                        let _ = tx.send(a.port());
                    }
                }
                eprintln!("[child] {line}");
                seen.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        let port = match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(p) => p,
            Err(_) => {
                let _ = child.kill();
                panic!("target-server did not report its listening port");
            }
        };
        Proc {
            child,
            port,
            spawned,
            stderr: lines,
        }
    }

    /// Polls (every 10 ms, at most `limit`) until a stderr line contains `text`; panics
    /// with the lines seen otherwise.
    fn wait_stderr(&self, text: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let lines = self
                .stderr
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            if lines.iter().any(|l| l.contains(text)) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no stderr line with {text:?} within {limit:?}; saw {lines:#?}"
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    fn sigterm(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(ok.success());
    }

    /// Wait for exit (killing it after `limit`), return status and stdout.
    fn finish(mut self, limit: Duration) -> (ExitStatus, String) {
        let deadline = Instant::now() + limit;
        loop {
            match self.child.try_wait().expect("try_wait") {
                Some(_) => break,
                None if Instant::now() > deadline => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    panic!("target-server did not exit within {limit:?}");
                }
                None => thread::sleep(Duration::from_millis(20)),
            }
        }
        let out = self.child.wait_with_output().expect("output");
        (
            out.status,
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }
}

/// Minimal HTTP/1.1 GET; returns (status, body).
fn get(port: u16, path: &str, user_agent: Option<&str>) -> (u16, String) {
    let ua = user_agent
        .map(|u| format!("User-Agent: {u}\r\n"))
        .unwrap_or_default();
    request(
        port,
        &format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{ua}"),
    )
}

/// Sends `head` (request line and headers, each ending in CRLF) with `Connection:
/// close` and reads the answer to its end; returns (status, body).
fn request(port: u16, head: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    write!(s, "{head}Connection: close\r\n\r\n").expect("write");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read");
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status code");
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn kubelet_readyz(port: u16) -> u16 {
    get(port, "/readyz", Some("kube-probe/1.32")).0
}

/// An in-test target: answers `GET /` with `status` and `{"pod": name}` for the first
/// `answers` connections, then closes its listener (later connects are refused).
struct FakeTarget {
    port: u16,
    served: Arc<AtomicUsize>,
}

impl FakeTarget {
    fn start(listener: TcpListener, name: &str, answers: usize) -> FakeTarget {
        Self::start_with_status(listener, "200 OK", name, answers)
    }

    fn start_with_status(
        listener: TcpListener,
        status: &'static str,
        name: &str,
        answers: usize,
    ) -> FakeTarget {
        let port = listener.local_addr().expect("addr").port();
        let served = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&served);
        let body = format!(r#"{{"pod":"{name}"}}"#);
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { continue };
                let mut buf = [0u8; 2048];
                let mut req = Vec::new();
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = write!(
                    s,
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                drop(s);
                if counter.fetch_add(1, Ordering::SeqCst) + 1 >= answers {
                    return; // drops the listener: connection refused from now on
                }
            }
        });
        FakeTarget { port, served }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// A per-test scratch directory, removed when dropped (also on test failure).
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ts-loopback-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }

    fn log(&self) -> PathBuf {
        self.0.join("termination-log")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn parse_report(stdout: &str) -> Value {
    let line = stdout.lines().last().expect("a report line on stdout");
    assert!(
        line.len() <= MAX_SOURCE_REPORT_BYTES,
        "{} bytes",
        line.len()
    );
    let v: Value = serde_json::from_str(line).expect("report is JSON");
    let schema: Value = serde_json::from_str(SOURCE_REPORT_SCHEMA).expect("schema");
    let validator = jsonschema::draft202012::new(&schema).expect("schema compiles");
    let errs: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
    assert!(errs.is_empty(), "report violates schema: {errs:?}\n{line}");
    v
}

fn f(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

fn u(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not an integer in {v}"))
}

#[test]
fn serve_answers_identity_and_readyz_then_503_after_sigterm_and_exits_0() {
    let p = Proc::spawn(
        &["serve", "--port", "0", "--drain", "1s"],
        &[
            ("POD_NAME", "tgt-1"),
            ("POD_NAMESPACE", "firstpacket"),
            ("POD_IP", "10.0.0.7"),
            ("NODE_NAME", "node-2"),
        ],
    );
    let (status, body) = get(p.port, "/", None);
    assert_eq!(status, 200);
    let id: Value = serde_json::from_str(&body).expect("identity JSON");
    assert_eq!(id["pod"], "tgt-1");
    assert_eq!(id["namespace"], "firstpacket");
    assert_eq!(id["ip"], "10.0.0.7");
    assert_eq!(id["node"], "node-2");
    assert_eq!(get(p.port, "/readyz", None).0, 200);
    assert_eq!(get(p.port, "/healthz", None).0, 200);
    assert_eq!(get(p.port, "/hostname", None), (200, "tgt-1".to_string()));

    p.sigterm();
    // Within the drain the listener still answers, and /readyz says 503.
    let mut saw_503 = false;
    let until = Instant::now() + Duration::from_millis(800);
    while Instant::now() < until {
        if get(p.port, "/readyz", None).0 == 503 {
            saw_503 = true;
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    assert!(saw_503, "/readyz never turned 503 after SIGTERM");
    let (status, _) = p.finish(Duration::from_secs(5));
    assert_eq!(status.code(), Some(0));
}

#[test]
fn probe_against_serve_succeeds_and_ttfp_is_zero_when_ready_came_later() {
    let target = Proc::spawn(&["serve", "--port", "0"], &[("POD_NAME", "tgt-ok")]);
    let scratch = Scratch::new("success");
    let log = scratch.log();
    let target_addr = format!("127.0.0.1:{}", target.port);
    let src = Proc::spawn(
        &[
            "probe",
            "--target",
            &target_addr,
            "--expect-pod",
            "tgt-ok",
            "--port",
            "0",
            "--hold",
            "1500ms",
            "--give-up",
            "10s",
            "--termination-log",
            log.to_str().expect("path"),
        ],
        &[("POD_NAME", "src-ok")],
    );
    // The source serves its own identity too.
    let (status, body) = get(src.port, "/", None);
    assert_eq!(status, 200);
    let id: Value = serde_json::from_str(&body).expect("identity JSON");
    assert_eq!(id["pod"], "src-ok");
    // The kubelet's first readiness probe arrives after the first success: wait for it.
    src.wait_stderr("first success observed", Duration::from_secs(10));
    assert_eq!(kubelet_readyz(src.port), 200);
    let (status, stdout) = src.finish(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0));
    let r = parse_report(&stdout);

    assert_eq!(r["outcome"], "success");
    assert_eq!(r["pod"], "src-ok");
    assert_eq!(r["expect_pod"], "tgt-ok");
    let first_attempt = f(&r, "first_attempt");
    let sent = f(&r, "first_success_sent");
    assert!(sent >= first_attempt, "{sent} < {first_attempt}");
    assert!(f(&r, "first_success_received") >= sent);
    let ready_at = f(&r, "ready_at");
    assert!(
        ready_at > sent,
        "ready_at {ready_at} should follow success {sent}"
    );
    let raw = f(&r, "raw_ttfp_seconds");
    assert!((raw - (sent - ready_at)).abs() < 2e-6, "raw {raw}");
    assert_eq!(f(&r, "ttfp_seconds"), raw.max(0.0));
    assert_eq!(u(&r, "attempts_before_success"), 0);
    assert!(
        u(&r["hold"], "attempts") >= 10,
        "hold attempts {}",
        r["hold"]
    );
    assert_eq!(u(&r["hold"], "failures"), 0);

    // The termination log holds the same line.
    let file = std::fs::read_to_string(&log).expect("termination log written");
    assert_eq!(file.trim_end(), stdout.lines().last().expect("line"));

    target.sigterm();
    let (status, _) = target.finish(Duration::from_secs(5));
    assert_eq!(status.code(), Some(0));
}

#[test]
fn probe_counts_refused_until_the_target_listens_and_ttfp_is_positive() {
    let port = free_port();
    let scratch = Scratch::new("refused");
    let log = scratch.log();
    let target_addr = format!("127.0.0.1:{port}");
    let src = Proc::spawn(
        &[
            "probe",
            "--target",
            &target_addr,
            "--expect-pod",
            "late",
            "--port",
            "0",
            "--interval",
            "100ms",
            "--hold",
            "1s",
            "--give-up",
            "10s",
            "--termination-log",
            log.to_str().expect("path"),
        ],
        &[("POD_NAME", "src-late")],
    );
    // Ready early (before the target exists): TTFP is the wait for the target.
    thread::sleep(Duration::from_millis(200));
    assert_eq!(kubelet_readyz(src.port), 200);
    let ready_sent = src.spawned.elapsed().as_secs_f64();
    thread::sleep(Duration::from_millis(800));
    let listener = TcpListener::bind(("127.0.0.1", port)).expect("re-bind the free port");
    let listening = src.spawned.elapsed().as_secs_f64();
    let fake = FakeTarget::start(listener, "late", usize::MAX);
    let (status, stdout) = src.finish(Duration::from_secs(15));
    assert_eq!(status.code(), Some(0));
    let r = parse_report(&stdout);

    assert_eq!(r["outcome"], "success", "{r}");
    assert!(u(&r["errors"], "refused") >= 5, "errors {}", r["errors"]);
    assert_eq!(r["last_error"], "refused");
    assert!(u(&r, "failures_before_success") >= 5);
    assert_eq!(
        u(&r, "failures_before_success"),
        u(&r, "attempts_before_success")
    );
    // The probe's clock starts a little after our spawn instant, so its times are at
    // most that exec lag (allow 150 ms) below ours; the success goes out on the first
    // tick after the listener is up (interval 100 ms, + 250 ms for a busy machine).
    let sent = f(&r, "first_success_sent");
    assert!(
        sent >= listening - 0.15,
        "sent {sent} before listen {listening}"
    );
    assert!(
        sent <= listening + 0.35,
        "sent {sent} long after listen {listening}"
    );
    let ready_at = f(&r, "ready_at");
    assert!(
        ready_at <= ready_sent + 0.01 && ready_at >= 0.1,
        "ready_at {ready_at}"
    );
    let ttfp = f(&r, "ttfp_seconds");
    assert!(ttfp > 0.5, "ttfp {ttfp}");
    assert!((ttfp - f(&r, "raw_ttfp_seconds")).abs() < 1e-9);
    assert!(fake.served.load(Ordering::SeqCst) >= 1);
}

#[test]
fn a_200_from_another_pod_is_never_a_success() {
    let other = Proc::spawn(&["serve", "--port", "0"], &[("POD_NAME", "someone-else")]);
    let scratch = Scratch::new("wrong");
    let log = scratch.log();
    let target_addr = format!("127.0.0.1:{}", other.port);
    // Flags through their environment fallbacks.
    let src = Proc::spawn(
        &["probe"],
        &[
            ("POD_NAME", "src-w"),
            ("FIRSTPACKET_TARGET", &target_addr),
            ("FIRSTPACKET_EXPECT_POD", "the-right-one"),
            ("FIRSTPACKET_PORT", "0"),
            ("FIRSTPACKET_GIVE_UP", "1s"),
            ("FIRSTPACKET_HOLD", "1s"),
            ("FIRSTPACKET_TERMINATION_LOG", log.to_str().expect("path")),
        ],
    );
    let (status, stdout) = src.finish(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0));
    let r = parse_report(&stdout);
    assert_eq!(r["outcome"], "wrong_peer");
    assert_eq!(r["wrong_peer"], "someone-else");
    assert_eq!(r["expect_pod"], "the-right-one");
    assert!(r["first_success_sent"].is_null());
    assert!(r["ttfp_seconds"].is_null());
    let wrong = u(&r["errors"], "wrong_peer");
    assert!(wrong >= 5, "wrong_peer count {wrong}");
    assert_eq!(u(&r, "failures_before_success"), wrong);
    assert_eq!(r["last_error"], "wrong_peer");
    // give-up 1 s: dialing stopped around then.
    assert!(f(&r, "give_up_seconds") == 1.0);
    other.sigterm();
    let _ = other.finish(Duration::from_secs(5));
}

#[test]
fn failures_after_the_first_success_are_lost_after_success() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let fake = FakeTarget::start(listener, "flaky", 1);
    let scratch = Scratch::new("hold");
    let log = scratch.log();
    let target_addr = format!("127.0.0.1:{}", fake.port);
    let src = Proc::spawn(
        &[
            "probe",
            "--target",
            &target_addr,
            "--expect-pod",
            "flaky",
            "--port",
            "0",
            "--hold",
            "2s",
            "--give-up",
            "5s",
            "--termination-log",
            log.to_str().expect("path"),
        ],
        &[("POD_NAME", "src-h")],
    );
    let (status, stdout) = src.finish(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0));
    let r = parse_report(&stdout);
    assert_eq!(r["outcome"], "lost_after_success", "{r}");
    let hold = &r["hold"];
    let failures = u(hold, "failures");
    assert!(failures >= 10, "hold failures {failures}");
    assert!(u(hold, "attempts") >= failures);
    let series: u64 = hold["failures_per_second"]
        .as_array()
        .expect("series")
        .iter()
        .map(|x| x.as_u64().expect("count"))
        .sum();
    assert_eq!(series, failures);
    // Refused once the listener is gone (reset if one was queued when it closed).
    assert_eq!(
        u(&r["errors"], "refused") + u(&r["errors"], "reset"),
        failures
    );
    assert!(f(hold, "seconds") >= 1.9);
    assert!(r["ready_at"].is_null() && r["ttfp_seconds"].is_null());
    assert_eq!(fake.served.load(Ordering::SeqCst), 1);
}

#[test]
fn sigterm_mid_probe_writes_a_terminated_report_and_exits_0() {
    let port = free_port();
    let scratch = Scratch::new("term");
    let log = scratch.log();
    let target_addr = format!("127.0.0.1:{port}");
    let src = Proc::spawn(
        &[
            "probe",
            "--target",
            &target_addr,
            "--expect-pod",
            "nobody",
            "--port",
            "0",
            "--give-up",
            "60s",
            "--termination-log",
            log.to_str().expect("path"),
        ],
        &[("POD_NAME", "src-t")],
    );
    thread::sleep(Duration::from_millis(500));
    src.sigterm();
    let (status, stdout) = src.finish(Duration::from_secs(5));
    assert_eq!(status.code(), Some(0));
    let r = parse_report(&stdout);
    assert_eq!(r["outcome"], "terminated");
    assert!(u(&r["errors"], "refused") >= 2);
    let file = std::fs::read_to_string(&log).expect("termination log written");
    assert_eq!(file.trim_end(), stdout.lines().last().expect("line"));
}

#[test]
fn unwritable_termination_log_still_reports_on_stdout_and_exits_0() {
    let port = free_port();
    let target_addr = format!("127.0.0.1:{port}");
    let src = Proc::spawn(
        &[
            "probe",
            "--target",
            &target_addr,
            "--expect-pod",
            "nobody",
            "--port",
            "0",
            "--give-up",
            "300ms",
            "--termination-log",
            "/nonexistent-dir/termination-log",
        ],
        &[("POD_NAME", "src-u")],
    );
    let (status, stdout) = src.finish(Duration::from_secs(5));
    assert_eq!(status.code(), Some(0));
    let r = parse_report(&stdout);
    assert_eq!(r["outcome"], "no_success");
    assert!(u(&r, "attempts_before_success") >= 2);
}

#[test]
fn a_target_that_accepts_but_never_answers_is_a_timeout_bounded_by_attempt_timeout() {
    // Listening (the kernel completes the handshake) but never reading or answering.
    let silent = TcpListener::bind("127.0.0.1:0").expect("bind");
    let target_addr = format!("127.0.0.1:{}", silent.local_addr().expect("addr").port());
    let scratch = Scratch::new("timeout");
    let log = scratch.log();
    let src = Proc::spawn(
        &[
            "probe",
            "--target",
            &target_addr,
            "--expect-pod",
            "silent",
            "--port",
            "0",
            "--attempt-timeout",
            "300ms",
            "--give-up",
            "1s",
            "--termination-log",
            log.to_str().expect("path"),
        ],
        &[("POD_NAME", "src-s")],
    );
    let started = Instant::now();
    let (status, stdout) = src.finish(Duration::from_secs(10));
    // give-up 1 s + one attempt-timeout drain, plus slack for a busy machine.
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(status.code(), Some(0));
    let r = parse_report(&stdout);
    drop(silent);
    assert_eq!(r["outcome"], "no_success");
    assert_eq!(r["last_error"], "timeout");
    let timeouts = u(&r["errors"], "timeout");
    assert!(timeouts >= 5, "timeouts {timeouts}");
    assert_eq!(u(&r, "failures_before_success"), timeouts);
}

#[test]
fn a_non_200_answer_from_the_expected_pod_is_http_status() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let fake = FakeTarget::start_with_status(listener, "503 Service Unavailable", "t", usize::MAX);
    let scratch = Scratch::new("status");
    let log = scratch.log();
    let target_addr = format!("127.0.0.1:{}", fake.port);
    let src = Proc::spawn(
        &[
            "probe",
            "--target",
            &target_addr,
            "--expect-pod",
            "t",
            "--port",
            "0",
            "--give-up",
            "500ms",
            "--termination-log",
            log.to_str().expect("path"),
        ],
        &[("POD_NAME", "src-503")],
    );
    let (status, stdout) = src.finish(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0));
    let r = parse_report(&stdout);
    assert_eq!(r["outcome"], "no_success");
    assert_eq!(r["last_error"], "http_status");
    assert!(u(&r["errors"], "http_status") >= 3);
    assert!(r["first_success_sent"].is_null());
}

/// A hold shorter than the kubelet's first readiness probe must not lose `ready_at`:
/// the source waits (`--ready-wait`) for the probe after dialing ends.
#[test]
fn a_short_hold_still_waits_for_the_kubelets_first_readiness_probe() {
    let target = Proc::spawn(&["serve", "--port", "0"], &[("POD_NAME", "tgt-short")]);
    let target_addr = format!("127.0.0.1:{}", target.port);
    let src = Proc::spawn(
        &[
            "probe",
            "--target",
            &target_addr,
            "--expect-pod",
            "tgt-short",
            "--port",
            "0",
            "--hold",
            "0s",
            "--give-up",
            "10s",
            "--termination-log",
            "/dev/null",
        ],
        &[("POD_NAME", "src-short"), ("FIRSTPACKET_READY_WAIT", "5s")],
    );
    let up = Instant::now();
    // Well after the success and the (empty) hold, the kubelet's first probe arrives:
    // wait for the success, then until 800 ms after it reported its port.
    src.wait_stderr("first success observed", Duration::from_secs(10));
    thread::sleep(Duration::from_millis(800).saturating_sub(up.elapsed()));
    assert_eq!(kubelet_readyz(src.port), 200);
    let (status, stdout) = src.finish(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0));
    let r = parse_report(&stdout);
    assert_eq!(r["outcome"], "success");
    let ready_at = f(&r, "ready_at");
    assert!(
        ready_at >= 0.7,
        "ready_at {ready_at} should be the late kube-probe"
    );
    assert_eq!(f(&r, "ttfp_seconds"), 0.0, "success came before Ready");
    target.sigterm();
    let _ = target.finish(Duration::from_secs(5));
}

/// An in-test target behind a gate: answers `GET /` with 200 and `{"pod": name}` while
/// `open`, and closes the connection unanswered while shut (the attempt fails at once,
/// as a policy's reject would make it).
struct GatedTarget {
    port: u16,
    open: Arc<std::sync::atomic::AtomicBool>,
}

impl GatedTarget {
    fn start(name: &str) -> GatedTarget {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let open = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let gate = Arc::clone(&open);
        let body = format!(r#"{{"pod":"{name}"}}"#);
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { continue };
                if !gate.load(Ordering::SeqCst) {
                    drop(s);
                    continue;
                }
                let mut buf = [0u8; 2048];
                let mut req = Vec::new();
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        GatedTarget { port, open }
    }

    fn set(&self, open: bool) {
        self.open.store(open, Ordering::SeqCst);
    }
}

/// Minimal HTTP/1.1 POST without a body; returns (status, body).
fn post(port: u16, path: &str) -> (u16, String) {
    request(
        port,
        &format!("POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n"),
    )
}

#[test]
fn policy_change_times_admission_and_revocation_from_the_marks_on_its_own_clock() {
    let target = GatedTarget::start("pc-t");
    let scratch = Scratch::new("policy-change");
    let log = scratch.log();
    let addr = format!("127.0.0.1:{}", target.port);
    let src = Proc::spawn(
        &[
            "probe",
            "--policy-change",
            "--target",
            &addr,
            "--expect-pod",
            "pc-t",
            "--port",
            "0",
            "--interval",
            "50ms",
            "--attempt-timeout",
            "300ms",
            "--give-up",
            "5s",
            "--hold",
            "300ms",
            "--revoke-quiet",
            "500ms",
            "--termination-log",
            log.to_str().expect("path"),
        ],
        &[("POD_NAME", "pc-s")],
    );
    // Out of order: refused, nothing taken.
    assert_eq!(post(src.port, "/mark/allow").0, 409);
    assert_eq!(get(src.port, "/mark/arm", None).0, 405);
    thread::sleep(Duration::from_millis(300));
    let (code, body) = post(src.port, "/mark/arm");
    assert_eq!(code, 200, "{body}");
    let allow_sent = Instant::now();
    assert_eq!(post(src.port, "/mark/allow").0, 200);
    let allow_returned = Instant::now();
    // The "policy" applies 400 ms after the allow mark.
    thread::sleep(Duration::from_millis(400));
    let opened = Instant::now();
    target.set(true);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (code, body) = get(src.port, "/policy", None);
        assert_eq!(code, 200);
        let v: Value = serde_json::from_str(&body).expect("policy status JSON");
        if v["held_at"].is_number() {
            break;
        }
        assert!(Instant::now() < deadline, "no hold end: {v}");
        thread::sleep(Duration::from_millis(50));
    }
    let revoke_sent = Instant::now();
    assert_eq!(post(src.port, "/mark/revoke").0, 200);
    let revoke_returned = Instant::now();
    // The revocation applies 250 ms after the revoke mark.
    thread::sleep(Duration::from_millis(250));
    let shut = Instant::now();
    target.set(false);
    let (status, stdout) = src.finish(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0));
    let r = parse_report(&stdout);
    let p = &r["policy"];
    assert_eq!(p["outcome"], "revoked", "{p}");
    assert_eq!(u(p, "admitted_before_arm"), 0, "{p}");
    assert_eq!(u(p, "hold_failures"), 0, "{p}");
    // Each at or after the moment it applied (the mark was taken between the request's
    // send and its answer, on the source's clock), within one dial interval + 30 ms.
    let within = |got: f64, applied: Instant, sent: Instant, returned: Instant| {
        let lo = applied.duration_since(returned).as_secs_f64() - 0.005;
        let hi = applied.duration_since(sent).as_secs_f64() + 0.05 + 0.03;
        assert!((lo..=hi).contains(&got), "{got} not in [{lo}, {hi}]: {p}");
    };
    within(f(p, "admitted_seconds"), opened, allow_sent, allow_returned);
    within(f(p, "revoked_seconds"), shut, revoke_sent, revoke_returned);
    assert!(f(p, "allow_at") > f(p, "arm_at"));
}

#[test]
fn a_policy_change_source_answered_before_any_mark_counts_breaches() {
    let target = GatedTarget::start("pc-t2");
    target.set(true);
    let addr = format!("127.0.0.1:{}", target.port);
    let scratch = Scratch::new("policy-breach");
    let log = scratch.log();
    let src = Proc::spawn(
        &[
            "probe",
            "--policy-change",
            "--target",
            &addr,
            "--expect-pod",
            "pc-t2",
            "--port",
            "0",
            "--interval",
            "50ms",
            "--attempt-timeout",
            "300ms",
            "--give-up",
            "1s",
            "--termination-log",
            log.to_str().expect("path"),
        ],
        &[("POD_NAME", "pc-s2")],
    );
    let (status, stdout) = src.finish(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0));
    let r = parse_report(&stdout);
    let p = &r["policy"];
    assert_eq!(p["outcome"], "no_allow_mark", "{p}");
    assert!(u(p, "admitted_before_arm") >= 10, "{p}");
    assert!(p["first_admitted_before_arm_sent"].is_number());
}

/// Extra paths (issue 33): `tcp/mtu`, `udp/small`, `udp/mtu` to `serve` all succeed
/// with the expected identity, each with its own line in `paths`; a UDP path to a port
/// nothing answers on fails `refused` without touching the main path's result.
#[test]
fn extra_paths_are_dialed_beside_the_main_one_and_reported_each() {
    let target = Proc::spawn(&["serve", "--port", "0"], &[("POD_NAME", "tgt-paths")]);
    let scratch = Scratch::new("paths");
    let log = scratch.log();
    let addr = format!("127.0.0.1:{}", target.port);
    let dead = format!("127.0.0.1:{}", free_port());
    // The same server on IPv6 too (serve listens on both families).
    let v6 = format!("[::1]:{}", target.port);
    let paths = format!(
        "tcp/mtu={addr},udp/small={addr},udp/mtu={addr},udp/small={dead},tcp/small={v6},udp/mtu={v6}"
    );
    let src = Proc::spawn(
        &[
            "probe",
            "--target",
            &addr,
            "--expect-pod",
            "tgt-paths",
            "--port",
            "0",
            "--hold",
            "1s",
            "--give-up",
            "3s",
            "--mtu",
            "1500",
            "--path",
            &paths,
            "--termination-log",
            log.to_str().expect("path"),
        ],
        &[("POD_NAME", "src-paths")],
    );
    src.wait_stderr("first success observed", Duration::from_secs(10));
    assert_eq!(kubelet_readyz(src.port), 200);
    let (status, stdout) = src.finish(Duration::from_secs(15));
    assert_eq!(status.code(), Some(0));
    assert!(stdout.len() <= MAX_SOURCE_REPORT_BYTES + 1);
    let r = parse_report(&stdout);
    assert_eq!(r["outcome"], "success", "{r:#}");
    let p = r["paths"].as_array().expect("paths");
    let shape: Vec<(&str, Option<u64>, &str)> = p
        .iter()
        .map(|x| {
            (
                x["path"].as_str().unwrap(),
                x["bytes"].as_u64(),
                x["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        vec![
            ("tcp/ipv4/mtu", Some(1500), "success"),
            ("udp/ipv4/small", None, "success"),
            ("udp/ipv4/mtu", Some(1500), "success"),
            ("udp/ipv4/small", None, "no_success"),
            ("tcp/ipv6/small", None, "success"),
            ("udp/ipv6/mtu", Some(1500), "success"),
        ]
    );
    for x in &p[..3] {
        assert!(x["first_success_sent"].as_f64().is_some(), "{x}");
        assert_eq!(x["hold_failures"], 0, "{x}");
    }
    assert_eq!(p[3]["last_error"], "refused", "{}", p[3]);
    assert!(p[3]["first_success_sent"].is_null());
    // Nothing is lost on loopback: TCP lines say 0 retransmits, UDP ones say nothing.
    assert_eq!(r["first_success_retransmits"], 0, "{r:#}");
    let retrans: Vec<&Value> = p.iter().map(|x| &x["retransmits"]).collect();
    assert_eq!(
        retrans,
        [
            &json!(0),
            &Value::Null,
            &Value::Null,
            &Value::Null,
            &json!(0),
            &Value::Null
        ],
        "{r:#}"
    );
    target.sigterm();
    let _ = target.finish(Duration::from_secs(5));
}

/// A first success that came only after TCP's retransmission back-off says so (issue
/// 33): in a network namespace of its own (`unshare --user --map-root-user --net`), an
/// nftables rule drops every TCP segment carrying data on its way into `serve` for the
/// first second (handshakes pass; on the input hook, as a lossy network would: a drop on
/// the output hook fails the send locally, which Linux does not count as a
/// retransmission); the attempts sent meanwhile succeed once their request is
/// retransmitted after the rule goes. The report's first success — the earliest-sent
/// one — carries the kernel's retransmission count on the main path and on the
/// `tcp/mtu` path, and its answer came at least one retransmission timeout (200 ms,
/// Linux's floor) after it was sent; the UDP path has no count.
#[test]
fn a_first_success_after_tcp_retransmits_carries_their_count() {
    let script = format!(
        r#"set -e
ip link set lo up
nft add table inet fp
nft add chain inet fp in '{{ type filter hook input priority 0; }}'
nft add rule inet fp in tcp dport 8080 'tcp flags & psh == psh' drop
POD_NAME=tgt-rt {BIN} serve --port 8080 >/dev/null 2>&1 &
SERVE=$!
sleep 0.3
(sleep 1; nft delete table inet fp) &
FIRSTPACKET_READY_WAIT=0s POD_NAME=src-rt {BIN} probe --target 127.0.0.1:8080 \
  --expect-pod tgt-rt --port 8081 --attempt-timeout 2s --hold 500ms --give-up 10s \
  --mtu 1500 --path tcp/mtu=127.0.0.1:8080,udp/small=127.0.0.1:8080 2>/dev/null || true
kill $SERVE; wait
"#
    );
    let out = Command::new("unshare")
        .args(["--user", "--map-root-user", "--net", "sh", "-c", &script])
        .stdin(Stdio::null())
        .output()
        .expect("run unshare (util-linux)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "unshare + nft (user and network namespaces, nftables) failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = parse_report(&stdout);
    assert_eq!(r["outcome"], "success", "{r:#}");
    let rt = r["first_success_retransmits"].as_u64().expect("a count");
    assert!(rt >= 1, "no retransmit counted: {r:#}");
    let waited =
        r["first_success_received"].as_f64().unwrap() - r["first_success_sent"].as_f64().unwrap();
    assert!(waited >= 0.2, "answered {waited:.3} s after sending: {r:#}");
    let p = r["paths"].as_array().expect("paths");
    assert_eq!(p[0]["path"], "tcp/ipv4/mtu");
    assert!(
        p[0]["retransmits"].as_u64().is_some_and(|n| n >= 1),
        "{r:#}"
    );
    assert_eq!(p[1]["path"], "udp/ipv4/small");
    assert!(p[1]["retransmits"].is_null(), "{r:#}");
}

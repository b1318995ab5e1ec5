//! Hostile node-agent pages against the real scrape path, on loopback HTTP servers run
//! by the test (no testbed): garbage, oversized (≥ 100 MB, streamed from a generator),
//! endlessly slow, silent. Every scrape runs under the shipped defaults
//! ([`ScrapeSettings::default`]: 2 s whole-request timeout, 8 MiB body limit) and the
//! parser's caps (`prober::agents::expo::MAX_*`), and must end within them with the
//! right signal (`agent_bad_metrics` for a page problem, `agent_unreachable` for no
//! answer) and no panic.

use firstpacket_report::{ProbeResult, Signal};
use prober::agents::correlate::Params;
use prober::agents::discover::{AgentIndex, AgentTarget};
use prober::agents::expo;
use prober::agents::profiles::{builtin_profiles, CALICO_FELIX};
use prober::agents::scrape::{AgentWatcher, ScrapeError, ScrapeMode, ScrapeSettings, Scraper};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Scheduling slack on top of a stated deadline (2 shared cores, tests in parallel).
const TOLERANCE: Duration = Duration::from_millis(1500);

/// How a test agent answers.
#[derive(Clone)]
enum Agent {
    /// 200 with this body (Content-Length set).
    Page(Arc<Vec<u8>>),
    /// 200, no Content-Length, valid-looking exposition lines streamed until `total`
    /// bytes or the client goes away; `sent` counts bytes the socket accepted.
    Endless { total: u64, sent: Arc<AtomicU64> },
    /// 200 announcing `Content-Length: total`, then the same stream.
    Announced { total: u64, sent: Arc<AtomicU64> },
    /// A complete head, then one body byte per second (never finishing).
    Trickle,
    /// The status line and headers one byte per second.
    TrickleHead,
    /// Reads the request, never answers, keeps the connection open.
    Silent,
    /// Not HTTP at all: these bytes, then close.
    Raw(Arc<Vec<u8>>),
}

/// Serves `agent` on 127.0.0.1 (every connection); returns the port.
async fn serve(agent: Agent) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = l.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let agent = agent.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let ok = "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n";
                let announced = matches!(agent, Agent::Announced { .. });
                match agent {
                    Agent::Page(body) => {
                        let head = format!(
                            "{ok}Content-Length: {}\r\nConnection: close\r\n\r\n",
                            body.len()
                        );
                        let _ = s.write_all(head.as_bytes()).await;
                        let _ = s.write_all(&body).await;
                    }
                    Agent::Endless { total, sent } | Agent::Announced { total, sent } => {
                        let head = if announced {
                            format!("{ok}Content-Length: {total}\r\n\r\n")
                        } else {
                            format!("{ok}Connection: close\r\n\r\n")
                        };
                        if s.write_all(head.as_bytes()).await.is_err() {
                            return;
                        }
                        // A generator: 64 KiB chunks of sample lines, never the whole.
                        let mut chunk = String::with_capacity(70_000);
                        let mut i = 0u64;
                        while sent.load(Ordering::SeqCst) < total {
                            chunk.clear();
                            while chunk.len() < 65_536 {
                                chunk.push_str(&format!(
                                    "felix_int_dataplane_failures{{n=\"{i}\"}} {i}\n"
                                ));
                                i += 1;
                            }
                            if s.write_all(chunk.as_bytes()).await.is_err() {
                                return;
                            }
                            sent.fetch_add(chunk.len() as u64, Ordering::SeqCst);
                        }
                    }
                    Agent::Trickle => {
                        let head = format!("{ok}Content-Length: 1000000\r\n\r\n");
                        if s.write_all(head.as_bytes()).await.is_err() {
                            return;
                        }
                        loop {
                            if s.write_all(b"#").await.is_err() {
                                return;
                            }
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                    Agent::TrickleHead => {
                        for b in ok.bytes().cycle() {
                            if s.write_all(&[b]).await.is_err() {
                                return;
                            }
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                    Agent::Silent => {
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                    }
                    Agent::Raw(bytes) => {
                        let _ = s.write_all(&bytes).await;
                    }
                }
            });
        }
    });
    port
}

fn target(node: &str, port: u16) -> AgentTarget {
    AgentTarget {
        profile: CALICO_FELIX.into(),
        node: node.into(),
        namespace: "kube-system".into(),
        pod: format!("calico-node-{node}"),
        uid: format!("uid-{node}"),
        restart_count: 0,
        host_ip: Some("127.0.0.1".into()),
        port: Some(port),
        ready: true,
        terminating: false,
        started_ms: None,
    }
}

/// The shipped settings, direct path (no API server here).
fn settings() -> ScrapeSettings {
    ScrapeSettings {
        mode: ScrapeMode::Direct,
        sweep_batch: 0,
        hot_interval: Duration::from_secs(3600),
        ..ScrapeSettings::default()
    }
}

/// One scrape of `agent` through the [`Scraper`] under [`settings`]; returns the error
/// (a hostile agent must not give a reading) and the time taken.
async fn scrape(agent: Agent) -> (ScrapeError, Duration) {
    let port = serve(agent).await;
    let profiles = builtin_profiles();
    let felix = profiles
        .iter()
        .find(|p| p.name == CALICO_FELIX)
        .expect("felix profile");
    let s = Scraper::new(None, settings());
    let started = Instant::now();
    let got = s.scrape(&target("n1", port), felix).await;
    let took = started.elapsed();
    match got {
        Ok(r) => panic!("a hostile page gave a reading: {r:?}"),
        Err(e) => (e, took),
    }
}

/// Deterministic pseudo-random bytes (xorshift), so failures repeat.
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn page(body: impl Into<Vec<u8>>) -> Agent {
    Agent::Page(Arc::new(body.into()))
}

fn assert_bad_metrics(e: &ScrapeError, took: Duration, reason: &str) {
    assert_eq!(e.signal(), Signal::AgentBadMetrics, "{e}");
    assert_eq!(e.reason(), reason, "{e}");
    let limit = settings().timeout + TOLERANCE;
    assert!(took <= limit, "took {took:?} > {limit:?}: {e}");
}

#[tokio::test]
async fn random_bytes_non_utf8_and_html_pages_are_agent_bad_metrics() {
    // Random bytes: almost surely not UTF-8.
    let (e, took) = scrape(page(noise(200_000, 7))).await;
    assert_bad_metrics(&e, took, "not_utf8");
    // Valid UTF-8 but not exposition text.
    let (e, took) = scrape(page(
        "<!DOCTYPE html><html><body><h1>Metrics</h1>{\"a\": 1}</body></html>\n",
    ))
    .await;
    assert_bad_metrics(&e, took, "parse");
    // Latin-1 bytes in an otherwise valid page.
    let (e, took) = scrape(page(
        b"felix_int_dataplane_failures{n=\"caf\xe9\"} 1\n".to_vec(),
    ))
    .await;
    assert_bad_metrics(&e, took, "not_utf8");
    // Random printable ASCII, 1 MB.
    let text: Vec<u8> = noise(1 << 20, 11)
        .into_iter()
        .map(|b| b' ' + b % 95)
        .collect();
    let (e, took) = scrape(page(text)).await;
    assert_bad_metrics(&e, took, "parse");
    // A readable page of someone else's metrics.
    let (e, took) = scrape(page("go_goroutines 12\nprocess_open_fds 9\n")).await;
    assert_bad_metrics(&e, took, "no_signal_metrics");
}

#[tokio::test]
async fn valid_looking_pages_over_the_parser_caps_are_agent_bad_metrics_naming_the_cap() {
    let cases: Vec<(String, &str)> = vec![
        // One label set with more labels than the cap.
        (
            format!(
                "felix_int_dataplane_failures{{{}}} 1\n",
                (0..expo::MAX_LABELS_PER_SAMPLE + 1)
                    .map(|i| format!("l{i}=\"v\""))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            "too_many_labels",
        ),
        // One line longer than the cap (a 100 KB label value).
        (
            format!(
                "felix_int_dataplane_failures{{a=\"{}\"}} 1\n",
                "x".repeat(100_000)
            ),
            "line_too_long",
        ),
        // More samples than the cap, each line short and valid.
        (
            (0..expo::MAX_SAMPLES + 1)
                .map(|i| format!("felix_int_dataplane_failures{{n=\"{i}\"}} 1\n"))
                .collect(),
            "too_many_samples",
        ),
        // More families than the cap (TYPE lines only).
        (
            (0..expo::MAX_FAMILIES + 1)
                .map(|i| format!("# TYPE f{i} gauge\n"))
                .collect(),
            "too_many_families",
        ),
        // More label pairs than the cap, under the sample and per-sample caps.
        (
            (0..expo::MAX_LABEL_PAIRS / 50 + 1)
                .map(|i| {
                    let labels: Vec<String> = (0..50).map(|k| format!("l{k}=\"{i}\"")).collect();
                    format!("felix_int_dataplane_failures{{{}}} 1\n", labels.join(","))
                })
                .collect(),
            "too_many_label_pairs",
        ),
    ];
    for (body, cap) in cases {
        let size = body.len();
        assert!(size < settings().max_body_bytes, "{cap}: {size} bytes");
        let (e, took) = scrape(page(body)).await;
        assert_bad_metrics(&e, took, "parse");
        let ScrapeError::Parse { source, .. } = &e else {
            panic!("{cap}: {e}")
        };
        assert_eq!(source.kind.reason(), cap, "{e}");
        eprintln!("{cap}: {size}-byte page refused in {took:?}: {e}");
    }
}

#[tokio::test]
async fn a_100_mb_page_is_stopped_at_the_body_limit_quickly() {
    let cap = settings().max_body_bytes as u64;
    for announced in [false, true] {
        let total = 100_000_000;
        let sent = Arc::new(AtomicU64::new(0));
        let agent = if announced {
            Agent::Announced {
                total,
                sent: sent.clone(),
            }
        } else {
            Agent::Endless {
                total,
                sent: sent.clone(),
            }
        };
        let (e, took) = scrape(agent).await;
        assert_bad_metrics(&e, took, "too_large");
        assert!(
            matches!(e, ScrapeError::TooLarge { limit, .. } if limit as u64 == cap),
            "{e}"
        );
        // Give the server a moment to notice the close, then count what it got out:
        // the cap plus whatever the kernel buffered on loopback (a few MiB).
        tokio::time::sleep(Duration::from_millis(300)).await;
        let out = sent.load(Ordering::SeqCst);
        eprintln!(
            "100 MB page (Content-Length announced: {announced}): too_large after {took:?}, server wrote {out} bytes (cap {cap})"
        );
        assert!(
            out < cap + (24 << 20),
            "server got {out} bytes out; the prober should stop at {cap} + buffers"
        );
        assert!(out < total / 2, "read most of the 100 MB page: {out}");
    }
}

#[tokio::test]
async fn a_byte_a_second_page_silent_agent_and_slow_head_are_agent_unreachable_at_the_timeout() {
    let timeout = settings().timeout;
    for (name, agent) in [
        ("trickle body", Agent::Trickle),
        ("trickle head", Agent::TrickleHead),
        ("silent", Agent::Silent),
    ] {
        let (e, took) = scrape(agent).await;
        assert_eq!(e.signal(), Signal::AgentUnreachable, "{name}: {e}");
        assert_eq!(e.reason(), "timeout", "{name}: {e}");
        assert!(
            took >= timeout - Duration::from_millis(50) && took <= timeout + TOLERANCE,
            "{name}: took {took:?}, timeout {timeout:?}"
        );
        eprintln!("{name}: timeout after {took:?}");
    }
}

#[tokio::test]
async fn a_non_http_answer_is_agent_unreachable_at_once() {
    // Not an HTTP response at all (e.g. another protocol on the port): nothing the
    // profile could read, counted as unreachable like any other transport failure.
    let (e, took) = scrape(Agent::Raw(Arc::new(noise(10_000, 3)))).await;
    assert_eq!(e.signal(), Signal::AgentUnreachable, "{e}");
    assert_eq!(e.reason(), "http", "{e}");
    assert!(took <= TOLERANCE, "took {took:?}");
    // A response head larger than hyper's client buffer (≈ 400 KB): refused the same way.
    let mut head = b"HTTP/1.1 200 OK\r\nX-Pad: ".to_vec();
    head.extend(std::iter::repeat_n(b'a', 1 << 20));
    let (e, took) = scrape(Agent::Raw(Arc::new(head))).await;
    assert_eq!(e.signal(), Signal::AgentUnreachable, "{e}");
    assert!(took <= settings().timeout + TOLERANCE, "took {took:?}");
}

#[tokio::test]
async fn hostile_agents_on_every_node_end_as_warnings_within_one_scrape_timeout() {
    // Through the watcher and correlation: each node's agent is hostile in its own way;
    // the probe's end scrape (both nodes at once) is bounded by one timeout, and the
    // findings carry the signals.
    let sent = Arc::new(AtomicU64::new(0));
    let agents = [
        ("garbage", page(noise(50_000, 5))),
        (
            "huge",
            Agent::Endless {
                total: 100_000_000,
                sent: sent.clone(),
            },
        ),
        ("slow", Agent::Trickle),
        ("silent", Agent::Silent),
    ];
    let mut idx = AgentIndex::default();
    for (node, agent) in agents {
        idx.apply(target(node, serve(agent).await));
    }
    let w = AgentWatcher::with_index(
        None,
        builtin_profiles(),
        settings(),
        Params::default(),
        Arc::new(RwLock::new(idx)),
    );
    let limit = settings().timeout + TOLERANCE;
    let mut got = Vec::new();
    for (src, dst) in [("garbage", "huge"), ("slow", "silent")] {
        let started = Instant::now();
        let win = w.probe_started(src, dst).await;
        let start_took = started.elapsed();
        let started = Instant::now();
        let f = w.probe_finished(win, ProbeResult::Success).await;
        let end_took = started.elapsed();
        assert!(
            start_took <= limit && end_took <= limit,
            "{src}/{dst}: start scrape {start_took:?}, end scrape {end_took:?}, limit {limit:?}"
        );
        assert!(f.suspects.is_empty(), "{:?}", f.suspects);
        got.extend(f.warnings);
    }
    let signal = |node: &str| {
        got.iter()
            .filter(|s| s.node == node)
            .map(|s| {
                (
                    s.signal,
                    s.evidence["reason"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        signal("garbage"),
        [(Signal::AgentBadMetrics, "not_utf8".to_owned())]
    );
    assert_eq!(
        signal("huge"),
        [(Signal::AgentBadMetrics, "too_large".to_owned())]
    );
    assert_eq!(
        signal("slow"),
        [(Signal::AgentUnreachable, "timeout".to_owned())]
    );
    assert_eq!(
        signal("silent"),
        [(Signal::AgentUnreachable, "timeout".to_owned())]
    );
    let counts = w.scrape_counts();
    let n = |r: &str| {
        counts
            .get(&(CALICO_FELIX.to_owned(), r.to_owned()))
            .copied()
            .unwrap_or(0)
    };
    assert_eq!(
        (n("not_utf8"), n("too_large"), n("timeout")),
        (2, 2, 4),
        "{counts:?}"
    );
}

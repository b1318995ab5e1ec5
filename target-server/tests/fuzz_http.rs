//! Property tests ("fuzzing", proptest) of target-server's HTTP request handling: what
//! [`serve_connection`] (hyper's parser + [`ServerState::respond`]) does with arbitrary
//! bytes, with structured but hostile requests, and with valid requests, over an
//! in-memory pipe (no sockets).
//!
//! Properties: no panic; every connection ends within its deadline; whatever comes back
//! is one well-formed HTTP/1.x response with a status from the known set; valid
//! requests get the routed answer; heads over the caps get 431.
//!
//! Cases per property: `FIRSTPACKET_FUZZ_CASES` (default 256, the smoke run of the
//! default suite; the long run in docs/src/hostile-input.md sets e.g. 200000).

use proptest::prelude::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use target_server::http::{serve_connection, Limits, ServerState, MAX_BODY_BYTES};
use target_server::{Identity, ProcessStart};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Cases per property (`FIRSTPACKET_FUZZ_CASES`, default 256).
fn cases() -> u32 {
    std::env::var("FIRSTPACKET_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        // A failing case is kept beside this file (`fuzz_http.regressions`) and tried
        // first on the next run.
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("regressions"),
        )),
        ..ProptestConfig::default()
    }
}

/// Short deadlines so that a case that waits costs little; sizes as shipped.
fn limits() -> Limits {
    Limits {
        header_read_timeout: Duration::from_millis(500),
        connection_deadline: Duration::from_secs(1),
        ..Limits::default()
    }
}

const POD: &str = "fuzz-target";

fn state() -> Arc<ServerState> {
    ServerState::new(
        Identity {
            pod: POD.into(),
            namespace: Some("firstpacket".into()),
            ip: Some("10.0.0.7".into()),
            node: Some("node-2".into()),
        },
        ProcessStart::now(),
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Feeds `input` to one connection (then EOF) and reads the answer to EOF. Returns
/// (answer bytes, time until the connection ended). A panic inside the server
/// propagates.
fn run(
    rt: &tokio::runtime::Runtime,
    state: &Arc<ServerState>,
    input: &[u8],
) -> (Vec<u8>, Duration) {
    let limits = limits();
    rt.block_on(async {
        let (client, server) = tokio::io::duplex(16 * 1024);
        let started = Instant::now();
        let st = Arc::clone(state);
        let srv = tokio::spawn(async move { serve_connection(server, st, &limits).await });
        let (mut rd, mut wr) = tokio::io::split(client);
        let input = input.to_vec();
        let writer = async move {
            // The server may close before reading everything: a write error is expected.
            let _ = wr.write_all(&input).await;
            let _ = wr.shutdown().await;
        };
        let reader = async move {
            let mut out = Vec::new();
            let _ = rd.read_to_end(&mut out).await;
            out
        };
        let ((), out) = tokio::join!(writer, reader);
        if let Err(e) = srv.await {
            if e.is_panic() {
                std::panic::resume_unwind(e.into_panic());
            }
        }
        (out, started.elapsed())
    })
}

/// One parsed answer: (status, headers lower-cased, body).
struct Answer {
    /// The status line says `HTTP/1.0` (the answer to a 1.0 request: closing is that
    /// version's default, so no `Connection: close` is needed).
    http10: bool,
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// Statuses the server may give: routed (200, 404, 413, 503) or hyper's own for a bad
/// request (400), a too-long URI (414), a too-large head (431).
const KNOWN_STATUSES: [u16; 7] = [200, 400, 404, 413, 414, 431, 503];

/// Checks that `out` is empty or exactly one well-formed response whose body length
/// matches its `Content-Length`; returns it.
fn parse_answer(out: &[u8]) -> Result<Option<Answer>, String> {
    if out.is_empty() {
        return Ok(None);
    }
    let end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| {
            format!(
                "answer without a complete head: {:?}",
                String::from_utf8_lossy(out)
            )
        })?;
    let head = std::str::from_utf8(&out[..end]).map_err(|e| format!("head not UTF-8: {e}"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let http10 = status_line.starts_with("HTTP/1.0 ");
    let rest = status_line
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| status_line.strip_prefix("HTTP/1.0 "))
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let status: u16 = rest
        .get(..3)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    if !KNOWN_STATUSES.contains(&status) {
        return Err(format!("unexpected status {status}"));
    }
    let mut headers = Vec::new();
    for l in lines {
        let (k, v) = l
            .split_once(':')
            .ok_or_else(|| format!("bad header line {l:?}"))?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
    }
    let body = out[end + 4..].to_vec();
    if let Some((_, cl)) = headers.iter().find(|(k, _)| k == "content-length") {
        let n: usize = cl
            .parse()
            .map_err(|_| format!("bad content-length {cl:?}"))?;
        // A HEAD answer announces the length without the body.
        if n != body.len() && !body.is_empty() {
            return Err(format!(
                "content-length {n} but {} body bytes (a second response?)",
                body.len()
            ));
        }
    }
    Ok(Some(Answer {
        http10,
        status,
        headers,
        body,
    }))
}

/// What every case must satisfy, whatever the input.
fn check_common(out: &[u8], took: Duration) -> Result<Option<Answer>, TestCaseError> {
    let deadline = limits().connection_deadline + Duration::from_millis(1500);
    prop_assert!(
        took <= deadline,
        "connection lasted {took:?}, deadline {deadline:?}"
    );
    parse_answer(out).map_err(TestCaseError::fail)
}

fn token() -> impl Strategy<Value = String> {
    "[A-Za-z0-9!#$%&'*+.^_`|~-]{1,12}"
}

/// A hostile request line + headers + body, as bytes: real and bogus methods, paths
/// with traversal, shell and format strings, absolute-form and `*`, odd versions, header
/// names and values with control bytes, conflicting lengths, chunked, bare LF, and an
/// optional pipelined second request.
fn hostile_request() -> impl Strategy<Value = Vec<u8>> {
    let method = prop_oneof![
        Just("GET".to_owned()),
        Just("HEAD".to_owned()),
        Just("POST".to_owned()),
        Just("CONNECT".to_owned()),
        Just("OPTIONS".to_owned()),
        Just("PRI".to_owned()),
        token(),
        "[ -~]{0,8}",
    ];
    let path = prop_oneof![
        Just("/".to_owned()),
        Just("/readyz".to_owned()),
        Just("/healthz".to_owned()),
        Just("/hostname".to_owned()),
        Just("*".to_owned()),
        Just("/../../../etc/passwd".to_owned()),
        Just("/;$(reboot)`id`|sh".to_owned()),
        Just("/%n%s%x%00".to_owned()),
        Just("http://evil.example:8080/".to_owned()),
        "/[ -~]{0,64}",
        "[^\r\n]{0,32}",
        (1usize..20_000).prop_map(|n| format!("/{}", "a".repeat(n))),
    ];
    let version = prop_oneof![
        4 => Just("HTTP/1.1"),
        1 => Just("HTTP/1.0"),
        1 => Just("HTTP/2.0"),
        1 => Just("HTTP/0.9"),
        1 => Just("HTTP/1.1x"),
        1 => Just(""),
    ];
    let header = prop_oneof![
        (token(), "[ -~]{0,40}").prop_map(|(k, v)| format!("{k}: {v}")),
        "[\\x00-\\xff]{0,40}",
        "[0-9]{0,30}".prop_map(|n| format!("Content-Length: {n}")),
        Just("Content-Length: -1".to_owned()),
        Just("Content-Length: 18446744073709551616".to_owned()),
        Just("Transfer-Encoding: chunked".to_owned()),
        Just("Transfer-Encoding: gzip, chunked".to_owned()),
        Just("Connection: keep-alive, Upgrade".to_owned()),
        Just("Upgrade: h2c".to_owned()),
        Just("Expect: 100-continue".to_owned()),
        "kube-probe/[0-9.]{0,8}".prop_map(|v| format!("User-Agent: {v}")),
        (1usize..12_000).prop_map(|n| format!("X-Big: {}", "v".repeat(n))),
    ];
    let eol = prop_oneof![4 => Just("\r\n"), 1 => Just("\n"), 1 => Just("\r")];
    (
        method,
        path,
        version,
        prop::collection::vec(header, 0..80),
        eol,
        prop::collection::vec(any::<u8>(), 0..1500),
        prop::option::of(Just(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n".to_vec())),
    )
        .prop_map(|(m, p, v, hs, eol, body, second)| {
            let mut out = format!("{m} {p} {v}{eol}").into_bytes();
            for h in hs {
                out.extend_from_slice(h.as_bytes());
                out.extend_from_slice(eol.as_bytes());
            }
            out.extend_from_slice(eol.as_bytes());
            out.extend_from_slice(&body);
            if let Some(s) = second {
                out.extend_from_slice(&s);
            }
            out
        })
}

/// A valid request and what it must get: (bytes, expected status, expected body for
/// GET, whether the head is over the size or count caps).
#[derive(Debug, Clone)]
struct Valid {
    bytes: Vec<u8>,
    method: &'static str,
    path: String,
    over_cap: bool,
}

fn valid_request() -> impl Strategy<Value = Valid> {
    let path = prop_oneof![
        Just("/".to_owned()),
        Just("/readyz".to_owned()),
        Just("/healthz".to_owned()),
        Just("/hostname".to_owned()),
        "/[A-Za-z0-9._~-]{0,40}",
    ];
    let method = prop_oneof![Just("GET"), Just("HEAD"), Just("POST")];
    let header = ("X-[A-Za-z0-9-]{1,20}", "[!-~]([ -~]{0,60}[!-~])?")
        .prop_map(|(k, v)| format!("{k}: {v}\r\n"));
    (
        method,
        path,
        prop::collection::vec(header, 0..90),
        prop::option::of("kube-probe/1\\.[0-9]{1,2}"),
        0usize..(MAX_BODY_BYTES as usize + 1),
        prop::option::of(6_000usize..10_000),
    )
        .prop_map(|(method, path, headers, ua, body_len, pad)| {
            let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 10.0.0.7:8080\r\n");
            let mut count = 1;
            if let Some(ua) = ua {
                head.push_str(&format!("User-Agent: {ua}\r\n"));
                count += 1;
            }
            for h in &headers {
                head.push_str(h);
            }
            count += headers.len();
            if let Some(n) = pad {
                head.push_str(&format!("X-Pad: {}\r\n", "p".repeat(n)));
                count += 1;
            }
            if body_len > 0 {
                head.push_str(&format!("Content-Length: {body_len}\r\n"));
                count += 1;
            }
            head.push_str("\r\n");
            let limits = limits();
            let over_cap = head.len() > limits.max_head_bytes || count > limits.max_headers;
            let mut bytes = head.into_bytes();
            bytes.extend(std::iter::repeat_n(b'b', body_len));
            Valid {
                bytes,
                method,
                path,
                over_cap,
            }
        })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes_get_a_well_formed_answer_or_none_within_the_deadline(
        input in prop::collection::vec(any::<u8>(), 0..20_000)
    ) {
        let rt = runtime();
        let st = state();
        let (out, took) = run(&rt, &st, &input);
        check_common(&out, took)?;
        // Nothing a request says is remembered except the kubelet's first /readyz.
        prop_assert!(st.is_ready());
    }

    #[test]
    fn hostile_requests_get_a_well_formed_answer_or_none_within_the_deadline(
        input in hostile_request()
    ) {
        let rt = runtime();
        let st = state();
        let (out, took) = run(&rt, &st, &input);
        if let Some(a) = check_common(&out, took)? {
            // Only the four routes answer 200, and `/` only with the identity.
            if a.status == 200 && a.body.starts_with(b"{") {
                let id: Identity = serde_json::from_slice(&a.body)
                    .map_err(|e| TestCaseError::fail(format!("200 body: {e}")))?;
                prop_assert_eq!(id.pod, POD);
            }
            prop_assert!(
                a.headers.iter().any(|(k, v)| k == "connection" && v == "close")
                    || a.status != 200
                    || a.http10,
                "an HTTP/1.1 200 without Connection: close"
            );
        }
    }

    #[test]
    fn valid_requests_are_routed_and_heads_over_the_caps_get_431(v in valid_request()) {
        let rt = runtime();
        let st = state();
        let (out, took) = run(&rt, &st, &v.bytes);
        let a = check_common(&out, took)?
            .ok_or_else(|| TestCaseError::fail("no answer to a valid request"))?;
        if v.over_cap {
            prop_assert_eq!(a.status, 431);
            return Ok(());
        }
        let (status, body): (u16, &[u8]) = match v.path.as_str() {
            "/readyz" | "/healthz" => (200, b"ok"),
            "/hostname" => (200, POD.as_bytes()),
            "/" => (200, b""),
            _ => (404, b"not found"),
        };
        prop_assert_eq!(a.status, status, "{} {}", v.method, v.path);
        if v.method == "HEAD" {
            prop_assert!(a.body.is_empty());
        } else if v.path == "/" {
            let id: Identity = serde_json::from_slice(&a.body)
                .map_err(|e| TestCaseError::fail(format!("identity: {e}")))?;
            prop_assert_eq!(id, st.identity().clone());
        } else {
            prop_assert_eq!(&a.body[..], body);
        }
    }

    #[test]
    fn respond_routes_any_path_and_headers_without_panicking(
        path in "/[!-~]{0,200}",
        headers in prop::collection::vec(("[a-z][a-z0-9-]{0,20}", "[ -~]{0,80}"), 0..20),
    ) {
        let st = state();
        let mut b = hyper::Request::get("/");
        if let Ok(uri) = path.parse::<hyper::Uri>() {
            b = hyper::Request::get(uri);
        }
        for (k, v) in &headers {
            b = b.header(k.as_str(), v.as_str());
        }
        if let Ok(req) = b.body(()) {
            let body_headers = req.headers().contains_key("content-length")
                || req.headers().contains_key("transfer-encoding");
            let status = st.respond(&req).status().as_u16();
            let expected = match req.uri().path() {
                "/" | "/readyz" | "/healthz" | "/hostname" => 200,
                _ => 404,
            };
            if body_headers {
                prop_assert!(status == expected || status == 413, "{status}");
            } else {
                prop_assert_eq!(status, expected);
            }
        }
    }
}

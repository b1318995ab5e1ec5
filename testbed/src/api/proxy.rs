//! The pod proxy subresource, `/api/v1/namespaces/NS/pods/ID/proxy[/PATH]`, as
//! kube-apiserver serves it (k8s.io/kubernetes `pkg/registry/core/pod/strategy.go`
//! `ResourceLocation`, `pkg/registry/core/pod/rest/subresources.go` `ProxyREST`,
//! k8s.io/apimachinery `pkg/util/proxy/transport.go`): one plain HTTP/1.1 exchange with
//! the pod's IP, the answer's status, `Content-Type` and body passed back.
//!
//! Who connects: a [`ProxySource`] registered on the store (the daemon's, which dials
//! from the testbed's host network namespace), else [`DirectProxy`], which dials from
//! wherever the API server runs (in-process servers whose pod IPs are local addresses).

use super::{ApiError, ProxyFuture, ProxyRequest, ProxyResponse, ProxySource};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// How long [`forward`] waits for the TCP connection to the pod.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long [`forward`] waits for the pod's whole answer (status, headers and body)
/// once connected: kube-apiserver's default `--request-timeout` (the real proxy, a
/// long-running request, has no bound of its own).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// Largest answer body [`forward`] passes back (bytes); a larger one is a 503.
pub const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// Request headers not passed to the pod: hop-by-hop headers (RFC 9110 §7.6.1, as Go's
/// `httputil.ReverseProxy` drops them), `Host` and `Content-Length` (set for the new
/// request), `Authorization` (kube-apiserver's authentication filter removes it) and
/// `Accept-Encoding` (the answer's `Content-Encoding` is not passed back, so the pod must
/// not compress).
const NOT_FORWARDED: [&str; 12] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "authorization",
];

/// `headers` with `client` appended to `X-Forwarded-For` (`A, B, client`, or just
/// `client` when there was none), as Go's `httputil.ReverseProxy` — kube-apiserver's pod
/// proxy — does; unchanged when the client's address is unknown.
pub fn with_forwarded_for(
    mut headers: Vec<(String, String)>,
    client: Option<std::net::IpAddr>,
) -> Vec<(String, String)> {
    let Some(client) = client else {
        return headers;
    };
    let prior: Vec<String> = headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("x-forwarded-for"))
        .map(|(_, v)| v.clone())
        .collect();
    headers.retain(|(k, _)| !k.eq_ignore_ascii_case("x-forwarded-for"));
    let value = prior
        .into_iter()
        .chain(std::iter::once(client.to_string()))
        .collect::<Vec<_>>()
        .join(", ");
    headers.push(("X-Forwarded-For".into(), value));
    headers
}

/// Whether a client request header goes on to the pod (see [`NOT_FORWARDED`]).
pub(crate) fn forwards_header(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n != "accept-encoding" && !NOT_FORWARDED.contains(&n.as_str())
}

/// The ID of `pods/ID/proxy` split as `utilnet.SplitSchemeNamePort` does: `NAME`,
/// `NAME:PORT` or `SCHEME:NAME:PORT` (scheme `http`, `https` or empty; an empty port
/// means the default). Returns (scheme, name, port). Errors: 400 `invalid pod request
/// "ID"` for any other shape.
pub fn split_id(id: &str) -> Result<(&str, &str, Option<&str>), ApiError> {
    let parts: Vec<&str> = id.split(':').collect();
    let (scheme, name, port) = match parts.as_slice() {
        [name] => ("", *name, None),
        [name, port] => ("", *name, Some(*port)),
        [scheme, name, port] => (*scheme, *name, Some(*port)),
        _ => ("", "", None),
    };
    if name.is_empty() || !matches!(scheme, "" | "http" | "https") {
        return Err(ApiError::bad_request(format!("invalid pod request {id:?}")));
    }
    Ok((scheme, name, port.filter(|p| !p.is_empty())))
}

/// The first `containerPort` of the pod's containers, in order (`ResourceLocation`).
fn first_container_port(pod: &Value) -> Option<u16> {
    pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["ports"].as_array().into_iter().flatten())
        .find_map(|p| p["containerPort"].as_u64())
        .and_then(|p| u16::try_from(p).ok())
}

/// Where `pods/NAME[:PORT]/proxy` goes: the pod's IP (`status.podIPs[0].ip`, else
/// `status.podIP`) and `port`, else the first `containerPort`, else 80.
///
/// Errors, as kube-apiserver words them:
/// - 400 BadRequest `address not allowed`: no IP yet, or one that is unspecified,
///   multicast, broadcast or link-local (`ResourceLocation` accepts global unicast
///   only; loopback is accepted here, unlike there, because the testbed's in-process
///   tiers give pods loopback addresses).
/// - 503 ServiceUnavailable `error trying to reach service: dial tcp: lookup
///   tcp/NAME: unknown port` for a port that is not a number: kube-apiserver hands a
///   port name to Go's dialer, which knows only `/etc/services` names; container port
///   names are not looked up, here or there.
pub fn pod_address(pod: &Value, port: Option<&str>) -> Result<SocketAddr, ApiError> {
    let ip = pod["status"]["podIPs"][0]["ip"]
        .as_str()
        .or_else(|| pod["status"]["podIP"].as_str())
        .and_then(|s| s.parse::<IpAddr>().ok())
        .filter(|ip| match ip {
            IpAddr::V4(a) => {
                !(a.is_unspecified() || a.is_multicast() || a.is_broadcast() || a.is_link_local())
            }
            IpAddr::V6(a) => !(a.is_unspecified() || a.is_multicast() || a.is_unicast_link_local()),
        })
        .ok_or_else(|| ApiError::bad_request("address not allowed"))?;
    let port =
        match port {
            Some(p) => p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
                unreachable_error(format!("dial tcp: lookup tcp/{p}: unknown port"))
            })?,
            None => first_container_port(pod).unwrap_or(80),
        };
    Ok(SocketAddr::new(ip, port))
}

/// 503 ServiceUnavailable `error trying to reach service: <why>` (k8s.io/apimachinery
/// `pkg/util/proxy/transport.go`, on any failure to get an answer from the pod).
fn unreachable_error(why: String) -> ApiError {
    ApiError::new(
        503,
        "ServiceUnavailable",
        format!("error trying to reach service: {why}"),
    )
}

/// An I/O error in the words of Go's `net` package (`connect: connection refused`),
/// which clients match on.
fn go_words(e: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused => "connect: connection refused".into(),
        K::HostUnreachable => "connect: no route to host".into(),
        K::NetworkUnreachable => "connect: network is unreachable".into(),
        K::TimedOut => "i/o timeout".into(),
        K::AddrNotAvailable => "connect: cannot assign requested address".into(),
        _ => format!("connect: {e}"),
    }
}

/// Sends `req` to `addr` over a new plain HTTP/1.1 connection (hyper's client) and
/// reads the whole answer: the method, body, forwarded headers (`req.headers`) and
/// `PATH?QUERY` of `req`; `Host: addr`. Returns the status, `Content-Type` and body.
///
/// Bounds: [`CONNECT_TIMEOUT`] to connect, then [`ANSWER_TIMEOUT`] for the answer,
/// at most [`MAX_ANSWER_BYTES`] of body. Errors: 503 ServiceUnavailable `error trying to
/// reach service: …` for each failure (`dial tcp ADDR: connect: connection refused`,
/// `dial tcp ADDR: i/o timeout`, a broken or late answer, an oversized body), 400 for a
/// method or path that is not valid HTTP.
///
/// The connection is made from the runtime that polls the future: run it where the pod
/// IPs are routable.
pub async fn forward(addr: SocketAddr, req: ProxyRequest) -> Result<ProxyResponse, ApiError> {
    let method = hyper::Method::from_bytes(req.method.as_bytes())
        .map_err(|_| ApiError::bad_request(format!("invalid method {:?}", req.method)))?;
    let target = match req.query.as_deref() {
        Some(q) if !q.is_empty() => format!("{}?{q}", req.path),
        _ => req.path.clone(),
    };
    let mut builder = hyper::Request::builder()
        .method(method)
        .uri(target.as_str())
        .header(hyper::header::HOST, addr.to_string());
    for (k, v) in req.headers.iter().filter(|(k, _)| forwards_header(k)) {
        builder = builder.header(k.as_str(), v.as_str());
    }
    let request = builder
        .body(Full::new(Bytes::from(req.body)))
        .map_err(|e| ApiError::bad_request(format!("invalid proxy request {target:?}: {e}")))?;

    let dial = |why: String| unreachable_error(format!("dial tcp {addr}: {why}"));
    let stream =
        match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(dial(go_words(&e))),
            Err(_) => return Err(dial("i/o timeout".into())),
        };
    let _ = stream.set_nodelay(true);
    let exchange = async move {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unreachable_error(format!("{addr}: {e}")))?;
        // The connection task ends when the answer is read and `sender` is dropped.
        tokio::spawn(conn);
        let answer = sender
            .send_request(request)
            .await
            .map_err(|e| unreachable_error(format!("{addr}: {e}")))?;
        let status = answer.status().as_u16();
        let content_type = answer
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = Limited::new(answer.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| {
                unreachable_error(format!(
                    "reading the answer of {addr} (at most {MAX_ANSWER_BYTES} bytes): {e}"
                ))
            })?
            .to_bytes()
            .to_vec();
        Ok(ProxyResponse {
            status,
            content_type,
            body,
        })
    };
    tokio::time::timeout(ANSWER_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| {
            Err(unreachable_error(format!(
                "{addr}: no complete answer within {ANSWER_TIMEOUT:?}"
            )))
        })
}

/// The [`ProxySource`] the API server uses when none is registered: [`forward`] to
/// `req.port` of the pod's IP ([`pod_address`]), dialled from the runtime that polls
/// the returned future.
#[derive(Clone, Copy, Debug, Default)]
pub struct DirectProxy;

impl ProxySource for DirectProxy {
    fn proxy(&self, pod: &Value, req: ProxyRequest) -> ProxyFuture {
        let addr = pod_address(pod, req.port.as_deref());
        Box::pin(async move { forward(addr?, req).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ids_split_into_scheme_name_and_port() {
        assert_eq!(split_id("web").unwrap(), ("", "web", None));
        assert_eq!(split_id("web:8080").unwrap(), ("", "web", Some("8080")));
        assert_eq!(split_id("web:").unwrap(), ("", "web", None));
        assert_eq!(
            split_id("http:web:8080").unwrap(),
            ("http", "web", Some("8080"))
        );
        for bad in ["", ":80", "ftp:web:21", "a:b:c:d"] {
            let e = split_id(bad).unwrap_err();
            assert_eq!(e.code, 400, "{bad}");
            assert_eq!(e.message, format!("invalid pod request {bad:?}"));
        }
    }

    #[test]
    fn the_address_is_the_pod_ip_and_the_given_first_or_default_port() {
        let pod = |status: Value, ports: Value| {
            json!({"spec": {"containers": [{"name": "a"}, {"name": "b", "ports": ports}]},
                   "status": status})
        };
        let p = pod(
            json!({"podIP": "10.1.2.3"}),
            json!([{"containerPort": 9090}, {"containerPort": 9091}]),
        );
        assert_eq!(
            pod_address(&p, None).unwrap(),
            "10.1.2.3:9090".parse().unwrap()
        );
        assert_eq!(
            pod_address(&p, Some("81")).unwrap(),
            "10.1.2.3:81".parse().unwrap()
        );
        let p = pod(
            json!({"podIP": "10.1.2.3", "podIPs": [{"ip": "fd00::3"}]}),
            json!([]),
        );
        assert_eq!(
            pod_address(&p, None).unwrap(),
            "[fd00::3]:80".parse().unwrap()
        );
        let lo = pod(json!({"podIP": "127.0.0.7"}), json!([]));
        assert_eq!(
            pod_address(&lo, None).unwrap(),
            "127.0.0.7:80".parse().unwrap()
        );
        for status in [
            json!({}),
            json!({"podIP": ""}),
            json!({"podIP": "0.0.0.0"}),
            json!({"podIP": "169.254.1.1"}),
        ] {
            let e = pod_address(&pod(status.clone(), json!([])), None).unwrap_err();
            assert_eq!(
                (e.code, e.reason.as_str(), e.message.as_str()),
                (400, "BadRequest", "address not allowed"),
                "{status}"
            );
        }
        let e = pod_address(&p, Some("metrics")).unwrap_err();
        assert_eq!((e.code, e.reason.as_str()), (503, "ServiceUnavailable"));
        assert_eq!(
            e.message,
            "error trying to reach service: dial tcp: lookup tcp/metrics: unknown port"
        );
    }

    #[test]
    fn hop_by_hop_auth_and_encoding_headers_stay_behind() {
        for h in [
            "Connection",
            "Host",
            "Authorization",
            "Accept-Encoding",
            "Transfer-Encoding",
            "Content-Length",
        ] {
            assert!(!forwards_header(h), "{h}");
        }
        for h in ["Accept", "Content-Type", "User-Agent", "X-Probe-Id"] {
            assert!(forwards_header(h), "{h}");
        }
    }
}

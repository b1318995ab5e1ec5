//! Scraping node agents' `/metrics` (docs/design.md §3) and the [`AgentWatcher`] that the
//! gate / continuous mode use: discovery + scrape policy + per-probe correlation.
//!
//! # Paths
//! - **direct**: `GET http://<status.hostIP>:<port><path>` (agents run with
//!   hostNetwork), plain HTTP/1.1 over hyper — no TLS stack, so no second rustls crypto
//!   provider (rustls panics when two are linked).
//! - **proxy**: `GET /api/v1/namespaces/NS/pods/NAME:PORT/proxy<path>` through the API
//!   server with the kube [`Client`] (for a prober outside the pod network).
//!   One attempt per scrape: the proxy client has no retry layer ([`no_retry_client`];
//!   kube's default policy retries 429/503/504 with backoff, which turned an agent's
//!   instant "connection refused" into a 2 s timeout and dozens of requests), and the
//!   API server's Status comes back as [`ScrapeError::Status`].
//! - **auto**: direct first; on any direct failure except a page-content problem (body
//!   too large, not UTF-8, not exposition text, none of the profile's metrics — the
//!   agent answered, the proxy would fetch the same page), the proxy; and from then on
//!   that (node, profile) uses only the proxy for the rest of the run, whether the proxy
//!   worked or not (remembered per node *and profile*: a kube-proxy bound to 127.0.0.1
//!   refuses direct connections on a node whose Felix answers them). Without a
//!   Kubernetes client, auto is direct only.
//!
//! Every finding of a scraped agent names the path used in its evidence
//! (`scrape_path: direct|proxy`).
//!
//! Every request sends `Accept: text/plain;version=0.0.4` (docs/design.md §3), runs under one
//! timeout (connect + headers + body), reads at most the body limit, and waits for a
//! permit of one shared semaphore (the concurrency limit).
//!
//! # Scrape policy (cost independent of idle nodes)
//! - at a probe's start and end, every agent on its source and target nodes;
//! - **hot** nodes (a probe in flight, or one ended within
//!   [`ScrapeSettings::recent`]) again every [`ScrapeSettings::hot_interval`];
//! - a **sweep**: every [`ScrapeSettings::sweep_tick`], the
//!   [`ScrapeSettings::sweep_batch`] least recently scraped other nodes — a fixed
//!   number of scrapes per tick whatever the node count.

use super::correlate::{
    correlate, one_line, split_findings, ClusterView, History, Observation, Params, ProbeWindow,
    ScrapeFailure, MESSAGE_MAX_CHARS,
};
use super::discover::{watch_agents, AgentIndex, AgentTarget, SharedIndex};
use super::expo::{self, ParseError};
use super::profiles::{AgentReading, Profile};
use crate::podspec::host_port;
use firstpacket_report::{ProbeResult, Signal, Suspect};
use http_body_util::BodyExt;
use hyper::body::Bytes;
use kube::Client;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// The `Accept` header of every scrape (text format 0.0.4; docs/design.md §3).
pub const ACCEPT: &str = "text/plain;version=0.0.4";

/// How agents are reached (`--agent-scrape`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScrapeMode {
    /// `http://hostIP:port/metrics`.
    Direct,
    /// API server pod proxy.
    Proxy,
    /// Direct, falling back to the proxy on any direct failure but a page-content
    /// problem (remembered per node and profile).
    Auto,
}

impl From<crate::config::AgentScrape> for ScrapeMode {
    fn from(v: crate::config::AgentScrape) -> ScrapeMode {
        match v {
            crate::config::AgentScrape::Direct => ScrapeMode::Direct,
            crate::config::AgentScrape::Proxy => ScrapeMode::Proxy,
            crate::config::AgentScrape::Auto => ScrapeMode::Auto,
        }
    }
}

/// Scrape limits and policy. Defaults in [`ScrapeSettings::default`].
#[derive(Debug, Clone, PartialEq)]
pub struct ScrapeSettings {
    /// Path choice.
    pub mode: ScrapeMode,
    /// Whole-request timeout (default 2 s: a healthy agent answers in milliseconds; the
    /// scrape sits on the probe's critical path at start and end).
    pub timeout: Duration,
    /// Body limit, bytes (default 8 MiB: the real Felix 3.20 page is 17 KB; Felix pages
    /// grow with endpoints and IP sets but stay far below this).
    pub max_body_bytes: usize,
    /// Concurrent scrapes at most (default 8).
    pub concurrency: usize,
    /// Re-scrape interval of hot nodes (default 5 s).
    pub hot_interval: Duration,
    /// How long a node stays hot after its last probe ended (default 60 s).
    pub recent: Duration,
    /// Sweep period (default 10 s).
    pub sweep_tick: Duration,
    /// Nodes per sweep (default 2; 0 turns the sweep off).
    pub sweep_batch: usize,
    /// Observations kept per (node, profile) (default 32).
    pub ring: usize,
    /// Nodes the start-up scrape ([`AgentWatcher::prime`]) covers at most (default 16):
    /// the reference sample the first probes are compared with (docs/design.md §3,
    /// "the healthiest half of the cluster"), so start-up costs the same at 10 nodes
    /// and at 1 000. The sweep and the probes' own nodes add to it as the run goes on.
    pub reference_sample: usize,
    /// Auto mode: once the direct path failed (for a reason other than the page's
    /// content) on this many distinct nodes for a profile, and never worked for it,
    /// every node of that profile goes through the proxy (default 3; 0 turns it off).
    /// A prober outside the pod network otherwise pays one timeout per node before
    /// each node's first proxy scrape.
    pub profile_proxy_after: usize,
}

impl Default for ScrapeSettings {
    fn default() -> ScrapeSettings {
        ScrapeSettings {
            mode: ScrapeMode::Auto,
            timeout: Duration::from_secs(2),
            max_body_bytes: 8 << 20,
            concurrency: 8,
            hot_interval: Duration::from_secs(5),
            recent: Duration::from_secs(60),
            sweep_tick: Duration::from_secs(10),
            sweep_batch: 2,
            ring: super::correlate::DEFAULT_RING,
            reference_sample: 16,
            profile_proxy_after: 3,
        }
    }
}

/// Why a scrape gave no reading. [`ScrapeError::signal`] maps it to
/// `agent_unreachable` or `agent_bad_metrics`; [`ScrapeError::reason`] to a short label.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// The agent pod has no `status.hostIP` or no port resolved.
    #[error("agent pod {pod}: no address ({what})")]
    NoAddress {
        /// `namespace/name`.
        pod: String,
        /// `no status.hostIP`, or `no metrics port: ` and every port rule tried (e.g.
        /// `no container port named "metrics", no env X with a port number`).
        what: String,
    },
    /// TCP connect failed (refused, unreachable) or timed out.
    #[error("connect {url}: {message}")]
    Connect {
        /// The URL.
        url: String,
        /// The error text.
        message: String,
        /// The connection was refused (nothing listens on that address: metrics off,
        /// or bound to another address such as 127.0.0.1).
        refused: bool,
    },
    /// No complete answer within the timeout.
    #[error("{url}: no complete answer within {seconds}s")]
    Timeout {
        /// The URL.
        url: String,
        /// The timeout, seconds.
        seconds: f64,
    },
    /// HTTP failure after connecting (protocol error, connection closed).
    #[error("{url}: {message}")]
    Http {
        /// The URL.
        url: String,
        /// The error text.
        message: String,
    },
    /// A non-200 answer (for the proxy: the API server's Status, e.g. 503 "connection
    /// refused" when nothing listens on the pod's port, 403 without `get` on
    /// `pods/proxy`).
    #[error("{url}: HTTP {status}: {message}")]
    Status {
        /// The URL.
        url: String,
        /// HTTP status code.
        status: u16,
        /// Status message or body start, one line, bounded ([`one_line`]).
        message: String,
        /// The answer came from the API server's pod proxy.
        proxy: bool,
    },
    /// The body exceeded the limit.
    #[error("{url}: page larger than {limit} bytes")]
    TooLarge {
        /// The URL.
        url: String,
        /// The limit, bytes.
        limit: usize,
    },
    /// The body is not UTF-8.
    #[error("{url}: page is not UTF-8")]
    NotUtf8 {
        /// The URL.
        url: String,
    },
    /// The body is not exposition text.
    #[error("{url}: {source}")]
    Parse {
        /// The URL.
        url: String,
        /// Where and what.
        #[source]
        source: ParseError,
    },
    /// A readable page without any of the profile's signal metrics.
    #[error("{url}: none of the {profile} profile's metrics is on the page")]
    NoSignal {
        /// The URL.
        url: String,
        /// Profile name.
        profile: String,
    },
    /// Proxy mode without a Kubernetes client.
    #[error("proxy scrape needs a Kubernetes client")]
    NoClient,
}

impl ScrapeError {
    /// The correlation signal: page problems are `agent_bad_metrics`, everything else
    /// `agent_unreachable`.
    pub fn signal(&self) -> Signal {
        match self {
            ScrapeError::TooLarge { .. }
            | ScrapeError::NotUtf8 { .. }
            | ScrapeError::Parse { .. }
            | ScrapeError::NoSignal { .. } => Signal::AgentBadMetrics,
            _ => Signal::AgentUnreachable,
        }
    }

    /// Whether the agent's address refused the connection, directly or as relayed by
    /// the API server's pod proxy (503 whose message says `connection refused`, any
    /// case: kube-apiserver relays Go's `connect: connection refused`, other servers
    /// the OS text `Connection refused (os error 111)`).
    pub fn refused(&self) -> bool {
        match self {
            ScrapeError::Connect { refused, .. } => *refused,
            ScrapeError::Status {
                status: 503,
                message,
                ..
            } => message.to_ascii_lowercase().contains("connection refused"),
            _ => false,
        }
    }

    /// Short static reason (metric label `result` of `firstpacket_agent_scrapes_total`):
    /// `refused` when the agent refused the connection ([`ScrapeError::refused`]),
    /// else one per variant.
    pub fn reason(&self) -> &'static str {
        if self.refused() {
            return "refused";
        }
        match self {
            ScrapeError::NoAddress { .. } => "no_address",
            ScrapeError::Connect { .. } => "connect",
            ScrapeError::Timeout { .. } => "timeout",
            ScrapeError::Http { .. } => "http",
            ScrapeError::Status { .. } => "http_status",
            ScrapeError::TooLarge { .. } => "too_large",
            ScrapeError::NotUtf8 { .. } => "not_utf8",
            ScrapeError::Parse { .. } => "parse",
            ScrapeError::NoSignal { .. } => "no_signal_metrics",
            ScrapeError::NoClient => "no_client",
        }
    }

    /// The likely fix, only where it is the likely cause: the profile's
    /// `unreachable_hint` (how to turn the metrics on) when the agent refused the
    /// connection or its page has none of the profile's metrics; the RBAC needed when
    /// the pod proxy answered 403. `None` otherwise (timeouts, 404, other errors).
    pub fn hint(&self, profile: &Profile) -> Option<String> {
        match self {
            ScrapeError::Status {
                status: 403,
                proxy: true,
                ..
            } => Some(format!(
                "the prober needs `get` on `pods/proxy` in the agents' namespaces ({})",
                profile.namespaces.join(", ")
            )),
            ScrapeError::NoSignal { .. } => profile.unreachable_hint.clone(),
            e if e.refused() => profile.unreachable_hint.clone(),
            _ => None,
        }
    }

    /// As stored in an [`Observation`]: the message is one line of at most
    /// [`MESSAGE_MAX_CHARS`] characters, followed by the [`ScrapeError::hint`] for
    /// `profile` in parentheses when there is one.
    pub fn failure(&self, profile: &Profile) -> ScrapeFailure {
        let mut message = one_line(&self.to_string(), MESSAGE_MAX_CHARS);
        if let Some(h) = self.hint(profile) {
            message = format!("{message} ({})", one_line(&h, MESSAGE_MAX_CHARS));
        }
        ScrapeFailure {
            signal: self.signal(),
            reason: self.reason(),
            message,
        }
    }

    /// A page-content problem: the agent answered, but the page is unusable (too
    /// large, not UTF-8, not exposition text, none of the profile's metrics). The auto
    /// mode does not fall back to the proxy on these.
    pub fn is_page_problem(&self) -> bool {
        matches!(
            self,
            ScrapeError::TooLarge { .. }
                | ScrapeError::NotUtf8 { .. }
                | ScrapeError::Parse { .. }
                | ScrapeError::NoSignal { .. }
        )
    }
}

/// A Kubernetes client for pod-proxy scrapes: `config` with kube's default retry layer
/// off (`Config::default_retry = false`; kube 5 `Config` docs: "Whether to enable
/// default retrying requests on transient failures (429, 503, 504)"). A scrape is one
/// attempt under its own timeout; the API server's answer is the result.
///
/// Errors: as [`Client::try_from`] (TLS or auth setup).
pub fn no_retry_client(config: kube::Config) -> Result<Client, kube::Error> {
    let mut config = config;
    config.default_retry = false;
    Client::try_from(config)
}

/// `GET http://host:port<path>` with [`ACCEPT`], the whole exchange under `timeout`,
/// at most `limit` body bytes. Returns the body as text.
///
/// Bounds against a hostile agent: the body stops at `limit` (`TooLarge` as soon as
/// `limit + 1` bytes arrived, whatever `Content-Length` says); the response head is
/// bounded by hyper's client read buffer (≈ 400 KB, hyper 1.x's default
/// `max_buf_size`) and 100 header lines (hyper's default), past which it is `Http`;
/// a byte-a-second answer ends at `timeout` (`Timeout`). Memory: at most about twice
/// `limit` while the body is collected.
///
/// Errors: [`ScrapeError::Connect`] (connect refused, failed or timed out),
/// [`ScrapeError::Timeout`] (after connecting), `Http`, `Status` (body start as one
/// bounded line), `TooLarge`, `NotUtf8`. In auto mode all but `TooLarge` / `NotUtf8`
/// send the scrape to the proxy.
pub async fn fetch_direct(
    host: &str,
    port: u16,
    path: &str,
    timeout: Duration,
    limit: usize,
) -> Result<String, ScrapeError> {
    let authority = host_port(host, port);
    let url = format!("http://{authority}{path}");
    let deadline = tokio::time::Instant::now() + timeout;
    let stream = match tokio::time::timeout_at(deadline, TcpStream::connect(&authority)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            return Err(ScrapeError::Connect {
                url,
                refused: e.kind() == std::io::ErrorKind::ConnectionRefused,
                message: e.to_string(),
            })
        }
        Err(_) => {
            return Err(ScrapeError::Connect {
                url,
                message: format!("connect timed out after {}s", timeout.as_secs_f64()),
                refused: false,
            })
        }
    };
    let exchange = async {
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| ScrapeError::Http {
                url: url.clone(),
                message: e.to_string(),
            })?;
        let conn = tokio::spawn(conn);
        let req = hyper::Request::get(path)
            .header(hyper::header::HOST, authority.as_str())
            .header(hyper::header::ACCEPT, ACCEPT)
            .header(hyper::header::USER_AGENT, "firstpacket-prober")
            .body(http_body_util::Empty::<Bytes>::new())
            .map_err(|e| ScrapeError::Http {
                url: url.clone(),
                message: e.to_string(),
            })?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| ScrapeError::Http {
                url: url.clone(),
                message: e.to_string(),
            })?;
        let status = resp.status().as_u16();
        let body = http_body_util::Limited::new(resp.into_body(), limit)
            .collect()
            .await
            .map_err(|e| {
                if e.downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some()
                {
                    ScrapeError::TooLarge {
                        url: url.clone(),
                        limit,
                    }
                } else {
                    ScrapeError::Http {
                        url: url.clone(),
                        message: e.to_string(),
                    }
                }
            })?
            .to_bytes();
        conn.abort();
        if status != 200 {
            return Err(ScrapeError::Status {
                url: url.clone(),
                status,
                message: one_line(
                    &String::from_utf8_lossy(&body[..body.len().min(4 * MESSAGE_MAX_CHARS)]),
                    MESSAGE_MAX_CHARS,
                ),
                proxy: false,
            });
        }
        // `Vec::from(Bytes)` takes the buffer over without a copy when it is unique.
        String::from_utf8(Vec::from(body)).map_err(|_| ScrapeError::NotUtf8 { url: url.clone() })
    };
    match tokio::time::timeout_at(deadline, exchange).await {
        Ok(r) => r,
        Err(_) => Err(ScrapeError::Timeout {
            url,
            seconds: timeout.as_secs_f64(),
        }),
    }
}

/// `GET /api/v1/namespaces/NS/pods/NAME:PORT/proxy<path>` through the API server, under
/// `timeout`, at most `limit` bytes. Errors: `Status` (the API server's Status, e.g. 503
/// when it cannot reach the port), `Http` (transport), `Timeout`, `TooLarge`, `NotUtf8`.
///
/// `client` should come from [`no_retry_client`]: with kube's default retry layer a
/// 503 is retried with backoff until `timeout` ends it as `Timeout`.
pub async fn fetch_proxy(
    client: &Client,
    namespace: &str,
    pod: &str,
    port: u16,
    path: &str,
    timeout: Duration,
    limit: usize,
) -> Result<String, ScrapeError> {
    use futures::AsyncReadExt;
    let url = format!("/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy{path}");
    let work = async {
        let req = http::Request::get(url.as_str())
            .header(http::header::ACCEPT, ACCEPT)
            .body(Vec::new())
            .map_err(|e| ScrapeError::Http {
                url: url.clone(),
                message: e.to_string(),
            })?;
        let stream = client.request_stream(req).await.map_err(|e| match e {
            kube::Error::Api(s) => ScrapeError::Status {
                url: url.clone(),
                status: s.code,
                message: one_line(&s.message, MESSAGE_MAX_CHARS),
                proxy: true,
            },
            other => ScrapeError::Http {
                url: url.clone(),
                message: other.to_string(),
            },
        })?;
        let mut buf = Vec::new();
        let mut limited = stream.take(limit as u64 + 1);
        limited
            .read_to_end(&mut buf)
            .await
            .map_err(|e| ScrapeError::Http {
                url: url.clone(),
                message: e.to_string(),
            })?;
        if buf.len() > limit {
            return Err(ScrapeError::TooLarge {
                url: url.clone(),
                limit,
            });
        }
        String::from_utf8(buf).map_err(|_| ScrapeError::NotUtf8 { url: url.clone() })
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(ScrapeError::Timeout {
            url,
            seconds: timeout.as_secs_f64(),
        }),
    }
}

/// Parses a page and reads the profile's metrics. Errors: `Parse`, or `NoSignal` when
/// none of the profile's signal metrics is on the page.
pub fn read_page(profile: &Profile, url: &str, body: &str) -> Result<AgentReading, ScrapeError> {
    let page = expo::parse(body).map_err(|source| ScrapeError::Parse {
        url: url.to_owned(),
        source,
    })?;
    let reading = AgentReading::from_page(profile, &page);
    if reading.has_no_signal() {
        return Err(ScrapeError::NoSignal {
            url: url.to_owned(),
            profile: profile.name.clone(),
        });
    }
    Ok(reading)
}

/// Where the proxy path gets its client.
enum ProxyClient {
    /// No client: direct only (proxy scrapes fail with [`ScrapeError::NoClient`]).
    None,
    /// A client used as given (callers build it with [`no_retry_client`]).
    Given(Client),
    /// Built on first use from `kube::Config::infer()` by [`no_retry_client`] (the
    /// gate's own client comes from the same inference); when that fails, `fallback`.
    Infer {
        fallback: Client,
        cell: tokio::sync::OnceCell<Client>,
    },
}

/// Scrapes agents by the configured path, limits and concurrency.
pub struct Scraper {
    client: ProxyClient,
    settings: ScrapeSettings,
    permits: Arc<Semaphore>,
    via_proxy: Mutex<HashSet<(String, String)>>,
    /// Auto mode, per profile: nodes whose direct scrape failed (at most
    /// `profile_proxy_after` kept), whether a direct scrape ever answered, and the
    /// profiles that went over to the proxy on every node.
    direct_paths: Mutex<DirectPaths>,
}

/// Per-profile record of the direct path (auto mode).
#[derive(Debug, Default)]
struct DirectPaths {
    failed_on: HashMap<String, HashSet<String>>,
    worked: HashSet<String>,
    via_proxy: HashSet<String>,
}

impl Scraper {
    /// A scraper; `client` is needed for the proxy and auto paths and is used as given
    /// (build it with [`no_retry_client`] so a proxy scrape is one request).
    pub fn new(client: Option<Client>, settings: ScrapeSettings) -> Scraper {
        Scraper::with_proxy_client(
            client.map_or(ProxyClient::None, ProxyClient::Given),
            settings,
        )
    }

    fn with_proxy_client(client: ProxyClient, settings: ScrapeSettings) -> Scraper {
        Scraper {
            client,
            permits: Arc::new(Semaphore::new(settings.concurrency.max(1))),
            settings,
            via_proxy: Mutex::new(HashSet::new()),
            direct_paths: Mutex::new(DirectPaths::default()),
        }
    }

    /// Records a direct scrape's outcome for `profile` on `node` (auto mode): an
    /// answer (even a bad page) marks the path as working for the profile; a failure
    /// on the `profile_proxy_after`-th distinct node of a profile whose direct path
    /// never worked sends the whole profile to the proxy.
    fn note_direct(&self, node: &str, profile: &str, answered: bool) {
        let after = self.settings.profile_proxy_after;
        let Ok(mut d) = self.direct_paths.lock() else {
            return;
        };
        if answered {
            d.worked.insert(profile.to_owned());
            d.failed_on.remove(profile);
            return;
        }
        if after == 0 || d.worked.contains(profile) || d.via_proxy.contains(profile) {
            return;
        }
        let failed = d.failed_on.entry(profile.to_owned()).or_default();
        failed.insert(node.to_owned());
        if failed.len() >= after {
            d.failed_on.remove(profile);
            d.via_proxy.insert(profile.to_owned());
            tracing::info!(profile, nodes = after,
                "direct agent scrapes failed on several nodes and never worked: this profile uses the API-server proxy on every node from now on");
        }
    }

    /// Whether `profile` went over to the proxy on every node (auto mode; see
    /// [`ScrapeSettings::profile_proxy_after`]).
    pub fn profile_uses_proxy(&self, profile: &str) -> bool {
        self.direct_paths
            .lock()
            .map(|d| d.via_proxy.contains(profile))
            .unwrap_or(false)
    }

    /// The settings in force.
    pub fn settings(&self) -> &ScrapeSettings {
        &self.settings
    }

    /// Whether (node, profile) went over to the proxy in auto mode (a direct scrape
    /// of that node failed for a reason other than the page's content, or the whole
    /// profile did, [`Scraper::profile_uses_proxy`]).
    pub fn uses_proxy(&self, node: &str, profile: &str) -> bool {
        self.profile_uses_proxy(profile)
            || self
                .via_proxy
                .lock()
                .map(|s| s.contains(&(node.to_owned(), profile.to_owned())))
                .unwrap_or(false)
    }

    fn has_client(&self) -> bool {
        !matches!(self.client, ProxyClient::None)
    }

    async fn proxy_client(&self) -> Option<&Client> {
        match &self.client {
            ProxyClient::None => None,
            ProxyClient::Given(c) => Some(c),
            ProxyClient::Infer { fallback, cell } => Some(
                cell.get_or_init(|| async {
                    let built = match kube::Config::infer().await {
                        Ok(cfg) => no_retry_client(cfg).map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                    built.unwrap_or_else(|e| {
                        tracing::warn!(error = %e,
                            "agent scrape client without retries: using the retrying client");
                        fallback.clone()
                    })
                })
                .await,
            ),
        }
    }

    async fn proxy(&self, t: &AgentTarget, port: u16, path: &str) -> Result<String, ScrapeError> {
        let client = self.proxy_client().await.ok_or(ScrapeError::NoClient)?;
        fetch_proxy(
            client,
            &t.namespace,
            &t.pod,
            port,
            path,
            self.settings.timeout,
            self.settings.max_body_bytes,
        )
        .await
    }

    /// One scrape of `target` (waits for a concurrency permit), parsed under `profile`.
    pub async fn scrape(
        &self,
        target: &AgentTarget,
        profile: &Profile,
    ) -> Result<AgentReading, ScrapeError> {
        self.scrape_via(target, profile).await.1
    }

    /// [`Scraper::scrape`], also returning the path the answer came by (`direct` or
    /// `proxy`; `None` when no request was made, e.g. no port resolved).
    pub async fn scrape_via(
        &self,
        target: &AgentTarget,
        profile: &Profile,
    ) -> (Option<&'static str>, Result<AgentReading, ScrapeError>) {
        let _permit = self.permits.acquire().await.ok();
        let pod = format!("{}/{}", target.namespace, target.pod);
        let Some(port) = target.port else {
            let tried: Vec<String> = profile.port.iter().map(|r| r.miss()).collect();
            return (
                None,
                Err(ScrapeError::NoAddress {
                    pod,
                    what: format!("no metrics port: {}", tried.join(", ")),
                }),
            );
        };
        let path = profile.path.as_str();
        let key = (target.node.clone(), target.profile.clone());
        let direct = || async {
            let host = target
                .host_ip
                .as_deref()
                .ok_or_else(|| ScrapeError::NoAddress {
                    pod: pod.clone(),
                    what: "no status.hostIP".to_owned(),
                })?;
            fetch_direct(
                host,
                port,
                path,
                self.settings.timeout,
                self.settings.max_body_bytes,
            )
            .await
        };
        let (label, body) = match self.settings.mode {
            ScrapeMode::Direct => ("direct", direct().await),
            ScrapeMode::Proxy => ("proxy", self.proxy(target, port, path).await),
            ScrapeMode::Auto => {
                if self.has_client() && self.uses_proxy(&target.node, &target.profile) {
                    ("proxy", self.proxy(target, port, path).await)
                } else {
                    let answer = direct().await;
                    self.note_direct(
                        &target.node,
                        &target.profile,
                        answer
                            .as_ref()
                            .map_or_else(|e| e.is_page_problem(), |_| true),
                    );
                    match answer {
                        Err(e) if !e.is_page_problem() && self.has_client() => {
                            tracing::debug!(pod = %pod, node = %target.node, error = %e,
                                "direct agent scrape failed: this node and profile use the API-server proxy from now on");
                            if let Ok(mut s) = self.via_proxy.lock() {
                                s.insert(key);
                            }
                            ("proxy", self.proxy(target, port, path).await)
                        }
                        other => ("direct", other),
                    }
                }
            }
        };
        let body = match body {
            Ok(b) => b,
            Err(e) => return (Some(label), Err(e)),
        };
        tracing::debug!(via = label, pod = %pod, port, node = %target.node, "agent scraped");
        (
            Some(label),
            read_page(profile, &format!("{label} {pod}:{port}{path}"), &body),
        )
    }
}

/// At most `k` of `nodes`, spread evenly over the list in its order (the `i`-th of
/// `k` is element `i·len/k`): all of them when `k ≥ len`, none when `k` is 0.
pub fn reference_sample(nodes: &[String], k: usize) -> Vec<String> {
    if k >= nodes.len() {
        return nodes.to_vec();
    }
    (0..k).map(|i| nodes[i * nodes.len() / k].clone()).collect()
}

/// Suspects for the probe record and warnings for the gate report from one probe.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AgentFindings {
    /// Goes to `ProbeRecord.suspects` (slow / failed probes only).
    pub suspects: Vec<Suspect>,
    /// Goes to `GateReport.warnings` through [`super::correlate::merge_warnings`].
    pub warnings: Vec<Suspect>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Hot {
    in_flight: u32,
    until: f64,
}

struct Inner {
    origin: Instant,
    profiles: Vec<Profile>,
    index: SharedIndex,
    scraper: Scraper,
    history: Mutex<History>,
    hot: Mutex<HashMap<String, Hot>>,
    params: Params,
    counts: Mutex<BTreeMap<(String, &'static str), u64>>,
}

impl Inner {
    fn now(&self) -> f64 {
        self.origin.elapsed().as_secs_f64()
    }

    async fn scrape_nodes(&self, nodes: &[String]) {
        let targets: Vec<AgentTarget> = match self.index.read() {
            Ok(idx) => {
                let mut seen = HashSet::new();
                nodes
                    .iter()
                    .filter(|n| seen.insert(n.as_str()))
                    .flat_map(|n| idx.on_node(n))
                    .collect()
            }
            Err(_) => return,
        };
        let jobs = targets.into_iter().filter_map(|t| {
            let profile = self.profiles.iter().find(|p| p.name == t.profile)?.clone();
            Some(async move {
                let (path, outcome) = self.scraper.scrape_via(&t, &profile).await;
                let result = outcome.as_ref().map_or_else(|e| e.reason(), |_| "ok");
                if let Ok(mut c) = self.counts.lock() {
                    *c.entry((t.profile.clone(), result)).or_default() += 1;
                }
                Observation {
                    at: self.now(),
                    profile: t.profile.as_str().into(),
                    node: t.node.as_str().into(),
                    pod: t.pod.as_str().into(),
                    uid: t.uid.as_str().into(),
                    restart_count: t.restart_count,
                    ready: t.ready,
                    scrape_path: path,
                    // The hint (how to turn the metrics on, the RBAC needed) only where
                    // it is the likely cause (ScrapeError::hint).
                    outcome: outcome.map_err(|e| e.failure(&profile)),
                }
            })
        });
        let observations = futures::future::join_all(jobs).await;
        if let Ok(mut h) = self.history.lock() {
            for o in observations {
                h.push(o);
            }
        }
    }

    fn cluster_view(&self) -> ClusterView {
        let (present, by_node, errors) = match self.index.read() {
            Ok(idx) => {
                let mut by_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
                for t in idx.all() {
                    by_node.entry(t.node).or_default().push(t.profile);
                }
                (idx.present_profiles(), by_node, idx.errors())
            }
            Err(_) => (Vec::new(), BTreeMap::new(), Vec::new()),
        };
        ClusterView {
            present_profiles: present,
            searched_profiles: self.profiles.iter().map(|p| p.name.clone()).collect(),
            agents_on_node: by_node,
            discovery_errors: errors,
        }
    }

    /// One step of the policy: re-scrape stale hot nodes, and on sweep ticks the
    /// least recently scraped others.
    async fn policy_step(&self, settings: &ScrapeSettings, sweep: bool) {
        let now = self.now();
        let hot: Vec<String> = self
            .hot
            .lock()
            .map(|h| {
                h.iter()
                    .filter(|(_, s)| s.in_flight > 0 || s.until > now)
                    .map(|(n, _)| n.clone())
                    .collect()
            })
            .unwrap_or_default();
        let last = |n: &str| self.history.lock().ok().and_then(|h| h.last_at(n));
        let stale: Vec<String> = hot
            .iter()
            .filter(|n| last(n).is_none_or(|t| now - t >= settings.hot_interval.as_secs_f64()))
            .cloned()
            .collect();
        let mut todo = stale;
        if sweep && settings.sweep_batch > 0 {
            let nodes = self.index.read().map(|i| i.nodes()).unwrap_or_default();
            let mut cold: Vec<(f64, String)> = nodes
                .into_iter()
                .filter(|n| !hot.contains(n))
                .map(|n| (last(&n).unwrap_or(f64::NEG_INFINITY), n))
                .collect();
            cold.sort_by(|a, b| a.0.total_cmp(&b.0));
            todo.extend(cold.into_iter().take(settings.sweep_batch).map(|(_, n)| n));
        }
        if !todo.is_empty() {
            self.scrape_nodes(&todo).await;
        }
    }
}

/// Discovery + scrape policy + per-probe correlation, for the gate and continuous mode.
///
/// Wiring (see also the module doc):
/// 1. at start: [`AgentWatcher::start`], then [`AgentWatcher::wait_synced`] (bounded)
///    and optionally [`AgentWatcher::prime`] with the planned nodes;
/// 2. per probe, before creating the target: [`AgentWatcher::probe_started`] → a
///    [`ProbeWindow`];
/// 3. per probe, once the result is known (before recording):
///    [`AgentWatcher::probe_finished`] → [`AgentFindings`]: `suspects` into
///    `ProbeRecord.suspects`, `warnings` merged into `GateReport.warnings` with
///    [`super::correlate::merge_warnings`].
///
/// Dropping the watcher stops its tasks.
pub struct AgentWatcher {
    inner: Arc<Inner>,
    settings: ScrapeSettings,
    tasks: Vec<JoinHandle<()>>,
}

impl AgentWatcher {
    /// Starts discovery (one watch per profile namespace, on `client`) and the scrape
    /// policy loop. Needs a tokio runtime. Proxy scrapes use a client without kube's
    /// retry layer built on first use from `kube::Config::infer()` ([`no_retry_client`];
    /// `client` if that fails) — callers holding their `kube::Config` should prefer
    /// [`AgentWatcher::start_with_scrape_client`].
    pub fn start(
        client: Client,
        profiles: Vec<Profile>,
        settings: ScrapeSettings,
        params: Params,
    ) -> AgentWatcher {
        let proxy = ProxyClient::Infer {
            fallback: client.clone(),
            cell: tokio::sync::OnceCell::new(),
        };
        AgentWatcher::start_inner(client, proxy, profiles, settings, params)
    }

    /// [`AgentWatcher::start`] with the client for proxy scrapes given:
    /// `scrape_client` should be [`no_retry_client`]`(config.clone())` of the config
    /// `client` came from (one request per scrape).
    pub fn start_with_scrape_client(
        client: Client,
        scrape_client: Client,
        profiles: Vec<Profile>,
        settings: ScrapeSettings,
        params: Params,
    ) -> AgentWatcher {
        AgentWatcher::start_inner(
            client,
            ProxyClient::Given(scrape_client),
            profiles,
            settings,
            params,
        )
    }

    fn start_inner(
        client: Client,
        proxy: ProxyClient,
        profiles: Vec<Profile>,
        settings: ScrapeSettings,
        params: Params,
    ) -> AgentWatcher {
        let index: SharedIndex = Arc::new(RwLock::new(AgentIndex::default()));
        let mut w = AgentWatcher::with_scraper(
            Scraper::with_proxy_client(proxy, settings.clone()),
            profiles.clone(),
            settings,
            params,
            index.clone(),
        );
        w.tasks
            .push(tokio::spawn(watch_agents(client, profiles, index)));
        w
    }

    /// Whether correlation is off: no profile to search (every built-in disabled by
    /// `--agent-config` and none added). Then no finding is ever produced; the gate can
    /// say so once.
    pub fn is_off(&self) -> bool {
        self.inner.profiles.is_empty()
    }

    /// Like [`AgentWatcher::start`] over an index the caller fills (no discovery task;
    /// tests, or a caller with its own pod watch). Starts the policy loop.
    pub fn with_index(
        client: Option<Client>,
        profiles: Vec<Profile>,
        settings: ScrapeSettings,
        params: Params,
        index: SharedIndex,
    ) -> AgentWatcher {
        AgentWatcher::with_scraper(
            Scraper::new(client, settings.clone()),
            profiles,
            settings,
            params,
            index,
        )
    }

    fn with_scraper(
        scraper: Scraper,
        profiles: Vec<Profile>,
        settings: ScrapeSettings,
        params: Params,
        index: SharedIndex,
    ) -> AgentWatcher {
        let inner = Arc::new(Inner {
            origin: Instant::now(),
            profiles,
            index,
            scraper,
            history: Mutex::new(History::new(settings.ring)),
            hot: Mutex::new(HashMap::new()),
            params,
            counts: Mutex::new(BTreeMap::new()),
        });
        let weak = Arc::downgrade(&inner);
        let s = settings.clone();
        let policy = tokio::spawn(async move {
            let tick = s
                .hot_interval
                .min(s.sweep_tick)
                .max(Duration::from_millis(200));
            let mut last_sweep = Instant::now();
            loop {
                tokio::time::sleep(tick).await;
                let Some(inner) = weak.upgrade() else { return };
                let sweep = last_sweep.elapsed() >= s.sweep_tick;
                if sweep {
                    last_sweep = Instant::now();
                }
                inner.policy_step(&s, sweep).await;
            }
        });
        AgentWatcher {
            inner,
            settings,
            tasks: vec![policy],
        }
    }

    /// Seconds since the watcher started (the clock of windows and observations).
    pub fn now(&self) -> f64 {
        self.inner.now()
    }

    /// The index of discovered agents.
    pub fn index(&self) -> SharedIndex {
        self.inner.index.clone()
    }

    /// Waits until every (profile, namespace) watch delivered its initial list, at most
    /// `timeout`; stops early (false) once every watch has either synced or is failing
    /// (e.g. a 403). Returns whether they all synced (false is not fatal: correlation
    /// works on what was found, and names failing discovery in its findings).
    pub async fn wait_synced(&self, timeout: Duration) -> bool {
        let want: usize = self.inner.profiles.iter().map(|p| p.namespaces.len()).sum();
        let deadline = Instant::now() + timeout;
        loop {
            // A watch that failed (e.g. 403) counts as settled: waiting the whole
            // timeout for it would only delay the run.
            let (have, failing) = self
                .inner
                .index
                .read()
                .map(|i| (i.synced_watches(), i.errors().len()))
                .unwrap_or((0, 0));
            if have >= want {
                return true;
            }
            if have + failing >= want {
                return false;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Scrapes every agent on a reference sample of `nodes` once (e.g. the eligible
    /// nodes at start, so the first probes have a cluster baseline): all of them up to
    /// [`ScrapeSettings::reference_sample`], else that many spread evenly over the list
    /// ([`reference_sample`]). Returns the nodes scraped.
    pub async fn prime(&self, nodes: &[String]) -> Vec<String> {
        let sample = reference_sample(nodes, self.settings.reference_sample);
        self.inner.scrape_nodes(&sample).await;
        sample
    }

    /// Call before creating a probe's target pod: marks both nodes hot, scrapes their
    /// agents, returns the window (its `start` is after those scrapes).
    pub async fn probe_started(&self, source_node: &str, target_node: &str) -> ProbeWindow {
        let nodes = [source_node.to_owned(), target_node.to_owned()];
        if let Ok(mut hot) = self.inner.hot.lock() {
            for n in &nodes {
                hot.entry(n.clone()).or_default().in_flight += 1;
            }
        }
        self.inner.scrape_nodes(&nodes).await;
        ProbeWindow {
            start: self.now(),
            end: f64::NAN,
            source_node: source_node.to_owned(),
            target_node: target_node.to_owned(),
        }
    }

    /// Call once the probe's result is known: closes the window, scrapes both nodes,
    /// correlates, and splits findings by `result` ([`split_findings`]).
    pub async fn probe_finished(&self, window: ProbeWindow, result: ProbeResult) -> AgentFindings {
        let mut window = window;
        window.end = self.now();
        let nodes = [window.source_node.clone(), window.target_node.clone()];
        self.inner.scrape_nodes(&nodes).await;
        let until = self.now() + self.settings.recent.as_secs_f64();
        if let Ok(mut hot) = self.inner.hot.lock() {
            for n in &nodes {
                let h = hot.entry(n.clone()).or_default();
                h.in_flight = h.in_flight.saturating_sub(1);
                h.until = until;
            }
        }
        let view = self.inner.cluster_view();
        let findings = match self.inner.history.lock() {
            Ok(h) => correlate(&h, &view, &window, &self.inner.params),
            Err(_) => Vec::new(),
        };
        let (suspects, warnings) = split_findings(findings, result);
        AgentFindings { suspects, warnings }
    }

    /// Scrape counts by (profile, result) since start, for
    /// `firstpacket_agent_scrapes_total{profile, result}` (`result` is `ok` or a
    /// [`ScrapeError::reason`]).
    pub fn scrape_counts(&self) -> BTreeMap<(String, String), u64> {
        self.inner
            .counts
            .lock()
            .map(|c| {
                c.iter()
                    .map(|((p, r), n)| ((p.clone(), (*r).to_owned()), *n))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether (node, profile) went over to the API-server proxy (auto mode).
    pub fn uses_proxy(&self, node: &str, profile: &str) -> bool {
        self.inner.scraper.uses_proxy(node, profile)
    }

    /// Forgets every per-node entry (observation rings, hot marks, proxy fallbacks) of
    /// nodes `keep` rejects, so a long-running prober's memory follows the live nodes.
    pub fn forget_nodes(&self, keep: impl Fn(&str) -> bool) {
        if let Ok(mut h) = self.inner.history.lock() {
            h.retain_nodes(&keep);
        }
        if let Ok(mut hot) = self.inner.hot.lock() {
            hot.retain(|n, h| keep(n) || h.in_flight > 0);
        }
        if let Ok(mut v) = self.inner.scraper.via_proxy.lock() {
            v.retain(|(n, _)| keep(n));
        }
    }

    /// Sizes of the per-node structures: (`agent_history_rings`, `agent_hot_nodes`,
    /// `agent_via_proxy`).
    pub fn state_sizes(&self) -> [(&'static str, usize); 3] {
        [
            (
                "agent_history_rings",
                self.inner.history.lock().map_or(0, |h| h.rings_len()),
            ),
            (
                "agent_hot_nodes",
                self.inner.hot.lock().map_or(0, |h| h.len()),
            ),
            (
                "agent_via_proxy",
                self.inner.scraper.via_proxy.lock().map_or(0, |v| v.len()),
            ),
        ]
    }

    /// A copy of the observation history (tests, debugging).
    pub fn history(&self) -> History {
        self.inner
            .history
            .lock()
            .map(|h| h.clone())
            .unwrap_or_default()
    }
}

impl Drop for AgentWatcher {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

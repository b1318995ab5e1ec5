//! kube-proxy-compatible `/metrics` for the testbed's service programmer (docs/design.md §3
//! "kube-proxy" profile, §5; issue 4).
//!
//! Every node runs a [`crate::services::ServiceProxy`] — the testbed's kube-proxy — and
//! a `kube-proxy-<node>` pod (kube-system, hostNetwork, `k8s-app=kube-proxy`) that
//! stands for it, so agent discovery finds it as it finds a real kube-proxy DaemonSet.
//! Its metrics are served on [`KUBE_PROXY_METRICS_PORT`] at the address `testbed up
//! --kube-proxy-metrics` chooses ([`MetricsBind`]): like kube-proxy's
//! `--metrics-bind-address`, the real default is `127.0.0.1:10249`
//! (kube-proxy configuration reference, `KubeProxyConfiguration.metricsBindAddress`), which
//! no scraper outside the node can reach; that is the case the prober must report as
//! `agent_unreachable` (issue 4).
//!
//! Names, HELP texts, types and buckets are those of a real kube-proxy 1.21 page
//! (`prober/tests/fixtures/kube-proxy-1.21.1.prom`); values come from what the service
//! programmer really did:
//!
//! | family | type | fed by |
//! |---|---|---|
//! | `kubeproxy_sync_proxy_rules_duration_seconds` | histogram, buckets 1 ms·2^k (k = 0…14) | every `nft -f` table write, timed |
//! | `kubeproxy_sync_proxy_rules_iptables_restore_failures_total` | counter | failed table writes (our iptables-restore) |
//! | `kubeproxy_sync_proxy_rules_last_timestamp_seconds` | gauge | the last successful write, Unix seconds |
//! | `kubeproxy_network_programming_duration_seconds` | histogram, the fixture's buckets | per changed Service: change seen → rules written (includes fault `service_delay`) |
//! | `process_start_time_seconds` | gauge | the daemon's start of this node's programmer |
//!
//! The pages are rendered by the `prometheus` crate (client_golang's text encoder
//! semantics), one [`prometheus::Registry`] per node.

use prometheus::{Encoder, Gauge, Histogram, HistogramOpts, IntCounter, Opts, Registry};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

/// kube-proxy's metrics port (`KubeProxyConfiguration.metricsBindAddress` default
/// `127.0.0.1:10249`, kube-proxy configuration reference).
pub const KUBE_PROXY_METRICS_PORT: u16 = 10249;

/// Where the simulated kube-proxy listens for scrapes (`testbed up --kube-proxy-metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum MetricsBind {
    /// `0.0.0.0:10249` in the node netns: reachable at `<node IP>:10249`, as clusters
    /// that scrape kube-proxy configure it. The testbed default.
    #[default]
    All,
    /// `127.0.0.1:10249`: kube-proxy's own default; only the node itself can scrape it.
    Localhost,
    /// No kube-proxy pods and no metrics (a cluster without kube-proxy, e.g. Cilium's
    /// kube-proxy replacement).
    None,
}

impl MetricsBind {
    /// The socket address inside the node netns, `None` for [`MetricsBind::None`].
    pub fn addr(self) -> Option<SocketAddr> {
        let ip = match self {
            MetricsBind::All => Ipv4Addr::UNSPECIFIED,
            MetricsBind::Localhost => Ipv4Addr::LOCALHOST,
            MetricsBind::None => return None,
        };
        Some(SocketAddr::from((ip, KUBE_PROXY_METRICS_PORT)))
    }

    /// The value of the `--kube-proxy-metrics` flag (for passing it on).
    pub fn as_arg(self) -> &'static str {
        match self {
            MetricsBind::All => "all",
            MetricsBind::Localhost => "localhost",
            MetricsBind::None => "none",
        }
    }
}

/// Buckets of `kubeproxy_network_programming_duration_seconds` as on the fixture page:
/// 0, 0.25, 0.5, then 1 s steps to 60, 5 s steps to 120, 30 s steps to 300
/// (kubernetes `pkg/proxy/metrics/metrics.go`, `NetworkProgrammingLatency`).
fn network_programming_buckets() -> Vec<f64> {
    let mut b = vec![0.0, 0.25, 0.5];
    b.extend((1..=59).map(f64::from));
    b.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    b.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    b
}

/// One node's kube-proxy metrics (cheap to share: every field is an `Arc` inside).
#[derive(Clone)]
pub struct KubeProxyMetrics {
    registry: Registry,
    sync_duration: Histogram,
    restore_failures: IntCounter,
    last_sync: Gauge,
    network_programming: Histogram,
}

impl std::fmt::Debug for KubeProxyMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeProxyMetrics")
            .field("syncs", &self.sync_duration.get_sample_count())
            .field("restore_failures", &self.restore_failures.get())
            .finish()
    }
}

impl KubeProxyMetrics {
    /// A fresh page; `start_unix` is `process_start_time_seconds`.
    pub fn new(start_unix: f64) -> KubeProxyMetrics {
        let registry = Registry::new();
        let sync_duration = Histogram::with_opts(
            HistogramOpts::new(
                "kubeproxy_sync_proxy_rules_duration_seconds",
                "[ALPHA] SyncProxyRules latency in seconds",
            )
            .buckets(prometheus::exponential_buckets(0.001, 2.0, 15).expect("valid buckets")),
        )
        .expect("valid histogram");
        let restore_failures = IntCounter::with_opts(Opts::new(
            "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
            "[ALPHA] Cumulative proxy iptables restore failures",
        ))
        .expect("valid counter");
        let last_sync = Gauge::with_opts(Opts::new(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "[ALPHA] The last time proxy rules were successfully synced",
        ))
        .expect("valid gauge");
        let network_programming = Histogram::with_opts(
            HistogramOpts::new(
                "kubeproxy_network_programming_duration_seconds",
                "[ALPHA] In Cluster Network Programming Latency in seconds",
            )
            .buckets(network_programming_buckets()),
        )
        .expect("valid histogram");
        let start = Gauge::with_opts(Opts::new(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
        ))
        .expect("valid gauge");
        start.set(start_unix);
        for c in [
            Box::new(sync_duration.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(restore_failures.clone()),
            Box::new(last_sync.clone()),
            Box::new(network_programming.clone()),
            Box::new(start),
        ] {
            registry.register(c).expect("distinct metric names");
        }
        KubeProxyMetrics {
            registry,
            sync_duration,
            restore_failures,
            last_sync,
            network_programming,
        }
    }

    /// Records one table write: how long `nft -f` took and whether it succeeded.
    pub fn record_sync(&self, took: Duration, ok: bool) {
        self.sync_duration.observe(took.as_secs_f64());
        if ok {
            self.last_sync.set(crate::truth::unix_now());
        } else {
            self.restore_failures.inc();
        }
    }

    /// Records one Service's programming latency (change seen → rules written), seconds.
    pub fn record_programmed(&self, seconds: f64) {
        self.network_programming.observe(seconds.max(0.0));
    }

    /// The page, text format 0.0.4.
    pub fn render(&self) -> String {
        let mut buf = Vec::with_capacity(8192);
        prometheus::TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding into memory cannot fail");
        String::from_utf8(buf).expect("the text encoder writes UTF-8")
    }
}

/// Binds `addr` and serves `GET /metrics` of `metrics` until the task is dropped. Run it
/// on the node's [`NetnsThread`](crate::netns::NetnsThread) runtime (the address is one of
/// the node netns). Errors: bind failure, accept-loop I/O error.
pub async fn bind_and_serve(metrics: KubeProxyMetrics, addr: SocketAddr) -> std::io::Result<()> {
    use axum::routing::get;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let page = move || {
        let m = metrics.clone();
        async move {
            (
                [(axum::http::header::CONTENT_TYPE, crate::felix::CONTENT_TYPE)],
                m.render(),
            )
        }
    };
    let app = axum::Router::new().route("/metrics", get(page));
    axum::serve(listener, app).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_has_the_fixture_families_and_counts_what_was_recorded() {
        let m = KubeProxyMetrics::new(1.7e9);
        m.record_sync(Duration::from_millis(3), true);
        m.record_sync(Duration::from_millis(40), false);
        m.record_programmed(4.2);
        let page = m.render();
        let parsed = prometheus_parse::Scrape::parse(page.lines().map(|l| Ok(l.to_owned())))
            .expect("parses");
        let value = |name: &str| {
            parsed
                .samples
                .iter()
                .find(|s| s.metric == name)
                .map(|s| s.value.clone())
        };
        assert!(matches!(
            value("kubeproxy_sync_proxy_rules_iptables_restore_failures_total"),
            Some(prometheus_parse::Value::Counter(v)) if v == 1.0
        ));
        match value("kubeproxy_sync_proxy_rules_duration_seconds") {
            Some(prometheus_parse::Value::Histogram(h)) => {
                assert_eq!(h.len(), 16, "15 buckets and +Inf");
                let le4ms = h.iter().find(|b| b.less_than == 0.004).unwrap();
                assert_eq!(le4ms.count, 1.0);
                assert_eq!(h.last().unwrap().count, 2.0);
            }
            other => panic!("{other:?}"),
        }
        match value("kubeproxy_network_programming_duration_seconds") {
            Some(prometheus_parse::Value::Histogram(h)) => {
                let le5 = h.iter().find(|b| b.less_than == 5.0).unwrap();
                let le4 = h.iter().find(|b| b.less_than == 4.0).unwrap();
                assert_eq!((le4.count, le5.count), (0.0, 1.0));
            }
            other => panic!("{other:?}"),
        }
        assert!(
            page.contains("process_start_time_seconds 1700000000"),
            "{page}"
        );
    }

    #[test]
    fn network_programming_buckets_match_the_fixture_page() {
        let fixture = include_str!("../tests/fixtures/kube-proxy-1.21.1.prom");
        let want: Vec<f64> = fixture
            .lines()
            .filter_map(|l| {
                l.strip_prefix("kubeproxy_network_programming_duration_seconds_bucket{le=\"")
            })
            .filter_map(|rest| rest.split('"').next())
            .filter(|le| *le != "+Inf")
            .map(|le| le.parse().unwrap())
            .collect();
        assert_eq!(network_programming_buckets(), want);
    }

    #[test]
    fn bind_addresses_follow_the_flag() {
        assert_eq!(
            MetricsBind::Localhost.addr().unwrap().to_string(),
            "127.0.0.1:10249"
        );
        assert_eq!(
            MetricsBind::All.addr().unwrap().to_string(),
            "0.0.0.0:10249"
        );
        assert_eq!(MetricsBind::None.addr(), None);
    }
}

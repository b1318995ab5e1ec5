//! Node-agent correlation (docs/design.md §3): the CNI agents' own `/metrics` pages (Calico
//! Felix, Cilium, kube-proxy, aws-node) explain slow or failed probes.
//!
//! The pages are read by [`expo`] (pure parser: Prometheus text exposition format 0.0.4,
//! plus the OpenMetrics `# EOF` terminator); the other modules hold profiles, discovery,
//! scraping and correlation (issue 4).

pub mod correlate;
pub mod discover;
pub mod expo;
pub mod profiles;
pub mod scrape;

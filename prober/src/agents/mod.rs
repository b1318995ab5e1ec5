//! Node-agent correlation (DESIGN.md §3): the CNI agents' own `/metrics` pages (Calico
//! Felix, Cilium, kube-proxy, aws-node) explain slow or failed probes.
//!
//! For now this holds only the pure parser of the pages: [`expo`] (Prometheus text
//! exposition format 0.0.4, plus the OpenMetrics `# EOF` terminator). Profiles, scraping
//! and correlation come later (issue 4).

pub mod expo;

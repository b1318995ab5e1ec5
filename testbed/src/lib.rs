//! testbed: a small real Kubernetes-like cluster on one Linux machine.
//!
//! API server subset ([`api`]), scheduler ([`scheduler`]), kubelet, simulated CNI agent
//! ([`agent`]) and dataplane ([`dataplane`]) in network namespaces, fault injection
//! ([`fault`]) and ground truth ([`truth`]). Contract: docs/design.md §5 and §6; the module
//! map is in `testbed/ARCHITECTURE.md`.

pub mod agent;
pub mod api;
pub mod calico;
pub mod cli;
pub mod client;
pub mod cni;
pub mod control_plane;
pub mod controllers;
pub mod daemon;
pub mod dataplane;
pub mod demo;
pub mod fault;
pub mod felix;
pub mod hollow;
pub mod httpc;
pub mod image;
pub mod ipset_watch;
pub mod kube_proxy;
pub mod kube_proxy_real;
pub mod kubelet;
pub mod netns;
pub mod netpol;
pub mod plan;
pub mod policy_sync;
pub mod realnode;
pub mod ruleset;
pub mod scheduler;
pub mod security;
pub mod services;
pub mod shim;
pub mod supervise;
pub mod tls;
pub mod truth;
pub mod truth_watch;
pub mod wire;

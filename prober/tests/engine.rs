//! The middle tier (docs/src/architecture.md: the three test tiers): the prober's engine —
//! `prober gate`, `prober run`, `prober cleanup`, in-process — against the in-process
//! cluster of [`cluster`], one file per area, all in this one test binary (one link, and
//! the tests of every file run side by side: most of their time is waiting, so run them
//! with `-- --test-threads=8`; `.ci/run` does). Each test makes a network namespace of
//! its own with only loopback up: run as root, or inside `unshare --user --map-root-user
//! --net cargo test -p prober --test engine -- --test-threads=8`.

mod cluster;

/// Every probe ending of a gate.
#[path = "engine_probe.rs"]
mod probe;

/// The gate's policy and the engine's robustness.
#[path = "engine_gate.rs"]
mod gate;

/// `prober run`: the loop, leadership, janitor, Events, outages.
#[path = "engine_run.rs"]
mod run_mode;

/// Every RBAC row taken away.
#[path = "engine_rbac.rs"]
mod rbac;

/// Baseline and drift.
#[path = "engine_baseline.rs"]
mod baseline;

/// The NetworkPolicy kinds (issue 32).
#[path = "engine_policy.rs"]
mod policy;

//! Accuracy of each path (issue 33): `prober gate --protocols tcp,udp --payload mtu
//! --ip-families ipv4,ipv6`, every path's TTFP against the testbed's truth, in the TTFP
//! accuracy table's shape.
//!
//! One 3-node dual-stack testbed (`testbed up --ip-families ipv4,ipv6`) on the simulated
//! agent, not gating readiness (the delay lands after
//! Ready, in TTFP), program delays jittered ±0.5 s as in the accuracy section (a fixed
//! delay phase-locks the dial ticks to the moment the path comes up). One gate per
//! delay; each probe's eight paths (TCP and UDP, small and full-size, IPv4 and IPv6) are
//! dialed by the same source, and each path's truth is the pair's §6 truth TTFP in the
//! path's family (`truth_family_ttfp`: one dataplane carries every protocol and size, and
//! the simulated agent admits a pod's IPv4 and IPv6 addresses in the same step; with no
//! path fault in force none of them is held back apart).
use super::{ms, stats, Opts, Table};
use crate::common::Testbed;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

pub const PATHS: &str = "Accuracy of each path against truth";

fn delays(opts: &Opts) -> (Vec<f64>, usize) {
    if opts.smoke {
        (vec![0.5], 2)
    } else {
        (vec![0.0, 0.5, 2.0, 10.0], 10)
    }
}

pub fn run(opts: &Opts) -> Vec<Table> {
    let (delays, pairs) = delays(opts);
    let tb = Testbed::up(
        "bench-paths",
        3,
        "rules: []\n",
        &["--ip-families", "ipv4,ipv6"],
    );
    let mut t = Table::new(
        PATHS,
        &format!(
            "Signed error = a path's TTFP − the pair's truth TTFP (ms), per program delay D \
             (fault `program_delay: {{uniform: [D − 0.5 s, D + 0.5 s]}}` on every node, \
             floored at 0, `agent: {{gates_readiness: false}}`), {pairs} `cross_node` probes \
             per delay in one `prober gate --kinds cross_node --pairs {pairs} --concurrency 5 \
             --hold 1s --give-up D+30s --protocols tcp,udp --payload mtu --ip-families \
             ipv4,ipv6` each, on a dual-stack testbed \
             (`testbed up --ip-families ipv4,ipv6`): every probe's source dials the eight \
             paths side by side, each with the dial interval (100 ms); each path's truth is \
             the pair's truth TTFP in the path's family. \
             Target as TTFP's: p95 within [0, dial interval + 50 ms], never below −50 ms."
        ),
        &[
            "delay D (±0.5 s)",
            "path",
            "n",
            "p5",
            "p50",
            "p95",
            "max",
            "min",
            "p95 |err|",
        ],
    );
    let mut misses = Vec::new();
    for d in delays {
        let delay = Duration::from_secs_f64(d);
        tb.set_fault(&super::accuracy::fault_around(delay, false));
        eprintln!("paths: program_delay {d}s, {pairs} probes");
        let give_up = humantime::format_duration(delay + Duration::from_secs(30)).to_string();
        let (_, report, out) = tb.gate(&[
            "--kinds",
            "cross_node",
            "--pairs",
            &pairs.to_string(),
            "--concurrency",
            "5",
            "--hold",
            "1s",
            "--give-up",
            &give_up,
            "--protocols",
            "tcp,udp",
            "--payload",
            "mtu",
            "--ip-families",
            "ipv4,ipv6",
        ]);
        let truth = tb.truth();
        let mut errs: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for p in report["probes"].as_array().cloned().unwrap_or_default() {
            let (Some(src), Some(dst)) = (p["source"]["uid"].as_str(), p["target"]["uid"].as_str())
            else {
                continue;
            };
            for x in p["paths"].as_array().cloned().unwrap_or_default() {
                let path = path_id(&x);
                let Some(family) = x["family"].as_str().and_then(|f| f.parse().ok()) else {
                    continue;
                };
                let Some(want) = testbed::truth::truth_family_ttfp(&truth, src, dst, family) else {
                    continue;
                };
                match x["ttfp_seconds"].as_f64() {
                    Some(ttfp) => errs.entry(path).or_default().push(ttfp - want),
                    None => misses.push(format!(
                        "delay {d}s: {} path {path}: no TTFP ({})",
                        p["id"], x["reason"]
                    )),
                }
            }
        }
        if errs.is_empty() {
            misses.push(format!("delay {d}s: no path had a TTFP and a truth\n{out}"));
        }
        for (path, e) in &errs {
            let s = stats(e);
            t.row(vec![
                humantime::format_duration(delay).to_string(),
                path.clone(),
                e.len().to_string(),
                ms(s[0]),
                ms(s[1]),
                ms(s[2]),
                ms(s[3]),
                ms(s[4]),
                format!("{:.0}", s[5] * 1000.0),
            ]);
            if !(0.0..=0.15).contains(&s[2]) || s[4] < -0.05 {
                misses.push(format!(
                    "delay {d}s: path {path}: p95 {:+.0} ms, min {:+.0} ms (target p95 in [0, 150] ms, min ≥ −50 ms)",
                    s[2] * 1e3,
                    s[4] * 1e3
                ));
            }
        }
    }
    if misses.is_empty() {
        t.notes
            .push("Every path met the accuracy target at every delay.".into());
    } else {
        t.notes.extend(misses);
    }
    vec![t]
}

/// `protocol/family/payload` of a record's path.
fn path_id(x: &Value) -> String {
    format!(
        "{}/{}/{}",
        x["protocol"].as_str().unwrap_or("?"),
        x["family"].as_str().unwrap_or("?"),
        x["payload"].as_str().unwrap_or("?")
    )
}

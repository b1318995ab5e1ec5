//! The alerting and recording rules (`alerts/firstpacket.rules.yaml`), their promtool
//! unit tests (`alerts/tests/`), the runbooks, the example Alertmanager configuration and
//! the Grafana dashboard, checked with the real tools — `promtool` and `amtool` from
//! Debian's `prometheus` and `prometheus-alertmanager` packages (`scripts/setup.sh`
//! installs them) — and against the monitoring-mixins conventions; and the files
//! generated from them (the prometheus-operator PrometheusRule, the Helm chart's copies,
//! the dashboard ConfigMap) are not stale. No testbed is started.
//!
//! Regenerate the generated files after editing a source:
//! `FIRSTPACKET_REGENERATE=1 cargo test -p testbed --test alerts`.

mod common;

use common::monitoring::{self as mon, field};
use serde_json::Value as Json;
use std::collections::BTreeSet;
use std::process::Command;

/// Runs a tool (`promtool`, `amtool`) with `args`; panics with its output unless it
/// exits 0, or with how to install it when it is missing. Returns stdout + stderr.
fn tool(name: &str, args: &[&str]) -> String {
    let out = Command::new(name)
        .args(args)
        .current_dir(common::repo_file(""))
        .output()
        .unwrap_or_else(|e| {
            panic!("{name}: {e} (install Debian's prometheus and prometheus-alertmanager packages: bash scripts/setup.sh)")
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{name} {args:?} failed:\n{text}");
    text
}

/// `promtool check rules alerts/*.yaml`, as a user would run it: every YAML file
/// directly in `alerts/` is a rule file (the Alertmanager example lives in
/// `alerts/examples/`), and the rule file is among them.
#[test]
fn rules_pass_promtool_check_rules() {
    let mut files: Vec<String> = std::fs::read_dir(mon::path("alerts"))
        .expect("alerts/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| format!("alerts/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    files.sort();
    assert!(files.iter().any(|f| f == mon::RULES), "{files:?}");
    let mut args = vec!["check", "rules"];
    args.extend(files.iter().map(String::as_str));
    let out = tool("promtool", &args);
    assert_eq!(out.matches("SUCCESS").count(), files.len(), "{out}");
}

#[test]
fn promtool_unit_tests_pass() {
    let mut files: Vec<String> = std::fs::read_dir(mon::path(mon::RULE_TESTS))
        .expect("alerts/tests")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| {
            format!(
                "{}/{}",
                mon::RULE_TESTS,
                p.file_name().unwrap().to_string_lossy()
            )
        })
        .collect();
    files.sort();
    assert!(files.len() >= 4, "promtool test files: {files:?}");
    let mut args = vec!["test", "rules"];
    args.extend(files.iter().map(String::as_str));
    let out = tool("promtool", &args);
    assert_eq!(
        out.matches("SUCCESS").count(),
        files.len(),
        "every file passes:\n{out}"
    );
}

/// The alerts the issue asks for, by what they watch.
const REQUIRED_ALERTS: &[&str] = &[
    "FirstPacketTTFPDrift",         // drift from baseline (the headline)
    "FirstPacketTTFPHigh",          // TTFP p90 over an absolute threshold
    "FirstPacketProbeFailures",     // probe failure ratio
    "FirstPacketCrossNodeBroken",   // cross-node broken while same-node passes
    "FirstPacketNodeProbesFailing", // a node whose probes fail while others are fine
    "FirstPacketNodeTTFPDrift",     // a node whose probes drift while others are fine
    "FirstPacketNodeAgentSuspects", // a node with active agent suspects (warning)
    "FirstPacketNoRecentProbe",     // no probe completed recently
    // The prober cannot measure (issue 31): probes finish but say nothing.
    "FirstPacketNoConclusiveProbe",   // no conclusive probe recently
    "FirstPacketProbesInconclusive",  // inconclusive share, per reason
    "FirstPacketProbeObjectsRefused", // engine faults: RBAC, admission
    "FirstPacketAgentScrapesFailing", // agent scrapes failing
    "FirstPacketProberAbsent",        // prober absent
    "FirstPacketNoLeader",            // no leader
];

/// GitHub's anchor of a Markdown heading: lower case, spaces to `-`, punctuation
/// other than `-` and `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn alerts_follow_the_mixin_conventions_and_link_their_runbooks() {
    let text = mon::read(mon::RULES);
    let runbooks = mon::read(mon::RUNBOOKS);
    let anchors: BTreeSet<String> = runbooks
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(anchor)
        .collect();
    let tests: String = std::fs::read_dir(mon::path(mon::RULE_TESTS))
        .expect("alerts/tests")
        .flatten()
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect();
    let mut names = BTreeSet::new();
    for (group, r) in mon::rules(&text) {
        let Some(name) = field(&r, "alert") else {
            continue;
        };
        assert!(names.insert(name.to_owned()), "{name} twice");
        assert_eq!(group, "firstpacket.alerts", "{name} in group {group}");
        assert!(
            name.starts_with("FirstPacket")
                && name.chars().all(|c| c.is_ascii_alphanumeric())
                && name.chars().nth(11).is_some_and(|c| c.is_ascii_uppercase()),
            "{name}: CamelCase with the FirstPacket prefix"
        );
        let dur = field(&r, "for").unwrap_or_else(|| panic!("{name}: no for:"));
        assert!(
            mon::parse_duration_ms(dur).is_some_and(|ms| ms >= 60_000),
            "{name}: for: {dur} (at least a minute)"
        );
        let labels = r
            .get("labels")
            .and_then(|l| l.as_mapping())
            .expect("labels");
        let sev = labels.get("severity").and_then(|s| s.as_str());
        assert!(
            matches!(sev, Some("critical" | "warning" | "info")),
            "{name}: severity {sev:?}"
        );
        let ann = r
            .get("annotations")
            .and_then(|a| a.as_mapping())
            .unwrap_or_else(|| panic!("{name}: no annotations"));
        for key in ["summary", "description", "runbook_url"] {
            let v = ann.get(key).and_then(|v| v.as_str()).unwrap_or_default();
            assert!(!v.trim().is_empty(), "{name}: no {key}");
        }
        let url = ann.get("runbook_url").and_then(|v| v.as_str()).unwrap();
        let (doc, frag) = url.split_once('#').expect("runbook_url with an anchor");
        assert!(doc.ends_with(mon::RUNBOOKS), "{name}: {url}");
        assert_eq!(frag, anchor(name), "{name}: anchor");
        assert!(
            anchors.contains(frag),
            "{name}: no section ## {name} in {}",
            mon::RUNBOOKS
        );
        // A promtool test shows it silent before `for:` and firing after.
        assert!(
            tests.contains(&format!(
                "alertname: {name}\n        exp_alerts:\n          - exp_labels"
            )),
            "{name}: no promtool test expecting it to fire"
        );
    }
    for want in REQUIRED_ALERTS {
        assert!(names.contains(*want), "missing alert {want}");
    }
    // Every section of the runbooks belongs to an alert, and each tells how to confirm,
    // what to do and when not to page.
    for section in runbooks.split("\n## ").skip(1) {
        let title = section.lines().next().unwrap_or_default().trim();
        assert!(
            names.contains(title),
            "runbook section {title:?} has no alert"
        );
        for part in [
            "**Meaning.**",
            "**Confirm.**",
            "**Act.**",
            "**When not to page.**",
        ] {
            assert!(section.contains(part), "runbook {title}: no {part}");
        }
    }
    // The CNIs' own tools and the known cases are in the runbooks.
    for needle in [
        "calicoctl",
        "felix_int_dataplane_apply_time_seconds",
        "xdpEnabled",
        "cilium-health",
        "kubeproxy_sync_proxy_rules_duration_seconds",
        "vxlanMode",
        "vxlan.calico",
        "calico-node",
    ] {
        assert!(runbooks.contains(needle), "runbooks lack {needle}");
    }
}

#[test]
fn thresholds_the_alerts_read_are_recorded_once() {
    let text = mon::read(mon::RULES);
    let rules = mon::rules(&text);
    let recorded: Vec<String> = rules
        .iter()
        .filter_map(|(_, r)| field(r, "record").map(str::to_owned))
        .collect();
    let thresholds: BTreeSet<&String> = recorded
        .iter()
        .filter(|r| r.starts_with("firstpacket:threshold:"))
        .collect();
    assert!(thresholds.len() >= 5, "{thresholds:?}");
    for t in &thresholds {
        assert_eq!(
            recorded.iter().filter(|r| r == t).count(),
            1,
            "{t} recorded twice"
        );
    }
    for (g, r) in &rules {
        if field(r, "record").is_some_and(|n| n.starts_with("firstpacket:threshold:")) {
            assert_eq!(g, "firstpacket.thresholds");
            let e = field(r, "expr").unwrap().trim();
            assert!(
                e.starts_with("vector(") && e.ends_with(')'),
                "threshold {e}: a constant vector(N), so the Helm chart can set it"
            );
        }
    }
    // Every `firstpacket:…` name an expression reads is recorded.
    for e in mon::rule_exprs(&text) {
        for tok in e.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')) {
            if tok.contains(':') && tok.contains("firstpacket") {
                assert!(
                    recorded.iter().any(|r| r == tok),
                    "{tok} is read but never recorded"
                );
            }
        }
    }
}

#[test]
fn example_alertmanager_config_passes_amtool_and_routes_by_severity() {
    let out = tool("amtool", &["check-config", mon::ALERTMANAGER_EXAMPLE]);
    assert!(out.contains("SUCCESS"), "{out}");
    let cfg = format!("--config.file={}", mon::ALERTMANAGER_EXAMPLE);
    for (labels, receiver) in [
        (
            &["alertname=FirstPacketCrossNodeBroken", "severity=critical"][..],
            "firstpacket-pager",
        ),
        (
            &[
                "alertname=FirstPacketTTFPDrift",
                "severity=warning",
                "kind=cross_node",
            ][..],
            "firstpacket-ticket",
        ),
        (
            &[
                "alertname=FirstPacketNodeAgentSuspects",
                "severity=warning",
                "node=node-2",
            ][..],
            "firstpacket-ticket",
        ),
    ] {
        let verify = format!("--verify.receivers={receiver}");
        let mut args = vec!["config", "routes", "test", &cfg, &verify];
        args.extend_from_slice(labels);
        tool("amtool", &args);
    }
    // The cross-node alert inhibits the per-node ones.
    let doc: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&mon::read(mon::ALERTMANAGER_EXAMPLE)).expect("yaml");
    let inhibits = doc["inhibit_rules"].as_sequence().expect("inhibit_rules");
    assert!(inhibits.iter().any(|r| {
        let s = serde_yaml_ng::to_string(r).unwrap_or_default();
        s.contains("alertname = \"FirstPacketCrossNodeBroken\"")
            && s.contains("FirstPacketNodeProbesFailing")
    }));
}

#[test]
fn dashboard_has_a_stable_uid_a_datasource_variable_rate_interval_and_utc() {
    let dash: Json = serde_json::from_str(&mon::read(mon::DASHBOARD)).expect("dashboard JSON");
    assert_eq!(dash["uid"], "firstpacket-overview");
    assert_eq!(dash["timezone"], "utc");
    let vars = dash["templating"]["list"].as_array().expect("templating");
    assert!(vars.iter().any(|v| v["type"] == "datasource"
        && v["name"] == "datasource"
        && v["query"] == "prometheus"));
    let panels = mon::dashboard_panels(&dash);
    let mut ids = BTreeSet::new();
    for p in &panels {
        let title = p["title"].as_str().unwrap_or_default();
        assert!(!title.is_empty(), "a panel without a title");
        assert!(
            p["description"].as_str().is_some_and(|d| d.len() > 20),
            "{title}: no description"
        );
        assert!(
            ids.insert(p["id"].as_i64().expect("id")),
            "panel id twice: {title}"
        );
        assert_eq!(
            p["datasource"]["uid"], "${datasource}",
            "{title}: datasource"
        );
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no queries");
        for t in targets {
            assert_eq!(
                t["datasource"]["uid"], "${datasource}",
                "{title}: target datasource"
            );
            let e = t["expr"].as_str().expect("expr");
            // Each selector of a firstpacket series is narrowed by the job variable
            // (the thresholds are single series without labels).
            for name in mon::metric_names(e) {
                for (i, _) in e.match_indices(&name) {
                    let rest = &e[i + name.len()..];
                    assert!(
                        rest.starts_with("{job=~\"$job\""),
                        "{title}: {name} without job=~\"$job\": {e}"
                    );
                }
            }
            // Rates and increases over the rate interval (or the whole range, in a table).
            for f in ["rate(", "increase("] {
                for (i, _) in e.match_indices(f) {
                    let rest = &e[i..];
                    let window = rest.find('[').map(|s| &rest[s..]).unwrap_or_default();
                    assert!(
                        window.starts_with("[$__rate_interval]")
                            || window.starts_with("[$__range]"),
                        "{title}: {f} without $__rate_interval: {e}"
                    );
                }
            }
        }
    }
    // The panels the issue asks for.
    let titles: Vec<&str> = panels.iter().filter_map(|p| p["title"].as_str()).collect();
    for want in [
        "TTFP quantiles against the baseline",
        "TTFP heatmap",
        "Results by kind and reason",
        "Per node",
        "Drift ratio",
        "Agent suspects",
        "Probe pod start-up phases (p90)",
        "Lap time",
        "Inconclusive share by reason (10 m)",
        "Refused probe objects",
        "Since the last conclusive probe",
    ] {
        assert!(titles.contains(&want), "no panel {want:?}: {titles:?}");
    }
    assert!(panels.iter().any(|p| p["type"] == "heatmap"));
}

#[test]
fn generated_files_are_fresh() {
    let regenerate = std::env::var("FIRSTPACKET_REGENERATE").is_ok_and(|v| v == "1");
    let mut stale = Vec::new();
    for (path, from, generate) in mon::GENERATED {
        let want = generate(&mon::read(from));
        let target = mon::path(path);
        if regenerate {
            std::fs::create_dir_all(target.parent().expect("parent")).expect("mkdir");
            std::fs::write(&target, &want).unwrap_or_else(|e| panic!("write {path}: {e}"));
            eprintln!("wrote {path}");
            continue;
        }
        let have = std::fs::read_to_string(&target).unwrap_or_default();
        if have != want {
            stale.push(format!("{path} (from {from})"));
        }
    }
    assert!(
        stale.is_empty(),
        "stale generated files: {stale:?}; run `{}`",
        mon::REGENERATE
    );
    // The PrometheusRule's spec is the rule file itself.
    let rule: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&mon::read(mon::GENERATED[0].0)).expect("PrometheusRule");
    assert_eq!(rule["kind"].as_str(), Some("PrometheusRule"));
    assert_eq!(rule["spec"], mon::rules_yaml(&mon::read(mon::RULES)));
    let cm: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&mon::read(mon::GENERATED[2].0)).expect("ConfigMap");
    let embedded: Json =
        serde_json::from_str(cm["data"]["firstpacket.json"].as_str().expect("data")).expect("json");
    let dash: Json = serde_json::from_str(&mon::read(mon::DASHBOARD)).expect("json");
    assert_eq!(embedded, dash);
}

#[test]
fn duration_scaling_divides_every_for_range_and_offset() {
    let text = "  - record: x\n    expr: rate(a[10m]) or (b unless b offset 10m)\n  - alert: Y\n    # for: 1h stays\n    expr: c[1h30m] > 1\n    for: 5m\n";
    assert_eq!(
        mon::scale_durations(text, 30),
        "  - record: x\n    expr: rate(a[20s]) or (b unless b offset 20s)\n  - alert: Y\n    # for: 1h stays\n    expr: c[180s] > 1\n    for: 10s\n"
    );
    // The real file: no duration left unscaled, and promtool accepts the result.
    let scaled = mon::scale_durations(&mon::read(mon::RULES), 30);
    assert!(!scaled.contains("[10m]") && !scaled.contains("for: 10m"));
    let tmp = std::env::temp_dir().join(format!("fp-scaled-rules-{}.yaml", std::process::id()));
    std::fs::write(&tmp, scaled).expect("write");
    let out = tool("promtool", &["check", "rules", tmp.to_str().expect("path")]);
    let _ = std::fs::remove_file(&tmp);
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn metric_names_are_read_from_expressions_not_recording_rules() {
    let names = mon::metric_names(
        "kind:firstpacket_ttfp_seconds:quantile10m > scalar(firstpacket:threshold:x) and rate(firstpacket_probes_total{a=\"b\"}[5m])",
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        vec!["firstpacket_probes_total"]
    );
}

/// The Helm chart's `alerts.runbookURL` default is the document every `runbook_url` of
/// the rule file points into (the template replaces that document, keeping each
/// alert's `#anchor`), so the chart's default output equals the kustomize
/// PrometheusRule's URLs.
#[test]
fn helm_runbook_url_default_is_the_rule_files_runbooks_document() {
    let values: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&mon::read("manifests/helm/firstpacket/values.yaml"))
            .expect("values.yaml");
    let base = values["alerts"]["runbookURL"]
        .as_str()
        .expect("alerts.runbookURL in values.yaml");
    assert!(
        base.ends_with(mon::RUNBOOKS) && !base.contains('#'),
        "{base}"
    );
    let mut alerts = 0;
    for (_, r) in mon::rules(&mon::read(mon::RULES)) {
        let Some(name) = field(&r, "alert") else {
            continue;
        };
        let url = r["annotations"]["runbook_url"].as_str().unwrap_or_default();
        assert_eq!(url, format!("{base}#{}", anchor(name)), "{name}");
        alerts += 1;
    }
    assert!(alerts >= REQUIRED_ALERTS.len());
}

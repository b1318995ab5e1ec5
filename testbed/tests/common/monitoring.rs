//! The monitoring files of the repository — `alerts/firstpacket.rules.yaml`,
//! `alerts/examples/alertmanager.example.yaml` (kept out of `alerts/*.yaml`, so
//! `promtool check rules alerts/*.yaml` reads rule files only),
//! `dashboards/firstpacket.json` — as the tests read them: the metric names their
//! expressions use, the generated copies (PrometheusRule, the Helm chart's rules file,
//! the dashboard ConfigMap), the time-scaled rule file the end-to-end test loads into a
//! real Prometheus, and the dashboard's queries with Grafana's variables substituted.

use super::repo_file;
use serde_json::Value as Json;
use std::collections::BTreeSet;
use std::path::PathBuf;

/// The rule file (the one source of the alerts).
pub const RULES: &str = "alerts/firstpacket.rules.yaml";
/// The promtool unit tests.
pub const RULE_TESTS: &str = "alerts/tests";
/// The runbooks the alerts' `runbook_url` point into.
pub const RUNBOOKS: &str = "alerts/runbooks.md";
/// The example Alertmanager configuration.
pub const ALERTMANAGER_EXAMPLE: &str = "alerts/examples/alertmanager.example.yaml";
/// The Grafana dashboard.
pub const DASHBOARD: &str = "dashboards/firstpacket.json";

/// Turns a source file's text into a generated file's text.
pub type Generator = fn(&str) -> String;

/// Generated files: (path, what it is generated from, generator).
pub const GENERATED: &[(&str, &str, Generator)] = &[
    (
        "manifests/overlays/prometheus-operator/prometheusrule.yaml",
        RULES,
        prometheus_rule,
    ),
    (
        "manifests/helm/firstpacket/files/firstpacket.rules.yaml",
        RULES,
        helm_rules,
    ),
    (
        "dashboards/firstpacket.configmap.yaml",
        DASHBOARD,
        dashboard_configmap,
    ),
    (
        "manifests/helm/firstpacket/files/dashboards/firstpacket.json",
        DASHBOARD,
        helm_dashboard,
    ),
];

/// How to regenerate [`GENERATED`] (the message of the staleness test).
pub const REGENERATE: &str = "FIRSTPACKET_REGENERATE=1 cargo test -p testbed --test alerts";

pub fn read(rel: &str) -> String {
    std::fs::read_to_string(repo_file(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

pub fn path(rel: &str) -> PathBuf {
    repo_file(rel)
}

/// The rule file parsed as YAML.
pub fn rules_yaml(text: &str) -> serde_yaml_ng::Value {
    serde_yaml_ng::from_str(text).unwrap_or_else(|e| panic!("{RULES}: {e}"))
}

/// Every rule of the file: (group name, rule mapping).
pub fn rules(text: &str) -> Vec<(String, serde_yaml_ng::Mapping)> {
    let doc = rules_yaml(text);
    let mut out = Vec::new();
    for g in doc["groups"].as_sequence().expect("groups") {
        let name = g["name"].as_str().expect("group name").to_owned();
        for r in g["rules"].as_sequence().expect("rules") {
            out.push((name.clone(), r.as_mapping().expect("rule").clone()));
        }
    }
    out
}

/// A string field of a rule mapping.
pub fn field<'a>(rule: &'a serde_yaml_ng::Mapping, key: &str) -> Option<&'a str> {
    rule.get(key).and_then(|v| v.as_str())
}

/// The `firstpacket_*` metric names an expression uses (series names as on a
/// `/metrics` page, e.g. `firstpacket_ttfp_seconds_bucket`); recording-rule names
/// (`kind:firstpacket_…:…`, `firstpacket:…`) are not metric names and are skipped.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let b = expr.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let mut out = BTreeSet::new();
    let mut i = 0;
    while i < b.len() {
        if word(b[i]) {
            let start = i;
            while i < b.len() && word(b[i]) {
                i += 1;
            }
            let tok = &expr[start..i];
            if tok.starts_with("firstpacket_") && !tok.contains(':') {
                out.insert(tok.to_owned());
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Every PromQL expression of the rule file.
pub fn rule_exprs(text: &str) -> Vec<String> {
    rules(text)
        .iter()
        .filter_map(|(_, r)| field(r, "expr").map(str::to_owned))
        .collect()
}

/// The dashboard's panels (rows' nested panels included).
pub fn dashboard_panels(dash: &Json) -> Vec<Json> {
    let mut out = Vec::new();
    for p in dash["panels"].as_array().expect("panels") {
        if p["type"] == "row" {
            out.extend(p["panels"].as_array().cloned().unwrap_or_default());
        } else {
            out.push(p.clone());
        }
    }
    out
}

/// Every PromQL expression of the dashboard: panel targets and variable queries.
pub fn dashboard_exprs(dash: &Json) -> Vec<String> {
    let mut out = Vec::new();
    for p in dashboard_panels(dash) {
        for t in p["targets"].as_array().cloned().unwrap_or_default() {
            if let Some(e) = t["expr"].as_str() {
                out.push(e.to_owned());
            }
        }
    }
    for v in dash["templating"]["list"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        if let Some(q) = v["query"]["query"].as_str() {
            out.push(q.to_owned());
        }
    }
    out
}

/// `expr` as Prometheus gets it from Grafana for a range of `range` seconds, a rate
/// interval of `rate_interval` (Grafana: max(step + scrape interval, 4 × scrape
/// interval)) and every dashboard variable at its "All" value (`.*`):
/// `$__rate_interval`, `$__range`, `$__interval`, `$job`, `$kind`, `$node` replaced.
pub fn substitute(expr: &str, rate_interval: &str, range: &str, interval: &str) -> String {
    let mut e = expr
        .replace("$__rate_interval", rate_interval)
        .replace("$__range", range)
        .replace("$__interval", interval);
    for v in ["job", "kind", "node"] {
        e = e
            .replace(&format!("${{{v}}}"), ".*")
            .replace(&format!("${v}"), ".*");
    }
    assert!(!e.contains('$'), "unsubstituted variable in {e}");
    e
}

/// The leading comment block of a file (lines starting with `#`), and the rest.
fn split_header(text: &str) -> (&str, &str) {
    let mut end = 0;
    for line in text.split_inclusive('\n') {
        if line.starts_with('#') {
            end += line.len();
        } else {
            break;
        }
    }
    text.split_at(end)
}

fn generated_header(from: &str) -> String {
    format!("# Generated from {from} by testbed/tests/alerts.rs ({REGENERATE}); do not edit.\n")
}

/// The PrometheusRule (prometheus-operator) of the rule file: its groups, comments
/// included, as `spec`, in namespace `firstpacket`.
pub fn prometheus_rule(rules_text: &str) -> String {
    let (_, body) = split_header(rules_text);
    let mut out = generated_header(RULES);
    out.push_str(
        "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata:\n  name: firstpacket\n  namespace: firstpacket\n  labels:\n    app.kubernetes.io/name: firstpacket\n    app.kubernetes.io/component: alerts\nspec:\n",
    );
    for line in body.lines() {
        if line.is_empty() {
            out.push('\n');
        } else {
            out.push_str("  ");
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The Helm chart's copy of the rule file (a chart cannot read files outside its
/// directory): the groups unchanged, under a generated-file header.
pub fn helm_rules(rules_text: &str) -> String {
    let (_, body) = split_header(rules_text);
    generated_header(RULES) + body
}

/// A ConfigMap carrying the dashboard for Grafana's dashboard sidecar (which loads
/// ConfigMaps labelled `grafana_dashboard`).
pub fn dashboard_configmap(json: &str) -> String {
    let mut out = generated_header(DASHBOARD);
    out.push_str(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: firstpacket-dashboard\n  namespace: firstpacket\n  labels:\n    app.kubernetes.io/name: firstpacket\n    app.kubernetes.io/component: dashboard\n    grafana_dashboard: \"1\"\ndata:\n  firstpacket.json: |\n",
    );
    for line in json.lines() {
        out.push_str("    ");
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The Helm chart's copy of the dashboard (JSON has no comments: an identical copy;
/// the staleness test says where it comes from).
pub fn helm_dashboard(json: &str) -> String {
    json.to_owned()
}

/// A Prometheus duration (`90s`, `10m`, `1h30m`, `500ms`) in milliseconds; `None` if
/// `s` is not one.
pub fn parse_duration_ms(s: &str) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let mut total = 0u64;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, ms) = [
            ("ms", 1),
            ("s", 1_000),
            ("m", 60_000),
            ("h", 3_600_000),
            ("d", 86_400_000),
            ("w", 604_800_000),
            ("y", 31_536_000_000),
        ]
        .into_iter()
        .find(|(u, _)| rest.starts_with(u))?;
        total += n * ms;
        rest = &rest[unit.len()..];
    }
    Some(total)
}

fn format_ms(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// The rule file with time compressed by `factor` for a test that cannot wait minutes —
/// a mechanical substitution and nothing else: every duration of a `for:` field, of a
/// range selector `[D]` and of an `offset D` is divided by `factor` (rounded down to a
/// millisecond). Thresholds, expressions and labels stay as they are. Panics on a
/// `for:`, `[…]` or `offset` whose duration it cannot read, so nothing is left unscaled.
pub fn scale_durations(rules_text: &str, factor: u64) -> String {
    let scale = |d: &str| -> String {
        let ms = parse_duration_ms(d).unwrap_or_else(|| panic!("not a duration: {d:?}"));
        format_ms(ms / factor)
    };
    let mut out = String::new();
    for line in rules_text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if trimmed.starts_with('#') {
            out.push_str(line);
            continue;
        }
        if let Some(d) = trimmed.strip_prefix("for: ") {
            let indent = &line[..line.len() - trimmed.len()];
            out.push_str(&format!("{indent}for: {}\n", scale(d.trim())));
            continue;
        }
        // Range selectors and offsets inside expressions.
        let mut rest = line;
        while !rest.is_empty() {
            let next_bracket = rest.find('[');
            let next_offset = rest.find("offset ");
            match (next_bracket, next_offset) {
                (Some(b), o) if o.is_none_or(|o| b < o) => {
                    let close = rest[b..].find(']').map(|c| b + c).expect("closing ]");
                    out.push_str(&rest[..=b]);
                    out.push_str(&scale(&rest[b + 1..close]));
                    out.push(']');
                    rest = &rest[close + 1..];
                }
                (_, Some(o)) => {
                    let start = o + "offset ".len();
                    let len = rest[start..]
                        .find(|c: char| !c.is_ascii_alphanumeric())
                        .unwrap_or(rest.len() - start);
                    out.push_str(&rest[..start]);
                    out.push_str(&scale(&rest[start..start + len]));
                    rest = &rest[start + len..];
                }
                _ => {
                    out.push_str(rest);
                    rest = "";
                }
            }
        }
    }
    out
}

//! networking.k8s.io/v1 NetworkPolicy registry logic: the API defaults and the
//! validation kube-apiserver applies before it stores a policy. The testbed only stores
//! policies; enforcing them is the CNI agent's business.
//!
//! Sources (Kubernetes v1.32): `pkg/apis/networking/v1/defaults.go`
//! (`SetDefaults_NetworkPolicy`, `SetDefaults_NetworkPolicyPort`),
//! `pkg/apis/networking/validation/validation.go` (`ValidateNetworkPolicySpec`,
//! `ValidateNetworkPolicyPort`, `ValidateNetworkPolicyPeer`, `ValidateIPBlock`,
//! `ValidateNetworkPolicyUpdate`), `pkg/registry/networking/networkpolicy/strategy.go`
//! (generation), k8s.io/apimachinery `pkg/apis/meta/v1/validation` (label selectors) and
//! `pkg/util/validation` (qualified names, label values, port names and numbers, CIDRs).
//! Messages are those of k8s.io/apimachinery `pkg/util/validation/field` errors.

use super::service::Cause;
use super::{ApiError, Kind};
use serde_json::{json, Value};
use std::net::IpAddr;

fn cause(reason: &str, field: &str, message: String) -> Cause {
    (reason.into(), field.into(), message)
}

fn invalid(field: &str, value: &Value, detail: &str) -> Cause {
    cause(
        "FieldValueInvalid",
        field,
        format!("Invalid value: {value}: {detail}"),
    )
}

/// The API defaults of a NetworkPolicy, in place: `spec` and `spec.podSelector` `{}` when
/// absent (the Go types always serialise them); `spec.policyTypes` `["Ingress"]`, plus
/// `"Egress"` when `spec.egress` has rules, when it is absent or empty; every
/// `ports[].protocol` `TCP` when absent.
pub(crate) fn default_network_policy(obj: &mut Value) {
    if !obj["spec"].is_object() {
        obj["spec"] = json!({});
    }
    let spec = &mut obj["spec"];
    if !spec["podSelector"].is_object() {
        spec["podSelector"] = json!({});
    }
    let no_types = spec["policyTypes"].as_array().is_none_or(Vec::is_empty);
    if no_types {
        let egress = spec["egress"].as_array().is_some_and(|e| !e.is_empty());
        spec["policyTypes"] = if egress {
            json!(["Ingress", "Egress"])
        } else {
            json!(["Ingress"])
        };
    }
    for dir in ["ingress", "egress"] {
        for rule in spec[dir].as_array_mut().into_iter().flatten() {
            for port in rule["ports"].as_array_mut().into_iter().flatten() {
                if let Some(p) = port.as_object_mut() {
                    p.entry("protocol").or_insert(json!("TCP"));
                }
            }
        }
    }
}

/// 400 BadRequest when `obj` (before [`default_network_policy`], which would paper over
/// it) does not decode as a NetworkPolicy (a field of the wrong JSON type, e.g.
/// `policyTypes: "Ingress"`), as kube-apiserver's decoder refuses it (`NetworkPolicy in
/// version "v1" cannot be handled as a NetworkPolicy: …`; the detail here is serde's,
/// not Go's).
pub(crate) fn check_decodes(obj: &Value) -> Result<(), ApiError> {
    let mut typed = obj.clone();
    // Older k8s-openapi versions require `podSelector`; the API defaults it.
    if typed["spec"].is_object() && typed["spec"]["podSelector"].is_null() {
        typed["spec"]["podSelector"] = json!({});
    }
    serde_json::from_value::<k8s_openapi::api::networking::v1::NetworkPolicy>(typed)
        .map(|_| ())
        .map_err(|e| {
            ApiError::bad_request(format!(
                "{} in version \"v1\" cannot be handled as a {}: {e}",
                Kind::NetworkPolicy.kind_name(),
                Kind::NetworkPolicy.kind_name()
            ))
        })
}

/// Every `ipBlock.cidr` and `ipBlock.except[]` of `obj`'s rules: on update these stay
/// valid even when they would no longer pass ([`validate`]'s `keep_cidrs`, as
/// `ValidateNetworkPolicyUpdate` does).
pub(crate) fn cidrs(obj: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for (dir, peers) in [("ingress", "from"), ("egress", "to")] {
        for rule in obj["spec"][dir].as_array().into_iter().flatten() {
            for peer in rule[peers].as_array().into_iter().flatten() {
                let b = &peer["ipBlock"];
                out.extend(b["cidr"].as_str().map(str::to_string));
                out.extend(
                    b["except"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|e| e.as_str().map(str::to_string)),
                );
            }
        }
    }
    out
}

/// `ValidateNetworkPolicySpec` on a defaulted policy: the pod selector and every peer's
/// pod/namespace selector (operators `In`/`NotIn` with values, `Exists`/`DoesNotExist`
/// without; keys qualified names; `matchLabels` values label values); each peer one of
/// podSelector/namespaceSelector/ipBlock (ipBlock alone); `ipBlock.cidr` required and a
/// CIDR, each `except` a CIDR strictly inside it; ports: `protocol` TCP, UDP or SCTP,
/// `port` 1–65535 or an IANA port name, `endPort` only with a numeric `port` and not
/// below it; `policyTypes` at most two, each `Ingress` or `Egress`. `keep_cidrs` are
/// CIDR strings of the stored object that pass unchecked (update). Returns the causes
/// for a 422 Invalid, empty when the policy is valid.
pub(crate) fn validate(obj: &Value, keep_cidrs: &[String]) -> Vec<Cause> {
    let spec = &obj["spec"];
    let mut causes = label_selector(&spec["podSelector"], "spec.podSelector");
    for (dir, peers) in [("ingress", "from"), ("egress", "to")] {
        for (i, rule) in spec[dir].as_array().into_iter().flatten().enumerate() {
            let rule_path = format!("spec.{dir}[{i}]");
            for (j, port) in rule["ports"].as_array().into_iter().flatten().enumerate() {
                causes.extend(network_policy_port(
                    port,
                    &format!("{rule_path}.ports[{j}]"),
                ));
            }
            for (j, peer) in rule[peers].as_array().into_iter().flatten().enumerate() {
                causes.extend(network_policy_peer(
                    peer,
                    &format!("{rule_path}.{peers}[{j}]"),
                    keep_cidrs,
                ));
            }
        }
    }
    let types = spec["policyTypes"].as_array().cloned().unwrap_or_default();
    if types.len() > 2 {
        let shown: Vec<String> = types.iter().map(Value::to_string).collect();
        causes.push(cause(
            "FieldValueInvalid",
            "spec.policyTypes",
            format!(
                "Invalid value: []networking.PolicyType{{{}}}: may not specify more than two policyTypes",
                shown.join(", ")
            ),
        ));
        return causes;
    }
    for (i, t) in types.iter().enumerate() {
        if t != "Ingress" && t != "Egress" {
            causes.push(cause(
                "FieldValueNotSupported",
                &format!("spec.policyTypes[{i}]"),
                format!("Unsupported value: {t}: supported values: \"Ingress\", \"Egress\""),
            ));
        }
    }
    causes
}

/// `ValidateNetworkPolicyPort`.
fn network_policy_port(port: &Value, path: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    if let Some(proto) = port["protocol"].as_str() {
        if !matches!(proto, "TCP" | "UDP" | "SCTP") {
            causes.push(cause(
                "FieldValueNotSupported",
                &format!("{path}.protocol"),
                format!(
                    "Unsupported value: \"{proto}\": supported values: \"TCP\", \"UDP\", \"SCTP\""
                ),
            ));
        }
    }
    let end = &port["endPort"];
    match &port["port"] {
        Value::Null => {
            if !end.is_null() {
                causes.push(invalid(
                    &format!("{path}.endPort"),
                    end,
                    "may not be specified when `port` is not specified",
                ));
            }
        }
        Value::String(name) => {
            if !end.is_null() {
                causes.push(invalid(
                    &format!("{path}.endPort"),
                    end,
                    "may not be specified when `port` is non-numeric",
                ));
            }
            for msg in port_name_errors(name) {
                causes.push(invalid(&format!("{path}.port"), &port["port"], &msg));
            }
        }
        num => {
            let p = num.as_i64().unwrap_or(0);
            if !(1..=65535).contains(&p) {
                causes.push(invalid(
                    &format!("{path}.port"),
                    num,
                    "must be between 1 and 65535, inclusive",
                ));
            }
            if let Some(e) = end.as_i64() {
                if e < p {
                    causes.push(invalid(
                        &format!("{path}.endPort"),
                        end,
                        "must be greater than or equal to `port`",
                    ));
                }
                if !(1..=65535).contains(&e) {
                    causes.push(invalid(
                        &format!("{path}.endPort"),
                        end,
                        "must be between 1 and 65535, inclusive",
                    ));
                }
            }
        }
    }
    causes
}

/// `ValidateNetworkPolicyPeer`.
fn network_policy_peer(peer: &Value, path: &str, keep_cidrs: &[String]) -> Vec<Cause> {
    let mut causes = Vec::new();
    let mut kinds = 0;
    for sel in ["podSelector", "namespaceSelector"] {
        if peer[sel].is_object() {
            kinds += 1;
            causes.extend(label_selector(&peer[sel], &format!("{path}.{sel}")));
        }
    }
    let block = &peer["ipBlock"];
    if block.is_object() {
        kinds += 1;
        causes.extend(ip_block(block, &format!("{path}.ipBlock"), keep_cidrs));
    }
    if kinds == 0 {
        causes.push(cause(
            "FieldValueRequired",
            path,
            "Required value: must specify a peer".into(),
        ));
    } else if kinds > 1 && block.is_object() {
        causes.push(cause(
            "FieldValueForbidden",
            path,
            "Forbidden: may not specify both ipBlock and another peer".into(),
        ));
    }
    causes
}

/// A CIDR as Go's `net.ParseCIDR` reads it: an IPv4 or IPv6 address, `/`, a prefix
/// length within the family's width. Returns the network address (host bits cleared),
/// the prefix length and the family's width.
fn parse_cidr(s: &str) -> Option<(u128, u32, u32)> {
    let (addr, len) = s.split_once('/')?;
    if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) || len.len() > 3 {
        return None;
    }
    let len: u32 = len.parse().ok()?;
    let (bits, width) = match addr.parse::<IpAddr>().ok()? {
        IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
        IpAddr::V6(a) => (u128::from(a), 128),
    };
    if len > width {
        return None;
    }
    let host = if len == width {
        0
    } else {
        (1u128 << (width - len)) - 1
    };
    Some((bits & !host, len, width))
}

/// `ValidateIPBlock` (legacy CIDR parsing; the StrictIPCIDRValidation gate is off in
/// v1.32).
fn ip_block(block: &Value, path: &str, keep_cidrs: &[String]) -> Vec<Cause> {
    const NOT_CIDR: &str = "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)";
    let mut causes = Vec::new();
    let cidr = block["cidr"].as_str().unwrap_or("");
    if cidr.is_empty() {
        causes.push(cause(
            "FieldValueRequired",
            &format!("{path}.cidr"),
            "Required value".into(),
        ));
        return causes;
    }
    let kept = |s: &str| keep_cidrs.iter().any(|k| k == s);
    let Some((net, len, width)) = parse_cidr(cidr) else {
        if !kept(cidr) {
            causes.push(invalid(&format!("{path}.cidr"), &json!(cidr), NOT_CIDR));
        }
        return causes;
    };
    for (i, e) in block["except"].as_array().into_iter().flatten().enumerate() {
        let field = format!("{path}.except[{i}]");
        let text = e.as_str().unwrap_or("");
        let Some((enet, elen, ewidth)) = parse_cidr(text) else {
            if !kept(text) {
                causes.push(invalid(&field, e, NOT_CIDR));
            }
            continue;
        };
        let host = if len == width {
            0
        } else {
            (1u128 << (width - len)) - 1
        };
        let inside = ewidth == width && (enet & !host) == net;
        if !inside || len >= elen {
            causes.push(invalid(&field, e, "must be a strict subset of `cidr`"));
        }
    }
    causes
}

/// `metav1validation.ValidateLabelSelector` (no invalid values allowed).
fn label_selector(sel: &Value, path: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    for (k, v) in sel["matchLabels"].as_object().into_iter().flatten() {
        let labels = format!("{path}.matchLabels");
        for msg in qualified_name_errors(k) {
            causes.push(invalid(&labels, &json!(k), &msg));
        }
        for msg in label_value_errors(v.as_str().unwrap_or("")) {
            causes.push(invalid(&labels, v, &msg));
        }
    }
    for (i, e) in sel["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let p = format!("{path}.matchExpressions[{i}]");
        let values = e["values"].as_array().map_or(0, Vec::len);
        match e["operator"].as_str().unwrap_or("") {
            "In" | "NotIn" if values == 0 => causes.push(cause(
                "FieldValueRequired",
                &format!("{p}.values"),
                "Required value: must be specified when `operator` is 'In' or 'NotIn'".into(),
            )),
            "Exists" | "DoesNotExist" if values > 0 => causes.push(cause(
                "FieldValueForbidden",
                &format!("{p}.values"),
                "Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
                    .into(),
            )),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            _ => causes.push(invalid(
                &format!("{p}.operator"),
                &json!(e["operator"].as_str().unwrap_or("")),
                "not a valid selector operator",
            )),
        }
        let key = e["key"].as_str().unwrap_or("");
        for msg in qualified_name_errors(key) {
            causes.push(invalid(&format!("{p}.key"), &json!(key), &msg));
        }
        for (j, v) in e["values"].as_array().into_iter().flatten().enumerate() {
            for msg in label_value_errors(v.as_str().unwrap_or("")) {
                causes.push(invalid(&format!("{p}.values[{j}]"), v, &msg));
            }
        }
    }
    causes
}

const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`.
fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// `validation.IsQualifiedName`: `[prefix/]name`, the prefix a DNS subdomain, the name
/// at most 63 characters of the qualified-name alphabet.
fn qualified_name_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = s.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                if prefix.len() > 253 {
                    errs.push("prefix part must be no more than 253 characters".to_string());
                }
                if !is_dns_subdomain(prefix) {
                    errs.push("prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".to_string());
                }
            }
            *name
        }
        _ => {
            return vec![format!("a qualified name {QUALIFIED_NAME_MSG} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')")];
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 characters".to_string());
    }
    if !is_qualified_name_part(name) {
        errs.push(format!("name part {QUALIFIED_NAME_MSG}"));
    }
    errs
}

fn is_dns_subdomain(s: &str) -> bool {
    s.split('.').all(|l| {
        !l.is_empty()
            && l.bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    })
}

/// `validation.IsValidLabelValue`: empty, or at most 63 characters of the
/// qualified-name alphabet.
fn label_value_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !s.is_empty() && !is_qualified_name_part(s) {
        errs.push("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')".to_string());
    }
    errs
}

/// `validation.IsValidPortName`: an IANA service name.
fn port_name_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 15 {
        errs.push("must be no more than 15 characters".to_string());
    }
    if s.is_empty()
        || !s
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
    {
        errs.push(
            "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".to_string(),
        );
    }
    if !s.bytes().any(|c| c.is_ascii_lowercase()) {
        errs.push("must contain at least one letter (a-z)".to_string());
    }
    if s.contains("--") {
        errs.push("must not contain consecutive hyphens".to_string());
    }
    if s.starts_with('-') || s.ends_with('-') {
        errs.push("must not begin or end with a hyphen".to_string());
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaulted(spec: Value) -> Value {
        let mut p = json!({"metadata": {"name": "p", "namespace": "default"}, "spec": spec});
        default_network_policy(&mut p);
        p
    }

    fn fields(causes: &[Cause]) -> Vec<(&str, &str)> {
        causes
            .iter()
            .map(|(_, f, m)| (f.as_str(), m.as_str()))
            .collect()
    }

    #[test]
    fn defaults_fill_pod_selector_policy_types_and_port_protocols() {
        let p = defaulted(json!({}));
        assert_eq!(p["spec"]["podSelector"], json!({}));
        assert_eq!(p["spec"]["policyTypes"], json!(["Ingress"]));
        let p = defaulted(json!({"egress": [{"ports": [{"port": 53}]}]}));
        assert_eq!(p["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
        assert_eq!(p["spec"]["egress"][0]["ports"][0]["protocol"], "TCP");
        let p = defaulted(json!({"policyTypes": ["Egress"], "egress": []}));
        assert_eq!(p["spec"]["policyTypes"], json!(["Egress"]));
        assert!(validate(&p, &[]).is_empty());
    }

    #[test]
    fn a_deny_all_and_a_namespace_selecting_policy_are_valid() {
        let deny = defaulted(json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}));
        assert_eq!(validate(&deny, &[]), vec![]);
        let allow = defaulted(json!({
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "firstpacket"}},
            "ingress": [{"from": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "probe"}},
                 "podSelector": {"matchExpressions": [{"key": "role", "operator": "In", "values": ["src"]}]}},
                {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
              "ports": [{"port": 8080, "endPort": 8090}, {"port": "http", "protocol": "UDP"}]}]}));
        assert_eq!(validate(&allow, &[]), vec![]);
    }

    #[test]
    fn bad_policy_types_protocols_ports_and_peers_name_their_fields() {
        let p = defaulted(json!({
            "policyTypes": ["Ingress", "Sideways"],
            "ingress": [{"from": [{}], "ports": [{"port": 70000, "protocol": "ICMP"},
                                                 {"port": "metrics-http-port", "endPort": 9}]}]}));
        let c = validate(&p, &[]);
        assert_eq!(
            fields(&c),
            [
                (
                    "spec.ingress[0].ports[0].protocol",
                    "Unsupported value: \"ICMP\": supported values: \"TCP\", \"UDP\", \"SCTP\""
                ),
                (
                    "spec.ingress[0].ports[0].port",
                    "Invalid value: 70000: must be between 1 and 65535, inclusive"
                ),
                (
                    "spec.ingress[0].ports[1].endPort",
                    "Invalid value: 9: may not be specified when `port` is non-numeric"
                ),
                (
                    "spec.ingress[0].ports[1].port",
                    "Invalid value: \"metrics-http-port\": must be no more than 15 characters"
                ),
                (
                    "spec.ingress[0].from[0]",
                    "Required value: must specify a peer"
                ),
                (
                    "spec.policyTypes[1]",
                    "Unsupported value: \"Sideways\": supported values: \"Ingress\", \"Egress\""
                ),
            ]
        );
        assert_eq!(c[0].0, "FieldValueNotSupported");
        assert_eq!(c[4].0, "FieldValueRequired");
        let three = defaulted(json!({"policyTypes": ["Ingress", "Egress", "Ingress"]}));
        assert_eq!(
            fields(&validate(&three, &[])),
            [("spec.policyTypes", "Invalid value: []networking.PolicyType{\"Ingress\", \"Egress\", \"Ingress\"}: may not specify more than two policyTypes")]
        );
    }

    #[test]
    fn ip_blocks_need_a_cidr_and_strict_subsets_and_stand_alone() {
        let p = defaulted(json!({"egress": [{"to": [
            {"ipBlock": {"cidr": "10.0.0.0/33"}},
            {"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.0.0/16", "10.2.0.0/24", "10.0.1.0/24", "nope"]}},
            {"ipBlock": {}},
            {"ipBlock": {"cidr": "fd00::/8"}, "podSelector": {}}]}]}));
        let c = validate(&p, &[]);
        assert_eq!(
            fields(&c),
            [
                ("spec.egress[0].to[0].ipBlock.cidr", "Invalid value: \"10.0.0.0/33\": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"),
                ("spec.egress[0].to[1].ipBlock.except[0]", "Invalid value: \"10.0.0.0/16\": must be a strict subset of `cidr`"),
                ("spec.egress[0].to[1].ipBlock.except[1]", "Invalid value: \"10.2.0.0/24\": must be a strict subset of `cidr`"),
                ("spec.egress[0].to[1].ipBlock.except[3]", "Invalid value: \"nope\": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"),
                ("spec.egress[0].to[2].ipBlock.cidr", "Required value"),
                ("spec.egress[0].to[3]", "Forbidden: may not specify both ipBlock and another peer"),
            ]
        );
        // On update a CIDR the stored policy already had is not checked again.
        let old = json!({"spec": {"egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/33"}}]}]}});
        let p = defaulted(old["spec"].clone());
        assert!(validate(&p, &cidrs(&old)).is_empty());
    }

    #[test]
    fn selectors_check_operators_values_and_keys() {
        let p = defaulted(json!({"podSelector": {
            "matchLabels": {"bad key": "ok", "app": "-bad"},
            "matchExpressions": [
                {"key": "a", "operator": "In"},
                {"key": "b", "operator": "Exists", "values": ["x"]},
                {"key": "c", "operator": "Near", "values": ["x"]}]}}));
        let c = validate(&p, &[]);
        let labels: Vec<&str> = c
            .iter()
            .filter(|x| x.1 == "spec.podSelector.matchLabels")
            .map(|x| x.2.as_str())
            .collect();
        assert_eq!(labels.len(), 2, "{c:?}");
        assert!(
            labels
                .iter()
                .any(|m| m
                    .starts_with("Invalid value: \"-bad\": a valid label must be an empty string")),
            "{labels:?}"
        );
        assert!(
            labels
                .iter()
                .any(|m| m.starts_with("Invalid value: \"bad key\": name part must consist")),
            "{labels:?}"
        );
        assert_eq!(
            fields(&c[2..]),
            [
                (
                    "spec.podSelector.matchExpressions[0].values",
                    "Required value: must be specified when `operator` is 'In' or 'NotIn'"
                ),
                (
                    "spec.podSelector.matchExpressions[1].values",
                    "Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
                ),
                (
                    "spec.podSelector.matchExpressions[2].operator",
                    "Invalid value: \"Near\": not a valid selector operator"
                ),
            ]
        );
    }

    #[test]
    fn cidrs_parse_like_go() {
        assert_eq!(parse_cidr("10.1.2.3/16"), Some((0x0a01_0000, 16, 32)));
        assert_eq!(parse_cidr("0.0.0.0/0"), Some((0, 0, 32)));
        assert!(parse_cidr("fd00::/8").is_some());
        for bad in [
            "10.0.0.0",
            "10.0.0.0/",
            "10.0.0.0/33",
            "fd00::/129",
            "x/8",
            "10.0.0.0/+8",
        ] {
            assert_eq!(parse_cidr(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_field_of_the_wrong_type_does_not_decode() {
        let p = json!({"metadata": {"name": "p"}, "spec": {"policyTypes": "Ingress"}});
        let e = check_decodes(&p).unwrap_err();
        assert_eq!(e.code, 400);
        assert!(
            e.message.starts_with(
                "NetworkPolicy in version \"v1\" cannot be handled as a NetworkPolicy: "
            ),
            "{}",
            e.message
        );
        assert!(check_decodes(&json!({"metadata": {"name": "p"}, "spec": {}})).is_ok());
    }
}

//! Label and field selectors as kube-apiserver parses them
//! (k8s.io/apimachinery `pkg/labels/selector.go`, `pkg/fields/selector.go`).

use super::{ApiError, Kind};
use serde_json::Value;

/// One label requirement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LabelReq {
    /// `k=v`, `k==v`, `k in (a,b)`: the label exists with one of the values.
    In(String, Vec<String>),
    /// `k!=v`, `k notin (a,b)`: the label is absent or has none of the values.
    NotIn(String, Vec<String>),
    /// `k`: the label exists.
    Exists(String),
    /// `!k`: the label does not exist.
    DoesNotExist(String),
}

/// A parsed label selector: all requirements must hold (AND). Empty matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector(pub Vec<LabelReq>);

fn bad_label(s: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!(
        "unable to parse requirement: {why} (in selector \"{s}\")"
    ))
}

/// Splits at commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c)
            }
            ')' => {
                depth -= 1;
                cur.push(c)
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out
}

fn parse_set(rest: &str, whole: &str) -> Result<Vec<String>, ApiError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| bad_label(whole, "expected a set in parentheses"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

/// Whether `s` is a label name part: 1–63 characters, alphanumerics, `-`, `_`, `.`,
/// starting and ending with an alphanumeric (apimachinery `validation.IsQualifiedName`).
fn is_name_part(s: &str) -> bool {
    let ok_ends = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    !s.is_empty()
        && s.len() <= 63
        && ok_ends(s.chars().next())
        && ok_ends(s.chars().last())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// Whether `s` is a DNS-1123 subdomain (a label key's optional prefix): ≤ 253
/// characters, lowercase alphanumerics, `-` and `.`, alphanumeric at both ends.
fn is_dns_subdomain(s: &str) -> bool {
    let ok_ends = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    !s.is_empty()
        && s.len() <= 253
        && ok_ends(s.chars().next())
        && ok_ends(s.chars().last())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-.".contains(c))
}

/// Checks a label key (`[prefix/]name`) as kube-apiserver does; the error text follows
/// apimachinery's `validation.IsQualifiedName` messages.
fn check_key(whole: &str, key: &str) -> Result<(), ApiError> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if prefix.is_some_and(|p| !is_dns_subdomain(p)) {
        return Err(bad_label(
            whole,
            &format!("key: Invalid value: \"{key}\": prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"),
        ));
    }
    if !is_name_part(name) {
        return Err(bad_label(
            whole,
            &format!("key: Invalid value: \"{key}\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"),
        ));
    }
    Ok(())
}

/// Checks a label value (empty, or a name part) as kube-apiserver does
/// (apimachinery `validation.IsValidLabelValue`).
fn check_value(whole: &str, key: &str, i: usize, value: &str) -> Result<(), ApiError> {
    if value.is_empty() || is_name_part(value) {
        return Ok(());
    }
    Err(bad_label(
        whole,
        &format!("values[{i}][{key}]: Invalid value: \"{value}\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"),
    ))
}

impl LabelSelector {
    /// Parses `labelSelector` syntax: comma-joined `k=v`, `k==v`, `k!=v`,
    /// `k in (a,b)`, `k notin (a,b)`, `k`, `!k`; keys and values must be valid label
    /// syntax. Errors: 400 BadRequest ("unable to parse requirement: …").
    pub fn parse(s: &str) -> Result<LabelSelector, ApiError> {
        let sel = Self::parse_terms(s)?;
        for r in &sel.0 {
            match r {
                LabelReq::In(k, vs) | LabelReq::NotIn(k, vs) => {
                    check_key(s, k)?;
                    for (i, v) in vs.iter().enumerate() {
                        check_value(s, k, i, v)?;
                    }
                }
                LabelReq::Exists(k) | LabelReq::DoesNotExist(k) => check_key(s, k)?,
            }
        }
        Ok(sel)
    }

    fn parse_terms(s: &str) -> Result<LabelSelector, ApiError> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(LabelSelector(reqs));
        }
        for term in split_top(s) {
            let t = term.trim();
            if t.is_empty() {
                return Err(bad_label(s, "empty requirement"));
            }
            if let Some(k) = t.strip_prefix('!') {
                reqs.push(LabelReq::DoesNotExist(k.trim().to_string()));
            } else if let Some((k, v)) = t.split_once("!=") {
                reqs.push(LabelReq::NotIn(k.trim().into(), vec![v.trim().into()]));
            } else if let Some((k, v)) = t.split_once("==") {
                reqs.push(LabelReq::In(k.trim().into(), vec![v.trim().into()]));
            } else if let Some((k, v)) = t.split_once('=') {
                reqs.push(LabelReq::In(k.trim().into(), vec![v.trim().into()]));
            } else if let Some(idx) = t.find(" notin ").or_else(|| t.find(" notin(")) {
                let (k, rest) = t.split_at(idx);
                let rest = rest.trim_start().trim_start_matches("notin");
                reqs.push(LabelReq::NotIn(k.trim().into(), parse_set(rest, s)?));
            } else if let Some(idx) = t.find(" in ").or_else(|| t.find(" in(")) {
                let (k, rest) = t.split_at(idx);
                let rest = rest.trim_start().trim_start_matches("in");
                reqs.push(LabelReq::In(k.trim().into(), parse_set(rest, s)?));
            } else if t.contains(|c: char| c.is_whitespace() || "()<>".contains(c)) {
                return Err(bad_label(s, "found unexpected token"));
            } else {
                reqs.push(LabelReq::Exists(t.to_string()));
            }
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether the `metadata.labels` object `labels` (or `null`) satisfies every
    /// requirement.
    pub fn matches(&self, labels: &Value) -> bool {
        self.0.iter().all(|r| {
            let get = |k: &str| labels.get(k).and_then(Value::as_str);
            match r {
                LabelReq::In(k, vs) => get(k).is_some_and(|v| vs.iter().any(|x| x == v)),
                LabelReq::NotIn(k, vs) => get(k).is_none_or(|v| vs.iter().all(|x| x != v)),
                LabelReq::Exists(k) => labels.get(k).is_some(),
                LabelReq::DoesNotExist(k) => labels.get(k).is_none(),
            }
        })
    }

    /// Whether there are no requirements.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// One field requirement: `field` equals (`=`/`==`) or differs from (`!=`) `value`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldReq {
    /// Field path, e.g. `spec.nodeName`.
    pub field: String,
    /// `true` for `!=`.
    pub negate: bool,
    /// Compared value (a missing field is `""`).
    pub value: String,
}

/// A parsed field selector (AND of requirements). Empty matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector(pub Vec<FieldReq>);

/// Field labels each kind supports (k8s.io/kubernetes `pkg/registry/core/*/strategy.go`
/// `ToSelectableFields` and `pkg/apis/core/v1/conversion.go`); others are a 400.
fn supported_fields(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Pod => &[
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        Kind::Node => &["metadata.name", "spec.unschedulable"],
        Kind::Namespace => &["metadata.name", "status.phase"],
        Kind::Event => &[
            "metadata.name",
            "metadata.namespace",
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        Kind::EventsV1 => &[
            "metadata.name",
            "metadata.namespace",
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "reason",
            "reportingController",
            "type",
        ],
        _ => &["metadata.name", "metadata.namespace"],
    }
}

impl FieldSelector {
    /// Parses `fieldSelector` syntax for `kind`: comma-joined `f=v`, `f==v`, `f!=v`.
    /// Errors: 400 BadRequest for bad syntax or an unsupported field
    /// (`field label not supported: f`).
    pub fn parse(s: &str, kind: Kind) -> Result<FieldSelector, ApiError> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(FieldSelector(reqs));
        }
        for t in s.split(',') {
            let t = t.trim();
            let (field, negate, value) = if let Some((f, v)) = t.split_once("!=") {
                (f, true, v)
            } else if let Some((f, v)) = t.split_once("==") {
                (f, false, v)
            } else if let Some((f, v)) = t.split_once('=') {
                (f, false, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{t}'"
                )));
            };
            let field = field.trim();
            if !supported_fields(kind).contains(&field) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            reqs.push(FieldReq {
                field: field.to_string(),
                negate,
                value: value.trim().to_string(),
            });
        }
        Ok(FieldSelector(reqs))
    }

    /// Whether `obj` satisfies every requirement. A missing field compares as `""`;
    /// booleans as `true`/`false`; Event `source` is `source.component`.
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|r| {
            let v = field_value(obj, &r.field);
            (v == r.value) != r.negate
        })
    }

    /// Whether there are no requirements.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The string value of a dotted field path in `obj` (`""` when missing).
pub fn field_value(obj: &Value, path: &str) -> String {
    let path = if path == "source" {
        "source.component"
    } else {
        path
    };
    let mut cur = obj;
    for p in path.split('.') {
        cur = &cur[p];
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null if path == "spec.unschedulable" || path == "spec.hostNetwork" => {
            "false".to_string()
        }
        _ => String::new(),
    }
}

/// Label and field selector together, as one watch or list filters.
#[derive(Clone, Debug, Default)]
pub struct Selector {
    /// `labelSelector`.
    pub labels: LabelSelector,
    /// `fieldSelector`.
    pub fields: FieldSelector,
}

impl Selector {
    /// Whether `obj` matches both selectors.
    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(&obj["metadata"]["labels"]) && self.fields.matches(obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selector_set_based_and_equality_terms_all_apply() {
        let s = LabelSelector::parse("app in (a, b),tier!=db,env,!legacy,x==1").unwrap();
        assert_eq!(s.0.len(), 5);
        assert!(s.matches(&json!({"app":"a","env":"p","x":"1"})));
        assert!(s.matches(&json!({"app":"b","env":"","tier":"web","x":"1"})));
        assert!(!s.matches(&json!({"app":"c","env":"p","x":"1"})));
        assert!(!s.matches(&json!({"app":"a","env":"p","x":"1","tier":"db"})));
        assert!(!s.matches(&json!({"app":"a","x":"1"})));
        assert!(!s.matches(&json!({"app":"a","env":"p","x":"1","legacy":"y"})));
    }

    #[test]
    fn label_selector_notin_matches_absent_label() {
        let s = LabelSelector::parse("app notin (a,b)").unwrap();
        assert!(s.matches(&json!({})));
        assert!(s.matches(&Value::Null));
        assert!(s.matches(&json!({"app":"c"})));
        assert!(!s.matches(&json!({"app":"b"})));
    }

    #[test]
    fn label_selector_rejects_garbage() {
        assert!(LabelSelector::parse("a b").is_err());
        assert!(LabelSelector::parse("a in b").is_err());
    }

    #[test]
    fn field_selector_handles_not_equal_and_missing_fields() {
        let s = FieldSelector::parse(
            "spec.nodeName=node-1,status.phase!=Succeeded,status.phase!=Failed",
            Kind::Pod,
        )
        .unwrap();
        assert!(s.matches(&json!({"spec":{"nodeName":"node-1"},"status":{"phase":"Running"}})));
        assert!(!s.matches(&json!({"spec":{"nodeName":"node-1"},"status":{"phase":"Failed"}})));
        assert!(!s.matches(&json!({"spec":{},"status":{"phase":"Running"}})));
        let empty_ns = FieldSelector::parse("involvedObject.namespace=", Kind::Event).unwrap();
        assert!(empty_ns.matches(&json!({"involvedObject":{"name":"n"}})));
    }

    #[test]
    fn field_selector_rejects_unsupported_field() {
        let e = FieldSelector::parse("spec.foo=1", Kind::Pod).unwrap_err();
        assert_eq!(e.code, 400);
        assert!(e.message.contains("field label not supported: spec.foo"));
    }

    #[test]
    fn label_selectors_with_invalid_keys_or_values_are_rejected_like_the_apiserver() {
        for bad in [
            "a=b=c",
            "!!x",
            "-a=b",
            "a=b-",
            "Foo/bar=x",
            &format!("k={}", "v".repeat(64)),
        ] {
            let e = LabelSelector::parse(bad).unwrap_err();
            assert_eq!(e.code, 400, "{bad}");
            assert!(
                e.message.starts_with("unable to parse requirement: "),
                "{bad}: {}",
                e.message
            );
        }
        let e = LabelSelector::parse("a=b=c").unwrap_err();
        assert!(
            e.message.contains("values[0][a]: Invalid value: \"b=c\""),
            "{}",
            e.message
        );
        let e = LabelSelector::parse("!!x").unwrap_err();
        assert!(
            e.message.contains("key: Invalid value: \"!x\""),
            "{}",
            e.message
        );
        for good in [
            "app.kubernetes.io/name=firstpacket",
            "k8s-app",
            "!k8s-app",
            "a in (x, y_z)",
            "a=",
            "tier notin (a.b)",
        ] {
            assert!(LabelSelector::parse(good).is_ok(), "{good}");
        }
    }
}

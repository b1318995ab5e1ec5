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

impl LabelSelector {
    /// Parses `labelSelector` syntax: comma-joined `k=v`, `k==v`, `k!=v`,
    /// `k in (a,b)`, `k notin (a,b)`, `k`, `!k`. Errors: 400 BadRequest.
    pub fn parse(s: &str) -> Result<LabelSelector, ApiError> {
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
}

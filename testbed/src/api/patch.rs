//! PATCH bodies: JSON merge patch (RFC 7386), strategic merge patch (the subset kubectl
//! sends; k8s.io/apimachinery `pkg/util/strategicpatch`) and JSON patch (RFC 6902).

use super::ApiError;
use serde_json::{Map, Value};

/// RFC 7386 JSON merge patch: objects merge recursively, `null` deletes a key, every
/// other value (arrays included) replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

/// Merge key of a list field in the core/v1 types (`patchMergeKey` tags in
/// k8s.io/api/core/v1/types.go); lists without one are replaced.
fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "containerStatuses"
        | "initContainerStatuses" => "name",
        "ports" => "containerPort",
        "conditions" => "type",
        "volumeMounts" => "mountPath",
        "ownerReferences" => "uid",
        "hostAliases" => "ip",
        "podIPs" | "hostIPs" => "ip",
        "taints" => "key",
        _ => return None,
    })
}

/// Strategic merge patch, the subset kubectl sends (`cordon`, `apply`): like a merge
/// patch, but lists with a merge key (containers by `name`, conditions by `type`, …)
/// merge element-wise, `{"$patch":"delete"}` list elements remove, `"$patch":"replace"`
/// in an object replaces it, and `$setElementOrder/…`, `$retainKeys` directives are
/// accepted (ordering is kept as stored, new elements appended). `finalizers` merge as
/// a set.
pub fn strategic_merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut replaced = patch.clone();
        if let Some(m) = replaced.as_object_mut() {
            m.remove("$patch");
        }
        *target = replaced;
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else { return };
    for (k, v) in p {
        if k.starts_with('$') {
            continue;
        }
        if v.is_null() {
            t.remove(k);
            continue;
        }
        match (merge_key(k), v) {
            (Some(key), Value::Array(items)) => {
                let cur = t.entry(k.clone()).or_insert(Value::Array(Vec::new()));
                if !cur.is_array() {
                    *cur = Value::Array(Vec::new());
                }
                if let Value::Array(list) = cur {
                    for item in items {
                        let id = item.get(key).cloned();
                        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
                        let pos = id
                            .as_ref()
                            .and_then(|id| list.iter().position(|e| e.get(key) == Some(id)));
                        match (pos, delete) {
                            (Some(i), true) => {
                                list.remove(i);
                            }
                            (None, true) => {}
                            (Some(i), false) => strategic_merge_patch(&mut list[i], item),
                            (None, false) => {
                                let mut fresh = Value::Null;
                                strategic_merge_patch(&mut fresh, item);
                                list.push(fresh);
                            }
                        }
                    }
                }
            }
            (None, Value::Array(items)) if k == "finalizers" => {
                let cur = t.entry(k.clone()).or_insert(Value::Array(Vec::new()));
                if let Value::Array(list) = cur {
                    for i in items {
                        if !list.contains(i) {
                            list.push(i.clone());
                        }
                    }
                }
            }
            (_, Value::Object(_)) => {
                strategic_merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
}

fn pointer_parts(path: &str) -> Result<Vec<String>, ApiError> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    let rest = path
        .strip_prefix('/')
        .ok_or_else(|| ApiError::bad_request(format!("invalid JSON pointer {path:?}")))?;
    Ok(rest
        .split('/')
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn parent_mut<'a>(doc: &'a mut Value, parts: &[String]) -> Result<&'a mut Value, ApiError> {
    let mut cur = doc;
    for p in parts {
        cur = match cur {
            Value::Object(m) => m
                .get_mut(p)
                .ok_or_else(|| ApiError::bad_request(format!("missing path element {p:?}")))?,
            Value::Array(a) => {
                let i: usize = p
                    .parse()
                    .map_err(|_| ApiError::bad_request(format!("bad array index {p:?}")))?;
                a.get_mut(i)
                    .ok_or_else(|| ApiError::bad_request(format!("array index {i} out of range")))?
            }
            _ => return Err(ApiError::bad_request(format!("cannot descend into {p:?}"))),
        };
    }
    Ok(cur)
}

/// RFC 6902 JSON patch (`add`, `remove`, `replace`, `test`, `copy`, `move`).
/// Errors: 400 BadRequest (the real server answers 422 for a failed `test`; here 422 too).
pub fn apply_json_patch(doc: &mut Value, ops: &Value) -> Result<(), ApiError> {
    let ops = ops
        .as_array()
        .ok_or_else(|| ApiError::bad_request("a JSON patch must be an array"))?;
    for op in ops {
        let kind = op["op"].as_str().unwrap_or("");
        let path = pointer_parts(op["path"].as_str().unwrap_or(""))?;
        match kind {
            "add" | "replace" => put(doc, &path, op["value"].clone(), kind == "add")?,
            "remove" => {
                take(doc, &path)?;
            }
            "test" => {
                let got = doc.pointer(op["path"].as_str().unwrap_or("")).cloned();
                if got.as_ref() != Some(&op["value"]) {
                    return Err(ApiError::new(422, "Invalid", "testing value failed"));
                }
            }
            "copy" | "move" => {
                let from_s = op["from"].as_str().unwrap_or("");
                let from = pointer_parts(from_s)?;
                let v = if kind == "move" {
                    take(doc, &from)?
                } else {
                    doc.pointer(from_s)
                        .cloned()
                        .ok_or_else(|| ApiError::bad_request(format!("missing {from_s}")))?
                };
                put(doc, &path, v, true)?;
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown JSON patch op {other:?}"
                )))
            }
        }
    }
    Ok(())
}

fn put(doc: &mut Value, path: &[String], v: Value, add: bool) -> Result<(), ApiError> {
    let Some((last, parents)) = path.split_last() else {
        *doc = v;
        return Ok(());
    };
    match parent_mut(doc, parents)? {
        Value::Object(m) => {
            if !add && !m.contains_key(last) {
                return Err(ApiError::bad_request(format!(
                    "replace of missing key {last:?}"
                )));
            }
            m.insert(last.clone(), v);
        }
        Value::Array(a) => {
            if last == "-" {
                a.push(v);
            } else {
                let i: usize = last
                    .parse()
                    .map_err(|_| ApiError::bad_request(format!("bad array index {last:?}")))?;
                if add && i <= a.len() {
                    a.insert(i, v);
                } else if !add && i < a.len() {
                    a[i] = v;
                } else {
                    return Err(ApiError::bad_request(format!(
                        "array index {i} out of range"
                    )));
                }
            }
        }
        _ => return Err(ApiError::bad_request("patch target is not a container")),
    }
    Ok(())
}

fn take(doc: &mut Value, path: &[String]) -> Result<Value, ApiError> {
    let Some((last, parents)) = path.split_last() else {
        return Err(ApiError::bad_request("cannot remove the whole document"));
    };
    match parent_mut(doc, parents)? {
        Value::Object(m) => m
            .remove(last)
            .ok_or_else(|| ApiError::bad_request(format!("remove of missing key {last:?}"))),
        Value::Array(a) => {
            let i: usize = last
                .parse()
                .map_err(|_| ApiError::bad_request(format!("bad array index {last:?}")))?;
            if i < a.len() {
                Ok(a.remove(i))
            } else {
                Err(ApiError::bad_request(format!(
                    "array index {i} out of range"
                )))
            }
        }
        _ => Err(ApiError::bad_request("patch target is not a container")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_null_removes_key_like_uncordon() {
        let mut node = json!({"spec": {"unschedulable": true, "podCIDR": "10.0.0.0/24"}});
        strategic_merge_patch(&mut node, &json!({"spec": {"unschedulable": null}}));
        assert_eq!(node, json!({"spec": {"podCIDR": "10.0.0.0/24"}}));
    }

    #[test]
    fn strategic_merges_containers_by_name_while_merge_patch_replaces() {
        let orig = json!({"spec": {"containers": [
            {"name": "main", "image": "a", "args": ["x"]},
            {"name": "other", "image": "o"}]}});
        let p = json!({"spec": {"$setElementOrder/containers": [{"name":"main"},{"name":"other"},{"name":"side"}],
            "containers": [{"name": "main", "image": "b"}, {"name": "side", "image": "busybox"}]}});
        let mut s = orig.clone();
        strategic_merge_patch(&mut s, &p);
        let cs = s["spec"]["containers"].as_array().unwrap();
        assert_eq!(cs.len(), 3);
        assert_eq!(cs[0], json!({"name": "main", "image": "b", "args": ["x"]}));
        assert_eq!(cs[2]["name"], "side");
        let mut m = orig;
        merge_patch(
            &mut m,
            &json!({"spec": {"containers": [{"name": "main", "image": "b"}]}}),
        );
        assert_eq!(m["spec"]["containers"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn strategic_patch_delete_directive_removes_list_element() {
        let mut v = json!({"status": {"conditions": [{"type": "A"}, {"type": "B"}]}});
        strategic_merge_patch(
            &mut v,
            &json!({"status": {"conditions": [{"type": "A", "$patch": "delete"}]}}),
        );
        assert_eq!(v, json!({"status": {"conditions": [{"type": "B"}]}}));
    }

    #[test]
    fn json_patch_adds_replaces_and_removes() {
        let mut v = json!({"metadata": {"labels": {"a": "1"}}, "list": [1, 2]});
        apply_json_patch(
            &mut v,
            &json!([
                {"op": "add", "path": "/metadata/labels/b~1c", "value": "2"},
                {"op": "replace", "path": "/metadata/labels/a", "value": "3"},
                {"op": "remove", "path": "/list/0"},
                {"op": "add", "path": "/list/-", "value": 9}
            ]),
        )
        .unwrap();
        assert_eq!(
            v,
            json!({"metadata": {"labels": {"a": "3", "b/c": "2"}}, "list": [2, 9]})
        );
        assert!(apply_json_patch(
            &mut v,
            &json!([{"op": "test", "path": "/list/0", "value": 5}])
        )
        .is_err());
    }
}

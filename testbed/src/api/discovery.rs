//! Discovery documents: `/version`, `/api`, `/apis`, `/api/v1`, `/apis/G/V`, and the
//! minimal `/openapi/v3` that lets `kubectl apply -f`/`create -f` pass default
//! validation (as kubectl 1.32 asks, observed on the wire).

use super::{Kind, GIT_VERSION};
use serde_json::{json, Value};

/// Verbs every stored kind supports through the HTTP front end.
const VERBS: [&str; 7] = [
    "create", "delete", "get", "list", "patch", "update", "watch",
];

/// `/version`: minor "32" so the kubectl dispatcher runs its built-in v1.32.4.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "32",
        "gitVersion": GIT_VERSION,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.23.6",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `/api` (`APIVersions`); `server` is the address clients used (`Host` header).
pub fn api_versions(server: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server}],
    })
}

fn groups() -> Vec<&'static str> {
    let mut g: Vec<&str> = Kind::ALL
        .iter()
        .map(|k| k.group())
        .filter(|g| !g.is_empty())
        .collect();
    g.sort();
    g.dedup();
    g
}

/// `/apis` (`APIGroupList`) listing the non-core groups of [`Kind::ALL`].
pub fn api_group_list() -> Value {
    let groups: Vec<Value> = groups()
        .into_iter()
        .map(|g| {
            let gv = json!({"groupVersion": format!("{g}/v1"), "version": "v1"});
            json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn resource(kind: Kind) -> Value {
    let mut r = json!({
        "name": kind.plural(),
        "singularName": kind.singular(),
        "namespaced": kind.namespaced(),
        "kind": kind.kind_name(),
        "verbs": VERBS,
    });
    if !kind.short_names().is_empty() {
        r["shortNames"] = json!(kind.short_names());
    }
    if !kind.categories().is_empty() {
        r["categories"] = json!(kind.categories());
    }
    r
}

fn sub(kind: Kind, sub: &str, verbs: &[&str]) -> Value {
    json!({
        "name": format!("{}/{sub}", kind.plural()),
        "singularName": "",
        "namespaced": kind.namespaced(),
        "kind": kind.kind_name(),
        "verbs": verbs,
    })
}

/// `APIResourceList` for `group`/`version` (`""`/`v1` is `/api/v1`), or `None` when
/// nothing is served there.
pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let kinds: Vec<Kind> = Kind::ALL
        .into_iter()
        .filter(|k| k.group() == group && k.version() == version)
        .collect();
    if kinds.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for k in kinds {
        resources.push(resource(k));
        match k {
            Kind::Pod => {
                resources.push(sub(k, "status", &["get", "patch", "update"]));
                resources.push(sub(k, "log", &["get"]));
                resources.push(sub(
                    k,
                    "proxy",
                    &["create", "delete", "get", "patch", "update"],
                ));
            }
            Kind::ServiceAccount => resources.push(sub(k, "token", &["create"])),
            Kind::Node | Kind::Namespace | Kind::Deployment | Kind::Job => {
                resources.push(sub(k, "status", &["get", "patch", "update"]))
            }
            _ => {}
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

/// Hash used in the `/openapi/v3` root to name the GV document (any stable token).
pub const OPENAPI_HASH: &str = "firstpacket0001";

/// `/openapi/v3` root: one entry for `api/v1` and one per served group version
/// (`apis/apps/v1`, `apis/batch/v1`, …).
pub fn openapi_root() -> Value {
    let mut paths = serde_json::Map::new();
    paths.insert(
        "api/v1".into(),
        json!({"serverRelativeURL": format!("/openapi/v3/api/v1?hash={OPENAPI_HASH}")}),
    );
    for g in groups() {
        paths.insert(
            format!("apis/{g}/v1"),
            json!({"serverRelativeURL": format!("/openapi/v3/apis/{g}/v1?hash={OPENAPI_HASH}")}),
        );
    }
    json!({ "paths": paths })
}

/// `/openapi/v3/apis/GROUP/VERSION`: like [`openapi_v1`] for a named group, or `None`
/// when nothing is served there.
pub fn openapi_gv(group: &str, version: &str) -> Option<Value> {
    let mut paths = serde_json::Map::new();
    for k in Kind::ALL
        .into_iter()
        .filter(|k| !group.is_empty() && k.group() == group && k.version() == version)
    {
        let path = if k.namespaced() {
            format!(
                "/apis/{group}/{version}/namespaces/{{namespace}}/{}/{{name}}",
                k.plural()
            )
        } else {
            format!("/apis/{group}/{version}/{}/{{name}}", k.plural())
        };
        paths.insert(path, patch_op(group, version, k));
    }
    if paths.is_empty() {
        return None;
    }
    Some(
        json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": GIT_VERSION}, "paths": paths}),
    )
}

fn patch_op(group: &str, version: &str, k: Kind) -> Value {
    json!({"patch": {
        "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": k.kind_name()},
        "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}}],
        "responses": {"200": {"description": "OK"}},
    }})
}

/// `/openapi/v3/api/v1`: the smallest document with which kubectl's default
/// `--validate=strict` passes (a `patch` operation carrying
/// `x-kubernetes-group-version-kind` and the `fieldValidation` parameter, per kind).
pub fn openapi_v1() -> Value {
    let mut paths = serde_json::Map::new();
    for k in Kind::ALL.into_iter().filter(|k| k.group().is_empty()) {
        let path = if k.namespaced() {
            format!("/api/v1/namespaces/{{namespace}}/{}/{{name}}", k.plural())
        } else {
            format!("/api/v1/{}/{{name}}", k.plural())
        };
        paths.insert(
            path,
            json!({"patch": {
                "x-kubernetes-group-version-kind": {"group": "", "version": "v1", "kind": k.kind_name()},
                "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}}],
                "responses": {"200": {"description": "OK"}},
            }}),
        );
    }
    json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": GIT_VERSION}, "paths": paths})
}

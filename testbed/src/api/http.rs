//! The HTTP front end: kube-apiserver's REST surface over [`Store`] for the kinds in
//! [`Kind::ALL`]. Paths are parsed by hand (one fallback handler) so every unknown path
//! answers the real 404 `Status`.

use super::selector::{FieldSelector, LabelSelector, Selector};
use super::store::strip_nulls;
use super::{
    apply_json_patch, discovery, merge_patch, strategic_merge_patch, table, ApiError, Kind,
    LogQuery, ProxyRequest, Store, StoreEvent, WatchEventType,
};
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;

/// How often a watch with `allowWatchBookmarks=true` gets a BOOKMARK event.
pub const BOOKMARK_PERIOD: Duration = Duration::from_secs(10);

type Params = HashMap<String, String>;

/// The axum router of the API server (plain HTTP; TLS is layered outside).
pub fn router(store: Arc<Store>) -> Router {
    Router::new()
        .route(
            "/version",
            get(|| async { json_response(200, &discovery::version()) }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .route(
            "/openapi/v3",
            get(|| async { json_response(200, &discovery::openapi_root()) }),
        )
        .route(
            "/openapi/v3/api/v1",
            get(|| async { json_response(200, &discovery::openapi_v1()) }),
        )
        .route(
            "/openapi/v3/apis/{group}/{version}",
            get(
                |axum::extract::Path((group, version)): axum::extract::Path<(String, String)>| async move {
                    match discovery::openapi_gv(&group, &version) {
                        Some(doc) => json_response(200, &doc),
                        None => error_response(&ApiError::no_route()),
                    }
                },
            ),
        )
        .fallback(dispatch)
        .with_state(store)
}

/// Serves [`router`] on `listener` until the listener fails.
pub async fn serve(store: Arc<Store>, listener: tokio::net::TcpListener) -> std::io::Result<()> {
    axum::serve(
        listener,
        router(store).into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .await
}

fn json_response(code: u16, v: &Value) -> Response {
    let body = serde_json::to_vec(v).unwrap_or_default();
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn error_response(e: &ApiError) -> Response {
    json_response(e.code, &e.status_json())
}

/// What a request path names.
#[derive(Debug, Clone, PartialEq)]
enum Target {
    /// `/api` or `/apis`.
    Root { core: bool },
    /// `/api/v1`, `/apis/G/V`.
    ResourceList { group: String, version: String },
    /// `/apis/G`.
    Group { group: String },
    /// A collection (`ns` None = all namespaces or cluster-scoped).
    Collection { kind: Kind, ns: Option<String> },
    /// One object, maybe a subresource (`status`, `log`, `proxy`, `token`); the proxy
    /// path is taken from the raw URI.
    Object {
        kind: Kind,
        ns: Option<String>,
        name: String,
        sub: Option<String>,
    },
}

fn parse_path(path: &str) -> Result<Target, ApiError> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api"] => return Ok(Target::Root { core: true }),
        ["apis"] => return Ok(Target::Root { core: false }),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g] => {
            return Ok(Target::Group {
                group: g.to_string(),
            })
        }
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::no_route()),
    };
    let kind_of = |p: &str| Kind::from_rest(group, version, p).ok_or_else(ApiError::no_route);
    let object = |kind: Kind, ns: Option<String>, tail: &[&str]| -> Result<Target, ApiError> {
        match tail {
            [] => Ok(Target::Collection { kind, ns }),
            [name] => Ok(Target::Object {
                kind,
                ns,
                name: name.to_string(),
                sub: None,
            }),
            [name, sub, ..] => Ok(Target::Object {
                kind,
                ns,
                name: name.to_string(),
                sub: Some(sub.to_string()),
            }),
        }
    };
    match rest {
        [] => Ok(Target::ResourceList {
            group: group.to_string(),
            version: version.to_string(),
        }),
        ["namespaces", ns, plural, tail @ ..]
            if Kind::from_rest(group, version, plural).is_some_and(|k| k.namespaced()) =>
        {
            object(kind_of(plural)?, Some(ns.to_string()), tail)
        }
        [plural, tail @ ..] => {
            let kind = kind_of(plural)?;
            if kind.namespaced() && !tail.is_empty() {
                return Err(ApiError::no_route());
            }
            object(kind, None, tail)
        }
    }
}

fn is_table(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"))
}

/// The authorization verb of a request (k8s.io/apiserver `pkg/endpoints/request`
/// `RequestInfoFactory`): `GET`/`HEAD` → `get` (`list`/`watch` on a collection), `POST` →
/// `create`, `PUT` → `update`, `PATCH` → `patch`, `DELETE` → `delete`. The same holds
/// for `pods/proxy`, so a proxied `GET` needs `get` and a proxied `POST` `create`.
fn verb_of(method: &Method, target: &Target, params: &Params) -> &'static str {
    let watching = params.get("watch").is_some_and(|w| w == "true" || w == "1");
    match (method, target) {
        (&Method::GET, Target::Collection { .. }) if watching => "watch",
        (&Method::GET, Target::Collection { .. }) => "list",
        (&Method::GET | &Method::HEAD, _) => "get",
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, _) => "delete",
        _ => "unknown",
    }
}

/// 403 as kube-apiserver's RBAC authorizer words it (`resource` is the plural or
/// `plural/subresource`, e.g. `pods/proxy`).
fn forbidden(kind: Kind, name: &str, verb: &str, resource: &str, ns: Option<&str>) -> ApiError {
    let scope = match ns {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".to_string(),
    };
    ApiError::forbidden(
        kind,
        name,
        &format!(
            "User \"system:anonymous\" cannot {verb} resource \"{resource}\" in API group \"{}\" {scope}",
            kind.group()
        ),
    )
}

async fn dispatch(
    State(store): State<Arc<Store>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    extensions: axum::http::Extensions,
    body: Bytes,
) -> Response {
    // The client's address (set by the listener), which the pod proxy passes on.
    let client = extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    let params: Params = Query::<Params>::try_from_uri(&uri)
        .map(|q| q.0)
        .unwrap_or_default();
    let target = match parse_path(uri.path()) {
        Ok(t) => t,
        Err(e) => return error_response(&e),
    };
    let asked = Asked {
        method: &method,
        uri: &uri,
        headers: &headers,
        client,
    };
    match handle(&store, asked, &params, target, body).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

/// A request as the client sent it, but its body.
#[derive(Clone, Copy)]
struct Asked<'a> {
    method: &'a Method,
    uri: &'a Uri,
    headers: &'a HeaderMap,
    /// The client's IP, when the listener knows it.
    client: Option<std::net::IpAddr>,
}

async fn handle(
    store: &Arc<Store>,
    asked: Asked<'_>,
    params: &Params,
    target: Target,
    body: Bytes,
) -> Result<Response, ApiError> {
    let Asked {
        method, headers, ..
    } = asked;
    let verb = verb_of(method, &target, params);
    let node = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == format!("Bearer {}", super::NODE_TOKEN));
    match &target {
        Target::Root { core } => {
            if method != Method::GET {
                return Err(ApiError::method_not_allowed());
            }
            let host = headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("127.0.0.1");
            let v = if *core {
                discovery::api_versions(host)
            } else {
                discovery::api_group_list()
            };
            Ok(json_response(200, &v))
        }
        Target::Group { group } => {
            let list = discovery::api_group_list();
            let found = list["groups"]
                .as_array()
                .and_then(|gs| gs.iter().find(|g| g["name"] == group.as_str()).cloned());
            match found {
                Some(mut g) => {
                    g["kind"] = json!("APIGroup");
                    g["apiVersion"] = json!("v1");
                    Ok(json_response(200, &g))
                }
                None => Err(ApiError::no_route()),
            }
        }
        Target::ResourceList { group, version } => discovery::resource_list(group, version)
            .map(|v| json_response(200, &v))
            .ok_or_else(ApiError::no_route),
        Target::Collection { kind, ns } => {
            if store.is_denied_to(verb, kind.plural(), ns.as_deref(), node) {
                return Err(forbidden(*kind, "", verb, kind.plural(), ns.as_deref()));
            }
            match *method {
                Method::GET => {
                    list_or_watch(store, *kind, ns.as_deref(), params, is_table(headers))
                }
                Method::POST => create(store, *kind, ns.as_deref(), &body),
                _ => Err(ApiError::method_not_allowed()),
            }
        }
        Target::Object {
            kind,
            ns,
            name,
            sub,
        } => {
            let resource = match sub {
                Some(s) => format!("{}/{s}", kind.plural()),
                None => kind.plural().to_string(),
            };
            if store.is_denied_to(verb, &resource, ns.as_deref(), node) {
                return Err(forbidden(*kind, name, verb, &resource, ns.as_deref()));
            }
            let ns = ns.as_deref();
            match (sub.as_deref(), method) {
                (None, &Method::GET) | (Some("status"), &Method::GET) => {
                    let obj = store.get(*kind, ns, name)?;
                    if is_table(headers) {
                        let rv = rv_of(&obj);
                        Ok(json_response(200, &table::table(*kind, [&obj], rv)))
                    } else {
                        Ok(json_response(200, &obj))
                    }
                }
                (None, &Method::PUT) | (Some("status"), &Method::PUT) => {
                    update(store, *kind, ns, name, sub.is_some(), &body)
                }
                (None, &Method::PATCH) | (Some("status"), &Method::PATCH) => {
                    patch(store, *kind, ns, name, sub.is_some(), headers, &body)
                }
                (None, &Method::DELETE) => delete(store, *kind, ns, name, params, &body),
                (Some("log"), &Method::GET) if *kind == Kind::Pod => {
                    pod_log(store, ns.unwrap_or("default"), name, params)
                }
                (Some("proxy"), _) if *kind == Kind::Pod => {
                    pod_proxy(store, ns.unwrap_or("default"), name, asked, body).await
                }
                (Some("token"), &Method::POST) if *kind == Kind::ServiceAccount => {
                    token_request(store, ns.unwrap_or("default"), name, &body)
                }
                (None, _) | (Some("status"), _) => Err(ApiError::method_not_allowed()),
                _ => Err(ApiError::no_route()),
            }
        }
    }
}

fn rv_of(obj: &Value) -> u64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(json!({}));
    }
    serde_json::from_slice(body)
        .or_else(|_| serde_yaml_ng::from_slice::<Value>(body))
        .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))
}

fn selector(kind: Kind, params: &Params) -> Result<Selector, ApiError> {
    Ok(Selector {
        labels: LabelSelector::parse(params.get("labelSelector").map_or("", |s| s))?,
        fields: FieldSelector::parse(params.get("fieldSelector").map_or("", |s| s), kind)?,
    })
}

fn list_or_watch(
    store: &Arc<Store>,
    kind: Kind,
    ns: Option<&str>,
    params: &Params,
    as_table: bool,
) -> Result<Response, ApiError> {
    let sel = selector(kind, params)?;
    if params.get("watch").is_some_and(|w| w == "true" || w == "1") {
        return watch(store, kind, ns, params, sel, as_table);
    }
    let (items, rv) = store.list_arc(kind, ns);
    let items: Vec<Arc<Value>> = items.into_iter().filter(|o| sel.matches(o)).collect();
    if as_table {
        return Ok(json_response(
            200,
            &table::table(kind, items.iter().map(|o| &**o), rv),
        ));
    }
    let items: Vec<Value> = items
        .iter()
        .map(|o| {
            let mut o = (**o).clone();
            if let Some(m) = o.as_object_mut() {
                m.remove("kind");
                m.remove("apiVersion");
            }
            o
        })
        .collect();
    Ok(json_response(
        200,
        &json!({
            "kind": format!("{}List", kind.kind_name()),
            "apiVersion": kind.api_version(),
            "metadata": {"resourceVersion": rv.to_string()},
            "items": items,
        }),
    ))
}

/// Parameters of one watch.
struct WatchSpec {
    kind: Kind,
    ns: Option<String>,
    sel: Selector,
    as_table: bool,
}

impl WatchSpec {
    /// The wire line for `ev`, or `None` when the watch does not see it. Selector
    /// transitions become ADDED/DELETED like kube-apiserver's cacher does.
    fn render(&self, ev: &StoreEvent) -> Option<Vec<u8>> {
        if ev.kind != self.kind {
            return None;
        }
        if let Some(ns) = &self.ns {
            if self.kind.namespaced() && ev.namespace() != ns {
                return None;
            }
        }
        let now_m = self.sel.matches(&ev.object);
        let old_m = ev.old.as_ref().is_some_and(|o| self.sel.matches(o));
        let ty = match ev.ty {
            WatchEventType::Added if now_m => WatchEventType::Added,
            WatchEventType::Modified => match (old_m, now_m) {
                (true, true) => WatchEventType::Modified,
                (false, true) => WatchEventType::Added,
                (true, false) => WatchEventType::Deleted,
                (false, false) => return None,
            },
            WatchEventType::Deleted if now_m || old_m => WatchEventType::Deleted,
            _ => return None,
        };
        let object = if self.as_table {
            table::table(self.kind, [&*ev.object], ev.rv)
        } else {
            (*ev.object).clone()
        };
        line(&json!({"type": ty.as_str(), "object": object}))
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Option<Vec<u8>> {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        if self.as_table {
            // kube-apiserver sends a bookmark to a Table watch as an empty Table that
            // carries only the resourceVersion (endpoints/handlers `asTable`).
            return line(&json!({"type": "BOOKMARK", "object": {
                "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta,
                "columnDefinitions": [], "rows": []}}));
        }
        line(&json!({"type": "BOOKMARK", "object": {
            "kind": self.kind.kind_name(), "apiVersion": self.kind.api_version(), "metadata": meta}}))
    }
}

fn line(v: &Value) -> Option<Vec<u8>> {
    let mut b = serde_json::to_vec(v).ok()?;
    b.push(b'\n');
    Some(b)
}

fn stream_response(rx: mpsc::Receiver<Result<Bytes, Infallible>>) -> Response {
    let mut r = Response::new(Body::from_stream(ReceiverStream::new(rx)));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn watch(
    store: &Arc<Store>,
    kind: Kind,
    ns: Option<&str>,
    params: &Params,
    sel: Selector,
    as_table: bool,
) -> Result<Response, ApiError> {
    let rv = match params.get("resourceVersion").map(String::as_str) {
        None | Some("") => None,
        Some(s) => Some(
            s.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s}")))?,
        ),
    };
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs);
    let bookmarks = params
        .get("allowWatchBookmarks")
        .is_some_and(|s| s == "true");
    let send_initial = params.get("sendInitialEvents").is_some_and(|s| s == "true");
    let spec = WatchSpec {
        kind,
        ns: ns.map(str::to_string),
        sel,
        as_table,
    };
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(256);
    let start = match store.watch(kind, ns, if send_initial { None } else { rv }) {
        Ok(s) => s,
        Err(e) if e.code == 410 => {
            // kube-apiserver answers 200 and sends one ERROR event
            // (prober/tests/fixtures/k8s-watch-error-410.jsonl).
            if let Some(l) = line(&json!({"type": "ERROR", "object": e.status_json()})) {
                let _ = tx.try_send(Ok(Bytes::from(l)));
            }
            return Ok(stream_response(rx));
        }
        Err(e) => return Err(e),
    };
    let mut expire = store.expire_signal();
    expire.borrow_and_update();
    tokio::spawn(async move {
        let mut live = start.rx;
        let mut last_rv = start.rv;
        for ev in &start.initial {
            if let Some(l) = spec.render(ev) {
                if tx.send(Ok(Bytes::from(l))).await.is_err() {
                    return;
                }
            }
        }
        if send_initial && bookmarks {
            if let Some(l) = spec.bookmark(last_rv, true) {
                if tx.send(Ok(Bytes::from(l))).await.is_err() {
                    return;
                }
            }
        }
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let mut tick = tokio::time::interval_at(
            tokio::time::Instant::now() + BOOKMARK_PERIOD,
            BOOKMARK_PERIOD,
        );
        loop {
            let out = tokio::select! {
                biased;
                _ = tx.closed() => return,
                r = live.recv() => match r {
                    Ok(ev) => {
                        last_rv = ev.rv;
                        spec.render(&ev)
                    }
                    // Too far behind: end the stream; the client resumes from its
                    // last resourceVersion (or re-lists on 410).
                    Err(broadcast::error::RecvError::Lagged(_)) => return,
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = expire.changed() => return,
                _ = async { match deadline { Some(d) => tokio::time::sleep_until(d).await, None => std::future::pending().await } } => return,
                _ = tick.tick(), if bookmarks => spec.bookmark(last_rv, false),
            };
            if let Some(l) = out {
                if tx.send(Ok(Bytes::from(l))).await.is_err() {
                    return;
                }
            }
        }
    });
    Ok(stream_response(rx))
}

fn create(
    store: &Arc<Store>,
    kind: Kind,
    ns: Option<&str>,
    body: &[u8],
) -> Result<Response, ApiError> {
    let mut obj = parse_body(body)?;
    if !obj.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request was not a JSON object",
        ));
    }
    if kind.namespaced() {
        let Some(ns) = ns else {
            return Err(ApiError::method_not_allowed());
        };
        let given = obj["metadata"]["namespace"].as_str().unwrap_or("");
        if !given.is_empty() && given != ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        if !obj["metadata"].is_object() {
            obj["metadata"] = json!({});
        }
        obj["metadata"]["namespace"] = json!(ns);
    }
    let created = store.create(kind, obj)?;
    Ok(json_response(201, &created))
}

/// Kinds whose main resource ignores `status` on update (status subresource exists).
fn has_status(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Pod | Kind::Node | Kind::Namespace | Kind::Service | Kind::Deployment | Kind::Job
    )
}

/// Applies a new desired object `new` on top of the stored `cur` the way the registry's
/// update strategy does: status subresource writes take only `status`; main-resource
/// writes keep the stored status; server-managed metadata stays.
fn merge_update(kind: Kind, cur: &mut Value, mut new: Value, status_only: bool) {
    strip_nulls(&mut new);
    if status_only {
        cur["status"] = new["status"].take();
        return;
    }
    let keep_status = cur["status"].take();
    let keep_meta = cur["metadata"].clone();
    *cur = new;
    if !cur["metadata"].is_object() {
        cur["metadata"] = json!({});
    }
    for f in [
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "generateName",
    ] {
        match keep_meta.get(f) {
            Some(v) => cur["metadata"][f] = v.clone(),
            None => {
                if let Some(m) = cur["metadata"].as_object_mut() {
                    m.remove(f);
                }
            }
        }
    }
    if has_status(kind) {
        if keep_status.is_null() {
            if let Some(m) = cur.as_object_mut() {
                m.remove("status");
            }
        } else {
            cur["status"] = keep_status;
        }
    }
}

fn check_rv(kind: Kind, name: &str, cur: &Value, wanted: &Value) -> Result<(), ApiError> {
    let want = wanted["metadata"]["resourceVersion"].as_str().unwrap_or("");
    if !want.is_empty() && want != cur["metadata"]["resourceVersion"].as_str().unwrap_or("") {
        return Err(ApiError::conflict(
            kind,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        ));
    }
    Ok(())
}

fn update(
    store: &Arc<Store>,
    kind: Kind,
    ns: Option<&str>,
    name: &str,
    status_only: bool,
    body: &[u8],
) -> Result<Response, ApiError> {
    let new = parse_body(body)?;
    let body_name = new["metadata"]["name"].as_str().unwrap_or("");
    if body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let out = store.modify(kind, ns, name, |cur| {
        check_rv(kind, name, cur, &new)?;
        merge_update(kind, cur, new, status_only);
        Ok(())
    })?;
    Ok(json_response(200, &out))
}

fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_string()
}

fn patch(
    store: &Arc<Store>,
    kind: Kind,
    ns: Option<&str>,
    name: &str,
    status_only: bool,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    let ct = content_type(headers);
    let p = parse_body(body)?;
    let apply = ct == "application/apply-patch+yaml";
    if apply && !status_only {
        if let Err(e) = store.get(kind, ns, name) {
            if e.code != 404 {
                return Err(e);
            }
            // Server-side apply to a missing object creates it.
            let mut obj = p;
            if !obj["metadata"].is_object() {
                obj["metadata"] = json!({});
            }
            obj["metadata"]["name"] = json!(name);
            if let Some(ns) = ns.filter(|_| kind.namespaced()) {
                obj["metadata"]["namespace"] = json!(ns);
            }
            let created = store.create(kind, obj)?;
            return Ok(json_response(201, &created));
        }
    }
    let out = store.modify(kind, ns, name, |cur| {
        // A `metadata.uid` in the patch is a precondition (the kubelet's status patches
        // carry one so they cannot land on a recreated pod of the same name).
        if let Some(want) = p["metadata"]["uid"].as_str() {
            let have = cur["metadata"]["uid"].as_str().unwrap_or("");
            if want != have {
                return Err(ApiError::conflict(
                    kind,
                    name,
                    &format!("Precondition failed: UID in precondition: {want}, UID in object meta: {have}"),
                ));
            }
        }
        let mut patched = cur.clone();
        match ct.as_str() {
            "application/merge-patch+json" => merge_patch(&mut patched, &p),
            "application/strategic-merge-patch+json" | "application/apply-patch+yaml" => {
                strategic_merge_patch(&mut patched, &p)
            }
            "application/json-patch+json" => apply_json_patch(&mut patched, &p)?,
            other => {
                return Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {other:?})"),
                ))
            }
        }
        check_rv(kind, name, cur, &p)?;
        merge_update(kind, cur, patched, status_only);
        Ok(())
    })?;
    Ok(json_response(200, &out))
}

fn delete(
    store: &Arc<Store>,
    kind: Kind,
    ns: Option<&str>,
    name: &str,
    params: &Params,
    body: &[u8],
) -> Result<Response, ApiError> {
    let opts = parse_body(body)?;
    let grace = opts["gracePeriodSeconds"].as_i64().or_else(|| {
        params
            .get("gracePeriodSeconds")
            .and_then(|s| s.parse().ok())
    });
    let uid = opts["preconditions"]["uid"].as_str();
    let out = store.delete(kind, ns, name, grace, uid)?;
    Ok(json_response(200, &out))
}

/// `serviceaccounts/NAME/token` (TokenRequest, authentication.k8s.io/v1): the built-in
/// server authorises every request, so the token is the placeholder every client
/// sends; the answer has the real shape (`status.token`, `status.expirationTimestamp`,
/// the spec echoed with `expirationSeconds` defaulted to 3600). 404 when the
/// ServiceAccount does not exist.
fn token_request(
    store: &Arc<Store>,
    ns: &str,
    name: &str,
    body: &[u8],
) -> Result<Response, ApiError> {
    store.get(Kind::ServiceAccount, Some(ns), name)?;
    let req = parse_body(body)?;
    let mut spec = req["spec"].clone();
    if !spec.is_object() {
        spec = json!({});
    }
    let secs = spec["expirationSeconds"].as_i64().unwrap_or(3600).max(600);
    spec["expirationSeconds"] = json!(secs);
    if !spec["audiences"].is_array() {
        spec["audiences"] = json!([]);
    }
    let exp = humantime::format_rfc3339_seconds(
        std::time::SystemTime::now() + Duration::from_secs(secs.unsigned_abs()),
    )
    .to_string();
    Ok(json_response(
        201,
        &json!({
            "kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
            "metadata": { "name": name, "namespace": ns, "creationTimestamp": null },
            "spec": spec,
            "status": { "token": crate::kubelet::SERVICE_ACCOUNT_TOKEN, "expirationTimestamp": exp },
        }),
    ))
}

fn pod_log(
    store: &Arc<Store>,
    ns: &str,
    name: &str,
    params: &Params,
) -> Result<Response, ApiError> {
    let pod = store.get(Kind::Pod, Some(ns), name)?;
    let names: Vec<String> = pod["spec"]["containers"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .filter_map(|c| c["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let container = match params.get("container").filter(|c| !c.is_empty()) {
        Some(c) => {
            if !names.contains(c) {
                return Err(ApiError::bad_request(format!(
                    "container {c} is not valid for pod {name}"
                )));
            }
            c.clone()
        }
        None if names.len() == 1 => names[0].clone(),
        None => {
            return Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                names.join(" ")
            )))
        }
    };
    let num = |k: &str| params.get(k).and_then(|s| s.parse::<i64>().ok());
    let flag = |k: &str| params.get(k).is_some_and(|s| s == "true");
    let q = LogQuery {
        tail_lines: num("tailLines"),
        since_seconds: num("sinceSeconds"),
        limit_bytes: num("limitBytes"),
        timestamps: flag("timestamps"),
        previous: flag("previous"),
        follow: flag("follow"),
    };
    if q.follow {
        if let Some(stream) = store
            .log_source()
            .and_then(|src| src.follow(ns, name, &container, &q))
        {
            use futures::StreamExt;
            let body = Body::from_stream(stream.map(|b| Ok::<_, Infallible>(Bytes::from(b))));
            return Ok(Response::builder()
                .status(200)
                .header(header::CONTENT_TYPE, "text/plain")
                .body(body)
                .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response()));
        }
    }
    let text = store
        .log_source()
        .and_then(|src| src.read(ns, name, &container, &q))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "container \"{container}\" in pod \"{name}\" is waiting to start: ContainerCreating"
            ))
        })?;
    Ok(Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from(text))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response()))
}

/// The path after `/pods/ID/proxy` in the raw request path (percent-encoding, repeated
/// and trailing slashes kept), `/` when there is none. kube-apiserver redirects a bare
/// `…/proxy` GET to `…/proxy/`; here it simply goes to `/`.
fn proxy_path(raw: &str, id: &str) -> String {
    let marker = format!("/pods/{id}/proxy");
    let rest = raw
        .find(&marker)
        .map(|i| &raw[i + marker.len()..])
        .unwrap_or("");
    if rest.starts_with('/') {
        rest.to_string()
    } else {
        "/".to_string()
    }
}

/// `pods/ID/proxy[/PATH]` (any method; see [`super::proxy`]): 400 `invalid pod request`
/// for a malformed ID, 404 `pods "NAME" not found`, 400 `address not allowed` without a
/// pod IP, 503 `error trying to reach service: …` when the pod cannot be reached (or
/// the port is not a number), else the pod's status, `Content-Type` and body. The raw
/// query string, the body and the end-to-end request headers go to the pod, with the
/// client's IP appended to `X-Forwarded-For` as kube-apiserver's proxy does.
async fn pod_proxy(
    store: &Arc<Store>,
    ns: &str,
    id: &str,
    asked: Asked<'_>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let Asked {
        method,
        uri,
        headers,
        client,
    } = asked;
    let (scheme, name, port) = super::proxy::split_id(id)?;
    let pod = store.get(Kind::Pod, Some(ns), name)?;
    if scheme == "https" {
        return Err(ApiError::bad_request(format!(
            "the testbed's pod proxy speaks plain HTTP only (asked for {id:?})"
        )));
    }
    let addr = super::proxy::pod_address(&pod, port)?;
    let req = ProxyRequest {
        namespace: ns.to_string(),
        pod: name.to_string(),
        port: Some(addr.port().to_string()),
        path: proxy_path(uri.path(), id),
        query: uri.query().map(str::to_string),
        method: method.to_string(),
        body: body.to_vec(),
        headers: super::proxy::with_forwarded_for(
            headers
                .iter()
                .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
                .collect(),
            client,
        ),
    };
    let resp = match store.proxy_source() {
        Some(src) => src.proxy(&pod, req).await?,
        None => super::proxy::forward(addr, req).await?,
    };
    let status = StatusCode::from_u16(resp.status).map_err(|_| {
        ApiError::new(
            503,
            "ServiceUnavailable",
            format!(
                "error trying to reach service: {addr}: invalid status {}",
                resp.status
            ),
        )
    })?;
    let mut b = Response::builder().status(status);
    if let Some(ct) = resp.content_type {
        b = b.header(header::CONTENT_TYPE, ct);
    }
    Ok(b.body(Body::from(resp.body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bookmarks_in_table_mode_are_empty_tables_with_the_resource_version() {
        let spec = |as_table| WatchSpec {
            kind: Kind::Pod,
            ns: None,
            sel: Selector::default(),
            as_table,
        };
        let t: Value = serde_json::from_slice(&spec(true).bookmark(42, false).unwrap()).unwrap();
        assert_eq!(t["type"], "BOOKMARK");
        assert_eq!(t["object"]["kind"], "Table");
        assert_eq!(t["object"]["metadata"]["resourceVersion"], "42");
        assert_eq!(t["object"]["rows"], json!([]));
        let p: Value = serde_json::from_slice(&spec(false).bookmark(42, false).unwrap()).unwrap();
        assert_eq!(p["object"]["kind"], "Pod");
    }

    #[test]
    fn the_proxy_path_is_the_raw_rest_after_proxy() {
        let p = |raw| proxy_path(raw, "web:8080");
        assert_eq!(p("/api/v1/namespaces/d/pods/web:8080/proxy"), "/");
        assert_eq!(p("/api/v1/namespaces/d/pods/web:8080/proxy/"), "/");
        assert_eq!(
            p("/api/v1/namespaces/pods/pods/web:8080/proxy/a%2Fb//c/"),
            "/a%2Fb//c/"
        );
    }

    #[test]
    fn paths_resolve_to_namespaced_and_cluster_targets() {
        assert_eq!(
            parse_path("/api/v1/namespaces/default/pods").unwrap(),
            Target::Collection {
                kind: Kind::Pod,
                ns: Some("default".into())
            }
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/kube-system").unwrap(),
            Target::Object {
                kind: Kind::Namespace,
                ns: None,
                name: "kube-system".into(),
                sub: None,
            }
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/kube-system/pods/p:9091/proxy/metrics").unwrap(),
            Target::Object {
                kind: Kind::Pod,
                ns: Some("kube-system".into()),
                name: "p:9091".into(),
                sub: Some("proxy".into()),
            }
        );
        assert_eq!(
            parse_path("/api/v1/pods").unwrap(),
            Target::Collection {
                kind: Kind::Pod,
                ns: None
            }
        );
        assert_eq!(
            parse_path("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-1")
                .unwrap(),
            Target::Object {
                kind: Kind::Lease,
                ns: Some("kube-node-lease".into()),
                name: "node-1".into(),
                sub: None,
            }
        );
        assert_eq!(parse_path("/api/v1/pods/x").unwrap_err().code, 404);
        assert_eq!(
            parse_path("/apis/networking.k8s.io/v1/namespaces/probe/networkpolicies").unwrap(),
            Target::Collection {
                kind: Kind::NetworkPolicy,
                ns: Some("probe".into())
            }
        );
        assert_eq!(parse_path("/api/v1/widgets").unwrap_err().code, 404);
    }
}

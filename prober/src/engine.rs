//! The probe engine both modes share (`prober gate`, `prober run`): connecting, the
//! node list, the start-up (namespace, sweep of dead instances' pods, the shared pod
//! watch, node-agent discovery), the [`crate::probe::ProbeEnv`] every probe runs in, and
//! the cleanup helpers. Nothing here assumes one run: the caller scopes cancellation
//! (per run or per probe, a `watch::Receiver<bool>` given to
//! [`crate::probe::run_probe`]) and decides what a [`crate::probe::EngineFault`] (a
//! forbidden create/delete) means — the gate stops, the continuous mode reports it and
//! carries on.

use crate::agents::scrape::AgentWatcher;
use crate::api::{with_timeout, API_CALL_TIMEOUT};
use crate::config::ProbeArgs;
use crate::console::Console;
use crate::error::{error_chain, kube_error_text, kube_status_code, Error};
use crate::labels::{instance_selector, FIELD_MANAGER};
use crate::podwatch::PodWatch;
use crate::schedule::{filter_nodes, NodeInfo, SkipReason};
use crate::sweep::{sweep, SweepOutcome, SWEEP_GRACE};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use std::sync::Arc;
use std::time::Duration;

/// A connected client: the API client, a no-retry client for agent proxy scrapes, and
/// the API server URL (for error texts).
#[derive(Clone)]
pub struct Connection {
    /// The client (kubeconfig or in-cluster config, `kube::Config::infer`).
    pub client: Client,
    /// One request per scrape ([`crate::agents::scrape::no_retry_client`]).
    pub scrape_client: Client,
    /// `cluster_url` of the configuration.
    pub url: String,
    /// The API outages `client`'s requests met ([`crate::apihealth`]).
    pub health: crate::apihealth::ApiHealth,
}

/// Loads the client configuration and builds the clients. No API call is made.
///
/// `kubeconfig` (`--kubeconfig`) and `context` (`--context`) pick a file and a context
/// in it; with neither, kube-rs `Config::infer` decides (`KUBECONFIG`,
/// `~/.kube/config`, then the in-cluster service account). Errors:
/// [`Error::ClientConfig`] naming the file or context that could not be used.
/// Outages are recorded without a stderr line (see [`connect_with`]).
pub async fn connect(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
) -> Result<Connection, Error> {
    connect_with(kubeconfig, context, crate::apihealth::ApiHealth::new(None)).await
}

/// [`connect`], with every request of the main client recorded in `health`
/// ([`crate::apihealth::ApiHealthLayer`]; the scrape client's pod-proxy requests are
/// not: a 503 there is usually the agent, not the API server).
pub async fn connect_with(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
    health: crate::apihealth::ApiHealth,
) -> Result<Connection, Error> {
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_owned),
        ..Default::default()
    };
    let config = match (kubeconfig, context) {
        (Some(path), _) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| {
                Error::ClientConfig(format!(
                    "--kubeconfig {}: {}",
                    path.display(),
                    error_chain(&e)
                ))
            })?;
            kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|e| {
                    Error::ClientConfig(format!(
                        "--kubeconfig {}{}: {}",
                        path.display(),
                        context
                            .map(|c| format!(" --context {c}"))
                            .unwrap_or_default(),
                        error_chain(&e)
                    ))
                })?
        }
        (None, Some(c)) => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| Error::ClientConfig(format!("--context {c}: {}", error_chain(&e))))?,
        (None, None) => kube::Config::infer()
            .await
            .map_err(|e| Error::ClientConfig(error_chain(&e)))?,
    };
    let url = config.cluster_url.to_string();
    // Agent scrapes through the pod proxy go out once, without kube's retry of 503s: the
    // API server's answer (e.g. "connection refused") is the result.
    let scrape_client = crate::agents::scrape::no_retry_client(config.clone())
        .map_err(|e| Error::ClientConfig(error_chain(&e)))?;
    let client = kube::client::ClientBuilder::try_from(config)
        .map_err(|e| Error::ClientConfig(error_chain(&e)))?
        .with_layer(&crate::apihealth::ApiHealthLayer::new(health.clone()))
        .build();
    Ok(Connection {
        client,
        scrape_client,
        url,
        health,
    })
}

/// [`connect_with`] for a mode's `--kubeconfig`/`--context`, recording outages in
/// `health`, plus the recovery pings that tell when an outage ended
/// ([`crate::apihealth::spawn_recovery_pings`]; they stop when dropped).
pub async fn connect_watched(
    p: &ProbeArgs,
    health: &crate::apihealth::ApiHealth,
) -> Result<(Connection, crate::apihealth::RecoveryPings), Error> {
    let conn = connect_with(
        p.kubeconfig.as_deref(),
        p.context.as_deref(),
        health.clone(),
    )
    .await?;
    let pings = crate::apihealth::spawn_recovery_pings(conn.client.clone(), health.clone());
    Ok((conn, pings))
}

/// Lists the nodes matching `--node-selector` once and splits them into eligible (sorted
/// by name) and skipped ones ([`filter_nodes`]: NotReady, cordoned, untolerated taint).
/// Errors name the verb `list`, `nodes` and the URL.
pub async fn list_nodes(
    conn: &Connection,
    p: &ProbeArgs,
) -> Result<(Vec<NodeInfo>, Vec<(String, SkipReason)>), Error> {
    let nodes_api: Api<Node> = Api::all(conn.client.clone());
    let selector = p.node_selector.to_string();
    // Page by page ([`crate::podwatch::LIST_PAGE_SIZE`]), keeping only each Node's
    // [`NodeInfo`]: a Node is 4–20 KB of JSON, so one list of 1 000 was the gate's peak.
    let mut all_nodes: Vec<NodeInfo> = Vec::new();
    let mut lp = ListParams::default()
        .labels(&selector)
        .limit(crate::podwatch::LIST_PAGE_SIZE);
    loop {
        let page = with_timeout(nodes_api.list(&lp), &conn.url, "list", "nodes").await?;
        all_nodes.extend(page.items.iter().map(NodeInfo::from_node));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => lp = lp.continue_token(&token),
            _ => break,
        }
    }
    for tol in crate::schedule::unmatched_tolerations(&all_nodes, &p.toleration) {
        tracing::warn!(
            "--toleration {tol}: no selected node has a taint it tolerates, so it changes \
             nothing (check the key, value and effect against `kubectl describe node`)"
        );
    }
    Ok(filter_nodes(&all_nodes, &p.node_selector, &p.toleration))
}

/// What the shared start-up brought up.
pub struct Started {
    /// Pods in the probe namespace.
    pub pods: Api<Pod>,
    /// The instance's pod watch (initial list done, watch allowed).
    pub watch: Arc<PodWatch>,
    /// Node-agent discovery and scraping (docs/design.md §3).
    pub agents: AgentWatcher,
    /// What the start-up sweep deleted and kept.
    pub swept: SweepOutcome,
    /// This instance's Lease (`None` when it could not be created: a warning said why).
    pub lease: Option<crate::lease::InstanceLease>,
    /// The task reaping dead instances by their Leases ([`spawn_reaper`]).
    pub reaper: tokio::task::JoinHandle<()>,
}

/// A failed start-up's clean-up: the reaper stopped, the instance Lease released;
/// returns `err`.
async fn give_back(
    lease: Option<crate::lease::InstanceLease>,
    reaper: Option<tokio::task::JoinHandle<()>>,
    err: Error,
) -> Error {
    if let Some(r) = reaper {
        r.abort();
    }
    if let Some(l) = lease {
        l.release().await;
    }
    err
}

/// The shared start-up, in order: ensure the namespace, sweep dead instances' pods
/// (never a live instance's: [`crate::sweep`]), start the pod watch of `instance` and
/// wait for its initial list ([`WATCH_READY_TIMEOUT`]), check that RBAC allows the
/// watch ([`check_watch_allowed`]), start agent discovery and wait for it
/// ([`AGENT_SYNC_TIMEOUT`], not fatal). The console notes what the sweep did. Errors:
/// API errors naming verb, resource and URL; [`Error::WatchNotReady`].
pub async fn start(
    conn: &Connection,
    p: &ProbeArgs,
    instance: &str,
    hold: Duration,
    profiles: Vec<crate::agents::profiles::Profile>,
    console: Console,
    forever_reaper: bool,
) -> Result<Started, Error> {
    let url = &conn.url;
    ensure_namespace(&conn.client, url, &p.namespace).await?;
    let pods: Api<Pod> = Api::namespaced(conn.client.clone(), &p.namespace);
    let lease = match crate::lease::InstanceLease::acquire(
        conn.client.clone(),
        &p.namespace,
        instance,
    )
    .await
    {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::warn!(error = %Error::from_kube(e, url, "create", format!("leases in namespace {}", p.namespace)),
                "no instance Lease: if this prober is killed, its probe pods stay until their \
                 activeDeadlineSeconds instead of being deleted by the next prober");
            None
        }
    };
    let mut reaper = crate::lease::Reaper::new(pods.clone(), url, instance);
    let first = match reaper.pass(true).await {
        Ok(o) => Some(o),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read instance Leases: dead probers' pods are \
                 swept only by their age");
            None
        }
    };
    let max_age = p.give_up * 2 + hold + SWEEP_GRACE;
    // A start-up that fails from here on gives its instance Lease back and stops its
    // reaper: a Lease left behind would make the next prober wait it out as a dead
    // instance's.
    let swept = match sweep(
        &pods,
        &conn.health,
        url,
        &p.namespace,
        instance,
        max_age,
        true,
    )
    .await
    {
        Ok(s) => s,
        Err(e) => return Err(give_back(lease, None, e).await),
    };
    if !swept.deleted.is_empty() {
        console.swept(swept.deleted.len());
    }
    let leased = reaper.leased();
    for k in &swept.kept {
        console.kept_other_instance(k, leased.contains(&k.instance));
    }
    let reaper = spawn_reaper(reaper, first.is_some(), forever_reaper, console);
    let watch = Arc::new(PodWatch::start(pods.clone(), &instance_selector(instance)));
    let ready = async {
        watch.wait_ready(url, WATCH_READY_TIMEOUT).await?;
        // RBAC may allow the list but not the watch: without the watch no probe can ever
        // see its pods Ready, so fail now instead of at the first probe's give-up.
        check_watch_allowed(&pods, url, &p.namespace, &instance_selector(instance)).await
    };
    if let Err(e) = ready.await {
        return Err(give_back(lease, Some(reaper), e).await);
    }
    let agents = AgentWatcher::start_with_scrape_client(
        conn.client.clone(),
        conn.scrape_client.clone(),
        profiles,
        crate::agents::scrape::ScrapeSettings {
            mode: p.agent_scrape.into(),
            ..Default::default()
        },
        crate::agents::correlate::Params::default(),
    );
    if !agents.wait_synced(AGENT_SYNC_TIMEOUT).await {
        tracing::warn!("agent discovery not synced; correlating on what was found");
    }
    Ok(Started {
        pods,
        watch,
        agents,
        swept,
        lease,
        reaper,
    })
}

/// Runs [`crate::lease::Reaper::pass`] every [`crate::lease::RENEW_INTERVAL`] (the first
/// pass already ran at start-up). With `forever` false (the gate) the task ends once no
/// other instance's Lease is [pending](crate::lease::Reaper::pending) — each was seen
/// renewed (alive) or was reaped —, which takes at most one lease duration and a pass;
/// with `forever` (`prober run`) it keeps going to notice instances that die later.
/// When `enabled` is false (the Leases cannot be read) the task ends at once. A failing
/// pass is logged once per outage.
pub fn spawn_reaper(
    mut reaper: crate::lease::Reaper,
    enabled: bool,
    forever: bool,
    console: Console,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if !enabled {
            return;
        }
        let mut failing = false;
        loop {
            if !forever && reaper.pending().is_empty() {
                return;
            }
            tokio::time::sleep(crate::lease::RENEW_INTERVAL).await;
            match reaper.pass(true).await {
                Ok(o) => {
                    failing = false;
                    for i in &o.dead {
                        console.reaped(i);
                    }
                }
                Err(e @ Error::Unreachable { .. }) if !failing => {
                    // Reported once per outage by the client's ApiHealth.
                    tracing::debug!(error = %e, "instance Lease pass got no answer (retrying)");
                    failing = true;
                }
                Err(e) if !failing => {
                    tracing::warn!(error = %e, "instance Lease pass failed (retrying)");
                    failing = true;
                }
                Err(_) => {}
            }
        }
    })
}

/// Loads `--agent-config` (or the built-in profiles). Errors: [`Error::Config`] naming
/// `--agent-config`.
pub fn load_profiles(p: &ProbeArgs) -> Result<Vec<crate::agents::profiles::Profile>, Error> {
    match &p.agent_config {
        Some(path) => {
            crate::agents::profiles::load_profiles_file(path).map_err(|e| Error::Config {
                flag: "--agent-config",
                message: e.to_string(),
            })
        }
        None => Ok(crate::agents::profiles::builtin_profiles()),
    }
}

/// How long the pod watch may take to deliver its initial list.
pub const WATCH_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long node-agent discovery may take to list the agent pods (10 s: one list per
/// profile namespace; correlation works on what was found if it takes longer).
pub const AGENT_SYNC_TIMEOUT: Duration = Duration::from_secs(10);

/// Makes sure the probe namespace `ns` can be used, needing as little RBAC as it can:
///
/// - `GET namespaces/ns` finds it: used as it is (nothing is created or changed);
/// - `404`: it is created (`409 AlreadyExists` from a concurrent creator is fine); a
///   `401`/`403` on that create is [`Error::NamespaceMissing`], which says what to create
///   (`kubectl create namespace NS`) or grant;
/// - `401`/`403` on the GET (a Role limited to the namespace cannot read the Namespace
///   object): not fatal, the namespace is assumed to exist and the run goes on with what
///   the pod permissions allow (the sweep lists pods, the pod watch starts). If it does
///   not exist after all, the first probe pod create is answered `namespaces "NS" not
///   found` and the gate stops on that admission rejection, naming the namespace.
///
/// Other errors name the verb, the namespace and the URL ([`Error::from_kube`]).
pub async fn ensure_namespace(client: &Client, url: &str, ns: &str) -> Result<(), Error> {
    let api: Api<Namespace> = Api::all(client.clone());
    let resource = format!("namespace {ns}");
    match with_timeout(api.get_opt(ns), url, "get", &resource).await {
        Ok(Some(_)) => return Ok(()),
        Ok(None) => {}
        Err(Error::Api {
            code: code @ (401 | 403),
            message,
            ..
        }) => {
            tracing::warn!(namespace = ns, code, error = %message,
                "cannot get the probe namespace; assuming it exists (the pod permissions decide)");
            return Ok(());
        }
        Err(e) => return Err(e),
    }
    let obj = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    let pp = PostParams {
        dry_run: false,
        field_manager: Some(FIELD_MANAGER.into()),
    };
    match with_timeout(api.create(&pp, &obj), url, "create", &resource).await {
        Ok(_) => {
            tracing::info!(namespace = ns, "created namespace");
            Ok(())
        }
        Err(Error::Api { code: 409, .. }) => Ok(()),
        Err(Error::Api {
            code: code @ (401 | 403),
            reason,
            message,
            ..
        }) => Err(Error::NamespaceMissing {
            namespace: ns.to_string(),
            url: url.to_string(),
            cause: format!("HTTP {code} {reason}: {message}"),
        }),
        Err(e) => Err(e),
    }
}

/// One `watch` request on the probe pods (`timeoutSeconds=1`, dropped as soon as the
/// API server accepted it): a `401`/`403` is returned as [`Error::Api`] with verb
/// `watch`, resource `pods in namespace NS` and `url` — the run cannot see its pods, so
/// it stops at start-up (exit 2) instead of waiting for `--timeout`. Any other failure
/// is left to the pod watch's own retries (logged).
pub async fn check_watch_allowed(
    pods: &Api<Pod>,
    url: &str,
    namespace: &str,
    selector: &str,
) -> Result<(), Error> {
    let wp = kube::api::WatchParams::default()
        .labels(selector)
        .timeout(1);
    match tokio::time::timeout(API_CALL_TIMEOUT, pods.watch(&wp, "0")).await {
        Ok(Ok(stream)) => {
            drop(stream);
            Ok(())
        }
        Ok(Err(e)) if matches!(kube_status_code(&e), Some(401) | Some(403)) => Err(
            Error::from_kube(e, url, "watch", format!("pods in namespace {namespace}")),
        ),
        Ok(Err(e)) if crate::apihealth::is_unanswered(&e) => {
            tracing::debug!(error = %kube_error_text(&e), "pod watch check got no answer; the watch retries");
            Ok(())
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %kube_error_text(&e), "pod watch check failed; the watch retries");
            Ok(())
        }
        Err(_) => {
            tracing::warn!("pod watch check got no answer; the watch retries");
            Ok(())
        }
    }
}

/// SIGINT/SIGTERM, installed once; [`Signals::next`] names the next one received. The
/// callers decide what a first and a second signal mean (no process exit in here).
pub struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    /// [`Signals::install`], or the error `prober run` stops on (it must not be killed
    /// without deleting its probe pods).
    pub fn install_or_error() -> Result<Signals, Error> {
        Signals::install().ok_or_else(|| Error::Config {
            flag: "signals",
            message: "cannot install SIGINT/SIGTERM handlers".into(),
        })
    }

    /// Installs the handlers; `None` when the runtime cannot (then the default action,
    /// termination, stays in force).
    pub fn install() -> Option<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            (Ok(int), Ok(term)) => Some(Signals { int, term }),
            _ => None,
        }
    }

    /// Waits for the next signal: `"SIGINT"` or `"SIGTERM"`.
    pub async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "SIGINT",
            _ = self.term.recv() => "SIGTERM",
        }
    }
}

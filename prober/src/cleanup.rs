//! `prober cleanup`: the probe pods and Services of dead prober instances, or of one
//! named instance, listed — and with `--yes` deleted — now, instead of waiting for the
//! next prober's start-up sweep or the pods' `activeDeadlineSeconds`.
//!
//! Dead means what the start-up sweep means ([`crate::sweep::decide`]: the owner pod
//! of an in-cluster instance is gone; a gate's pods are older than their deadline +
//! grace) or, for instances with a Lease, that nobody renewed it for
//! [`crate::lease::LEASE_DURATION`] ([`crate::lease::Reaper`]); telling that takes one
//! lease duration of watching, so `cleanup` watches the Leases that long before it
//! answers. A named `--instance` is taken as the user says: its objects and Lease go at
//! once (a live instance keeps probing and creates new pods; stop it first).
//!
//! Output on stdout: one line per instance (`INSTANCE  STATE  OBJECTS`), then what was
//! (or, without `--yes`, would be) deleted. Exit 0; 2 on an API error (named verb and
//! resource).

use crate::config::CleanupArgs;
use crate::engine::connect;
use crate::error::Error;
use crate::labels::{instance_selector, APP_NAME, LABEL_INSTANCE, LABEL_NAME};
use crate::lease::{delete_lease, lease_name, Reaper, LEASE_DURATION};
use crate::reclaim::delete_instance_pods;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::ListParams;
use kube::Api;
use std::collections::BTreeMap;
use std::time::Duration;

/// Runs `prober cleanup`; returns the exit code.
pub async fn run_cleanup(args: CleanupArgs) -> Result<i32, Error> {
    let conn = connect(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    let url = conn.url.clone();
    let ns = args.namespace.as_str();
    let pods: Api<Pod> = Api::namespaced(conn.client.clone(), ns);
    let services: Api<Service> = Api::namespaced(conn.client.clone(), ns);
    let leases: Api<Lease> = Api::namespaced(conn.client.clone(), ns);
    if let Some(instance) = &args.instance {
        let selector = instance_selector(instance);
        let objects = objects_by_instance(&pods, &services, &url, ns, &selector)
            .await?
            .remove(instance)
            .unwrap_or_default();
        let again = yes_command(&args, Some(instance));
        return cleanup_instance(&pods, &leases, &url, instance, &objects, args.yes, &again).await;
    }

    // Every instance with probe objects, and what the sweep rules say of it.
    let ours = format!("cleanup-{}", std::process::id());
    let swept =
        crate::sweep::sweep(&pods, &conn.health, &url, ns, &ours, Duration::ZERO, false).await?;
    let mut reaper = Reaper::new(pods.clone(), &url, &ours);
    reaper.pass(false).await?;
    let leased = reaper.leased();
    if !leased.is_empty() {
        eprintln!(
            "watching {} instance Lease(s) for {}s to tell dead instances from live ones…",
            leased.len(),
            LEASE_DURATION.as_secs()
        );
        tokio::time::sleep(LEASE_DURATION + Duration::from_secs(1)).await;
    }
    let reaped = reaper.pass(false).await?;
    let selector = format!("{LABEL_NAME}={APP_NAME}");
    let all = objects_by_instance(&pods, &services, &url, ns, &selector).await?;
    let mut dead: Vec<String> = reaped.dead.clone();
    let swept_instances: BTreeMap<String, ()> = all
        .iter()
        .filter(|(_, names)| names.iter().any(|n| swept.deleted.contains(n)))
        .map(|(i, _)| (i.clone(), ()))
        .collect();
    for i in swept_instances.keys() {
        if !dead.contains(i) && !leased.contains(i) {
            dead.push(i.clone());
        }
    }
    dead.sort();
    print_instances(&all, &reaped, &dead);
    if dead.is_empty() {
        println!("nothing to clean up");
        return Ok(0);
    }
    if !args.yes {
        println!(
            "dry run: nothing deleted; `{}` deletes the probe objects of: {}",
            yes_command(&args, None),
            dead.join(", ")
        );
        return Ok(0);
    }
    let mut total = 0;
    for i in &dead {
        total += delete_instance_pods(&pods, i, &url).await?;
    }
    for i in reaped.dead.iter() {
        delete_lease(&leases, &url, i).await?;
    }
    println!(
        "deleted {total} probe object(s) of {} dead instance(s)",
        dead.len()
    );
    Ok(0)
}

/// The command that repeats this dry run with `--yes`: the connection and namespace
/// flags given (issue 31: the hint dropped `--namespace`, so copying it cleaned the
/// default namespace instead), each value shell-quoted when it needs it.
fn yes_command(args: &CleanupArgs, instance: Option<&str>) -> String {
    let quote = |v: &str| {
        if !v.is_empty()
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c))
        {
            v.to_string()
        } else {
            format!("'{}'", v.replace('\'', "'\\''"))
        }
    };
    let mut out = String::from("prober cleanup");
    if let Some(k) = &args.kubeconfig {
        out.push_str(&format!(" --kubeconfig {}", quote(&k.to_string_lossy())));
    }
    if let Some(c) = &args.context {
        out.push_str(&format!(" --context {}", quote(c)));
    }
    out.push_str(&format!(" --namespace {}", quote(&args.namespace)));
    if let Some(i) = instance {
        out.push_str(&format!(" --instance {}", quote(i)));
    }
    out.push_str(" --yes");
    out
}

/// `prober cleanup --instance I`: lists `objects`, and with `yes` deletes them and the
/// instance's Lease.
async fn cleanup_instance(
    pods: &Api<Pod>,
    leases: &Api<Lease>,
    url: &str,
    instance: &str,
    objects: &[String],
    yes: bool,
    again: &str,
) -> Result<i32, Error> {
    println!("instance {instance}: {} probe object(s)", objects.len());
    for o in objects {
        println!("  {o}");
    }
    if !yes {
        println!("dry run: nothing deleted; `{again}` deletes them and the instance's Lease");
        return Ok(0);
    }
    let n = delete_instance_pods(pods, instance, url).await?;
    if delete_lease(leases, url, instance).await? {
        println!("deleted lease/{}", lease_name(instance));
    }
    println!("deleted {n} probe object(s) of {instance}");
    Ok(0)
}

/// The INSTANCE / STATE / OBJECTS table: every instance with probe objects or a Lease,
/// and what the sweep and the reaper concluded of it.
fn print_instances(
    all: &BTreeMap<String, Vec<String>>,
    reaped: &crate::lease::ReapOutcome,
    dead: &[String],
) {
    println!("{:<20} {:<32} OBJECTS", "INSTANCE", "STATE");
    let mut instances: Vec<&String> = all.keys().collect();
    for i in reaped.dead.iter().chain(reaped.watching.iter()) {
        if !instances.contains(&i) {
            instances.push(i);
        }
    }
    instances.sort();
    instances.dedup();
    for i in instances {
        let n = all.get(i).map_or(0, Vec::len);
        let state = if reaped.dead.contains(i) {
            format!("dead (Lease not renewed {}s)", LEASE_DURATION.as_secs())
        } else if dead.contains(i) {
            "dead (owner pod gone / too old)".to_owned()
        } else if reaped.watching.contains(i) {
            "alive (Lease renewed)".to_owned()
        } else {
            "unknown (no Lease; kept)".to_owned()
        };
        println!("{i:<20} {state:<32} {n}");
    }
}

/// `pod/NAME`, `service/NAME` and `networkpolicy/NAME` of the probe objects matching `selector`, by their
/// `firstpacket.io/instance` label (objects without one are left out).
async fn objects_by_instance(
    pods: &Api<Pod>,
    services: &Api<Service>,
    url: &str,
    ns: &str,
    selector: &str,
) -> Result<BTreeMap<String, Vec<String>>, Error> {
    let lp = ListParams::default().labels(selector);
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut add = |kind: &str, md: &ObjectMeta| {
        if let (Some(i), Some(n)) = (
            md.labels.as_ref().and_then(|l| l.get(LABEL_INSTANCE)),
            md.name.as_ref(),
        ) {
            out.entry(i.clone())
                .or_default()
                .push(format!("{kind}/{n}"));
        }
    };
    let pl = pods
        .list(&lp)
        .await
        .map_err(|e| Error::from_kube(e, url, "list", format!("pods in namespace {ns}")))?;
    for p in &pl.items {
        add("pod", &p.metadata);
    }
    let sl = services
        .list(&lp)
        .await
        .map_err(|e| Error::from_kube(e, url, "list", format!("services in namespace {ns}")))?;
    for svc in &sl.items {
        add("service", &svc.metadata);
    }
    // Kinds `policy` and `policy_change` leave NetworkPolicies; without the permission
    // to list them (or an API that has none) there are none of ours to find.
    let policies: Api<NetworkPolicy> = Api::namespaced(pods.clone().into_client(), ns);
    match policies.list(&lp).await {
        Ok(l) => {
            for np in &l.items {
                add("networkpolicy", &np.metadata);
            }
        }
        Err(e) => {
            let e = Error::from_kube(e, url, "list", format!("networkpolicies in namespace {ns}"));
            tracing::warn!(error = %e, "cannot list NetworkPolicies: probe NetworkPolicies are not shown or deleted");
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(flags: &[&str]) -> CleanupArgs {
        let mut argv = vec!["prober", "cleanup"];
        argv.extend_from_slice(flags);
        match crate::config::Cli::try_parse_from(argv)
            .expect("parse")
            .command
        {
            crate::config::Command::Cleanup(a) => a,
            _ => panic!("not cleanup"),
        }
    }

    #[test]
    fn the_dry_run_hint_repeats_the_namespace_and_connection_flags() {
        assert_eq!(
            yes_command(&args(&[]), None),
            "prober cleanup --namespace firstpacket --yes"
        );
        let a = args(&["--namespace", "net-probes", "--context", "prod eu"]);
        assert_eq!(
            yes_command(&a, Some("gate-ab12cd34")),
            "prober cleanup --context 'prod eu' --namespace net-probes --instance gate-ab12cd34 --yes"
        );
    }
}

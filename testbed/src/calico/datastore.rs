//! What real Felix needs in the Kubernetes datastore before it programs anything, and
//! the `policies: N` load (docs/design.md §5 "Real node components").
//!
//! Felix in Kubernetes-datastore mode reads Calico's own resources
//! (`crd.projectcalico.org/v1`) beside core Pods, Namespaces and NetworkPolicies. It
//! needs (checked against kube-apiserver v1.36.3 with Felix v3.29.5 and v3.31.7):
//! - that version's CustomResourceDefinitions (`libcalico-go/config/crd/*.yaml`, copied
//!   into the build cache by `scripts/calico.sh`), created or replaced ([`apply_crds`]);
//!   an upgrade's new kinds (v3.31.7 adds four) arrive with its first roll;
//! - ClusterInformation `default` with `datastoreReady: true` (Felix waits for it:
//!   felix/daemon/daemon.go);
//! - FelixConfiguration `default` ([`felix_configuration`]): `defaultEndpointToHostAction:
//!   Accept`, the value Calico's own `manifests/calico.yaml` sets for calico-node
//!   (`FELIX_DEFAULTENDPOINTTOHOSTACTION=ACCEPT`; Felix's built-in default is `Drop`),
//!   the iptables nf_tables backend, BPF and XDP off (the testbed's Felix is built without
//!   cgo, which BPF/XDP need), and `ipv6Support` only on a dual-stack testbed (`testbed up
//!   --ip-families ipv4,ipv6`): Felix then programs `ip6tables` beside `iptables`
//!   (felix/config/config_params.go `Ipv6Support`; felix/dataplane/linux/int_dataplane.go
//!   builds the IPv6 tables, endpoint and route managers only `if config.IPv6Enabled`);
//! - an IPPool over the cluster's pod CIDR with IPIP and VXLAN off: the testbed routes
//!   every node's pod block to that node itself, as BGP would ([`ip_pool`]); on a
//!   dual-stack testbed a second one over its IPv6 ULA prefix ([`ip_pool6`]), as
//!   calico-node creates `default-ipv6-ippool` from `CALICO_IPV6POOL_CIDR`
//!   (node/pkg/lifecycle/startup/startup.go);
//! - Tier `default` (order 1 000 000, Calico's `DefaultTierOrder`,
//!   api/pkg/apis/projectcalico/v3/tier.go).
//!
//! No Calico Node resource is needed: Felix takes its name from `FELIX_FELIXHOSTNAME`
//! and the pod IPs from the Pods' `status.podIPs`.

use crate::client::{ApiCallError, ApiClient};
use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

/// API group and version of Calico's CRD-backed resources in Kubernetes-datastore mode.
pub const CRD_API: &str = "crd.projectcalico.org/v1";

/// Namespace of the `policies: N` load (NetworkPolicies selecting only the load's own
/// workload pods, [`load_policy`]).
pub const POLICY_LOAD_NAMESPACE: &str = "testbed-policy-load";

/// How long [`apply_crds`] waits for every CRD to be Established.
const ESTABLISHED_TIMEOUT: Duration = Duration::from_secs(60);

const CRD_PATH: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";

/// Path of a cluster-scoped `crd.projectcalico.org/v1` object (`plural` lower-case).
fn calico_path(plural: &str, name: Option<&str>) -> String {
    match name {
        Some(n) => format!("/apis/{CRD_API}/{plural}/{n}"),
        None => format!("/apis/{CRD_API}/{plural}"),
    }
}

/// The CRDs in `dir` (every `*.yaml`, one CustomResourceDefinition each), sorted by
/// file name. Errors: unreadable dir or file, a file that is not a CRD.
pub fn read_crds(dir: &Path) -> Result<Vec<Value>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("read the CRD directory {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).with_context(|| format!("read {}", f.display()))?;
        let v: Value = serde_yaml_ng::from_str(&text)
            .with_context(|| format!("parse {} as YAML", f.display()))?;
        if v["kind"] != "CustomResourceDefinition" || v["metadata"]["name"].as_str().is_none() {
            bail!("{} is not a CustomResourceDefinition", f.display());
        }
        out.push(v);
    }
    if out.is_empty() {
        bail!("no CRD files in {}", dir.display());
    }
    Ok(out)
}

/// Creates every CRD of `dir`, replacing one that exists (the new version's schema
/// wins, as `kubectl apply` of a release's manifests would), then waits until each is
/// Established. Returns the names. Errors: the files ([`read_crds`]), a refused call,
/// a CRD not Established within 60 s.
pub async fn apply_crds(api: &ApiClient, dir: &Path) -> Result<Vec<String>> {
    let crds = read_crds(dir)?;
    let mut names = Vec::new();
    for mut crd in crds {
        let name = crd["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        create_or_replace(api, CRD_PATH, &format!("{CRD_PATH}/{name}"), &mut crd)
            .await
            .with_context(|| format!("apply CRD {name}"))?;
        names.push(name);
    }
    let deadline = tokio::time::Instant::now() + ESTABLISHED_TIMEOUT;
    for name in &names {
        loop {
            let established = api
                .get(&format!("{CRD_PATH}/{name}"))
                .await
                .ok()
                .is_some_and(|c| {
                    c["status"]["conditions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|c| c["type"] == "Established" && c["status"] == "True")
                });
            if established {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                bail!("CRD {name} not Established within {ESTABLISHED_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(names)
}

/// POST `obj` to `collection`; when it exists (409), PUT it over `path` with the
/// stored resourceVersion. Errors: any other refusal.
async fn create_or_replace(
    api: &ApiClient,
    collection: &str,
    path: &str,
    obj: &mut Value,
) -> Result<(), ApiCallError> {
    for _ in 0..5 {
        match api.post(collection, obj).await {
            Ok(_) => return Ok(()),
            Err(e) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
        let current = api.get(path).await?;
        obj["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
        match api.put(path, obj).await {
            Ok(_) => return Ok(()),
            // Changed or deleted meanwhile: try again.
            Err(e) if e.code == 409 || e.code == 404 => continue,
            Err(e) => return Err(e),
        }
    }
    api.put(path, obj).await.map(drop)
}

/// The FelixConfiguration `default` the testbed runs every Felix with (module docs).
/// `ipv6`: the testbed is dual-stack, and Felix programs IPv6 too (`ipv6Support`,
/// felix/config/config_params.go; its IPv6 rules are the IPv4 ones rendered for
/// `ip6tables`, felix/rules/static.go and felix/rules/dispatch.go, written through
/// `ip6tables-nft-restore`, felix/environment/feature_detect_linux.go).
pub fn felix_configuration(ipv6: bool) -> Value {
    json!({
        "apiVersion": CRD_API, "kind": "FelixConfiguration",
        "metadata": { "name": "default" },
        "spec": {
            // Calico's manifests/calico.yaml: FELIX_DEFAULTENDPOINTTOHOSTACTION=ACCEPT.
            "defaultEndpointToHostAction": "Accept",
            "iptablesBackend": "NFT",
            "ipv6Support": ipv6,
            "bpfEnabled": false,
            "xdpEnabled": false,
            "usageReportingEnabled": false,
            "prometheusMetricsEnabled": true,
            "healthEnabled": true,
            "logSeverityScreen": "Info",
            "reportingInterval": "0s",
            "endpointStatusPathPrefix": "/var/run/calico",
        },
    })
}

/// The IPPool over `cidr` (the cluster's pod CIDR): IPIP and VXLAN off, no NAT, /24
/// blocks as the testbed hands out.
pub fn ip_pool(cidr: &str) -> Value {
    pool("default-ipv4-ippool", cidr, 24)
}

/// The IPv6 IPPool over `cidr` (a dual-stack testbed's ULA `/48`, which holds every
/// node's `/120` pod block, [`crate::plan`]): IPIP and VXLAN off, no NAT, `/120` blocks
/// as the testbed hands out (Calico's IPv6 default is 122,
/// libcalico-go/lib/validator/v3/validator.go; the pool must be at least one block).
/// The name is calico-node's (`default-ipv6-ippool`, node/pkg/lifecycle/startup/startup.go).
/// The `/48` also holds the underlay's `G::/64`; Felix's iptables dataplane looks at the
/// pools' members for NAT-outgoing, DSCP and encapsulation (felix/rules/nat.go,
/// felix/rules/static.go), none of which the testbed uses.
pub fn ip_pool6(cidr: &str) -> Value {
    pool("default-ipv6-ippool", cidr, 120)
}

/// An IPPool `name` over `cidr` with `block_size` blocks, no encapsulation, no NAT.
fn pool(name: &str, cidr: &str, block_size: u8) -> Value {
    json!({
        "apiVersion": CRD_API, "kind": "IPPool",
        "metadata": { "name": name },
        "spec": {
            "cidr": cidr, "blockSize": block_size, "ipipMode": "Never", "vxlanMode": "Never",
            "natOutgoing": false, "nodeSelector": "all()",
        },
    })
}

/// Installs `crd_dir`'s CRDs and the resources of the module docs for Felix `version`
/// over pod CIDR `pool_cidr` and, on a dual-stack testbed, the IPv6 pod prefix
/// `pool6_cidr` (Felix then runs with `ipv6Support`). Idempotent (existing objects are
/// replaced). Errors: the first refused step, named.
pub async fn install(
    api: &ApiClient,
    crd_dir: &Path,
    version: &str,
    pool_cidr: &str,
    pool6_cidr: Option<&str>,
) -> Result<()> {
    apply_crds(api, crd_dir).await?;
    let guid = format!("{:032x}", rand::random::<u128>());
    let mut objects = vec![
        (
            "clusterinformations",
            json!({
                "apiVersion": CRD_API, "kind": "ClusterInformation",
                "metadata": { "name": "default" },
                "spec": { "datastoreReady": true, "clusterType": "k8s,testbed",
                          "calicoVersion": version, "clusterGUID": guid },
            }),
        ),
        (
            "felixconfigurations",
            felix_configuration(pool6_cidr.is_some()),
        ),
        ("ippools", ip_pool(pool_cidr)),
        (
            "tiers",
            json!({
                "apiVersion": CRD_API, "kind": "Tier",
                "metadata": { "name": "default" },
                "spec": { "order": 1_000_000.0 },
            }),
        ),
    ];
    if let Some(cidr) = pool6_cidr {
        objects.push(("ippools", ip_pool6(cidr)));
    }
    for (plural, mut obj) in objects {
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        create_or_replace(
            api,
            &calico_path(plural, None),
            &calico_path(plural, Some(&name)),
            &mut obj,
        )
        .await
        .map_err(|e| anyhow!("create {plural}/{name}: {e}"))?;
    }
    Ok(())
}

/// Label of the `policies: N` load's workload pods (value `workload`): every load policy
/// selects them.
pub const POLICY_LOAD_LABEL: &str = "testbed.firstpacket.io/policy-load";

/// The `i`-th load NetworkPolicy: it isolates the load's own workload pods (one per node,
/// [`load_pod`]) for ingress and admits, on TCP port `8000 + i % 1000`, every pod of every
/// namespace that lacks the label `testbed.firstpacket.io/load-{i}` (nobody has it). So
/// every Felix has all N policies active on a local endpoint, each with an IP set of its
/// own holding every pod's IP (a distinct selector per policy): a new pod's IP goes into
/// N sets on every node, as in a cluster with thousands of policies whose rules select
/// broadly; and no pod the prober creates is selected (its isolation is its own).
pub fn load_policy(i: u32) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": { "name": format!("load-{i}"), "namespace": POLICY_LOAD_NAMESPACE,
                      "labels": { "app.kubernetes.io/managed-by": "testbed" } },
        "spec": {
            "podSelector": { "matchLabels": { POLICY_LOAD_LABEL: "workload" } },
            "policyTypes": ["Ingress"],
            "ingress": [{ "from": [{
                              "namespaceSelector": {},
                              "podSelector": { "matchExpressions": [{
                                  "key": format!("testbed.firstpacket.io/load-{i}"),
                                  "operator": "DoesNotExist" }] } }],
                          "ports": [{ "protocol": "TCP", "port": 8000 + (i % 1000) }] }],
        },
    })
}

/// The load's workload pod on `node` (`load-NODE`, [`POLICY_LOAD_LABEL`]`: workload`): a
/// `target-server serve` of the release's image under the restricted Pod Security
/// profile, bound to the node.
pub fn load_pod(node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": format!("load-{node}"), "namespace": POLICY_LOAD_NAMESPACE,
                      "labels": { POLICY_LOAD_LABEL: "workload",
                                  "app.kubernetes.io/managed-by": "testbed" } },
        "spec": {
            "nodeName": node,
            "securityContext": { "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                                 "seccompProfile": { "type": "RuntimeDefault" } },
            "containers": [{
                "name": "serve",
                "image": concat!("ghcr.io/firstpacket/target-server:", env!("CARGO_PKG_VERSION")),
                "args": ["serve", "--port", "8080"],
                "securityContext": { "allowPrivilegeEscalation": false,
                                     "capabilities": { "drop": ["ALL"] } },
            }],
        },
    })
}

/// Brings the `policies: N` load to `n` NetworkPolicies (`load-0`…`load-{n-1}` in
/// [`POLICY_LOAD_NAMESPACE`], created with the namespace when missing; extra ones
/// deleted) with one [`load_pod`] per node of `nodes` while `n > 0` (deleted at 0).
/// `have` is how many exist (as this function last left them). Returns the new count.
/// Errors: a refused call (the count reached so far is lost only for this call: the
/// next one starts from `have`).
pub async fn sync_policy_load(api: &ApiClient, nodes: &[String], have: u32, n: u32) -> Result<u32> {
    let pods = format!("/api/v1/namespaces/{POLICY_LOAD_NAMESPACE}/pods");
    if n > have {
        let ns = json!({ "apiVersion": "v1", "kind": "Namespace",
                         "metadata": { "name": POLICY_LOAD_NAMESPACE } });
        match api.post("/api/v1/namespaces", &ns).await {
            Ok(_) => {}
            Err(e) if e.code == 409 => {}
            Err(e) => return Err(anyhow!("create namespace {POLICY_LOAD_NAMESPACE}: {e}")),
        }
        let path = format!(
            "/apis/networking.k8s.io/v1/namespaces/{POLICY_LOAD_NAMESPACE}/networkpolicies"
        );
        for i in have..n {
            match api.post(&path, &load_policy(i)).await {
                Ok(_) => {}
                Err(e) if e.code == 409 => {}
                Err(e) => return Err(anyhow!("create NetworkPolicy load-{i}: {e}")),
            }
        }
        for node in nodes {
            match api.post(&pods, &load_pod(node)).await {
                Ok(_) => {}
                Err(e) if e.code == 409 => {}
                Err(e) => return Err(anyhow!("create Pod load-{node}: {e}")),
            }
        }
    } else {
        for i in n..have {
            let path = format!(
                "/apis/networking.k8s.io/v1/namespaces/{POLICY_LOAD_NAMESPACE}/networkpolicies/load-{i}"
            );
            match api.delete(&path, &json!({})).await {
                Ok(_) => {}
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(anyhow!("delete NetworkPolicy load-{i}: {e}")),
            }
        }
        if n == 0 {
            for node in nodes {
                match api.delete(&format!("{pods}/load-{node}"), &json!({})).await {
                    Ok(_) => {}
                    Err(e) if e.code == 404 => {}
                    Err(e) => return Err(anyhow!("delete Pod load-{node}: {e}")),
                }
            }
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn felix_configuration_sets_calicos_manifest_endpoint_to_host_action() {
        let c = felix_configuration(false);
        assert_eq!(c["spec"]["defaultEndpointToHostAction"], "Accept");
        assert_eq!(c["spec"]["iptablesBackend"], "NFT");
        assert_eq!(c["spec"]["ipv6Support"], false);
        assert_eq!(c["apiVersion"], "crd.projectcalico.org/v1");
        assert_eq!(felix_configuration(true)["spec"]["ipv6Support"], true);
    }

    #[test]
    fn ip_pool_routes_natively() {
        let p = ip_pool("10.7.0.0/16");
        assert_eq!(p["spec"]["cidr"], "10.7.0.0/16");
        assert_eq!(p["spec"]["ipipMode"], "Never");
        assert_eq!(p["spec"]["vxlanMode"], "Never");
        let p6 = ip_pool6("fd12:3456:789a::/48");
        assert_eq!(p6["metadata"]["name"], "default-ipv6-ippool");
        assert_eq!(p6["spec"]["cidr"], "fd12:3456:789a::/48");
        assert_eq!(p6["spec"]["blockSize"], 120);
        assert_ne!(p6["metadata"]["name"], p["metadata"]["name"]);
    }

    #[test]
    fn load_policies_select_their_workload_pods_and_admit_every_pod_by_a_set_of_their_own() {
        let p = load_policy(3);
        assert_eq!(p["metadata"]["name"], "load-3");
        let sel = &p["spec"]["podSelector"]["matchLabels"];
        assert_eq!(sel[POLICY_LOAD_LABEL], "workload");
        assert!(sel.get("app.kubernetes.io/name").is_none());
        let peer = &p["spec"]["ingress"][0]["from"][0];
        assert_eq!(peer["namespaceSelector"], json!({}));
        let e = &peer["podSelector"]["matchExpressions"][0];
        assert_eq!(e["operator"], "DoesNotExist");
        assert_ne!(
            e["key"],
            load_policy(4)["spec"]["ingress"][0]["from"][0]["podSelector"]["matchExpressions"][0]
                ["key"]
        );
        let pod = load_pod("node-2");
        assert_eq!(pod["metadata"]["labels"][POLICY_LOAD_LABEL], "workload");
        assert_eq!(pod["spec"]["nodeName"], "node-2");
    }

    #[test]
    fn crds_are_read_sorted_and_checked() {
        let dir = std::env::temp_dir().join(format!("fp-crds-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("b.yaml"),
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: tiers.crd.projectcalico.org\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("a.yaml"),
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: ippools.crd.projectcalico.org\n",
        )
        .unwrap();
        let crds = read_crds(&dir).unwrap();
        assert_eq!(crds[0]["metadata"]["name"], "ippools.crd.projectcalico.org");
        assert_eq!(crds.len(), 2);
        std::fs::write(dir.join("c.yaml"), "kind: ConfigMap\nmetadata: {name: x}\n").unwrap();
        assert!(read_crds(&dir)
            .unwrap_err()
            .to_string()
            .contains("not a CustomResourceDefinition"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

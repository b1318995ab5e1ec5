//! core/v1 Service registry logic: defaults, a validation subset, and ClusterIP /
//! NodePort allocation (k8s.io/kubernetes `pkg/apis/core/v1/defaults.go`
//! `SetDefaults_Service`, `pkg/apis/core/validation/validation.go` `ValidateService`,
//! `pkg/registry/core/service/storage/alloc.go`).
//!
//! The service CIDR of a testbed comes from its plan ([`service_cidr`]); the store holds
//! it ([`crate::api::Store::set_service_cidr`]) and allocates under its lock, so two
//! concurrent creates never get the same ClusterIP.

use crate::plan::Ipv4Cidr;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::net::Ipv4Addr;

/// One validation cause: (reason, field, message), as [`crate::api::ApiError::invalid`]
/// takes them.
pub(crate) type Cause = (String, String, String);

/// Service CIDR of a store nobody configured (in-process tests): `10.250.0.0/16`.
/// Outside every plan's pod blocks (`10.<0..=199>.<i>.0/24`) and every plan's
/// [`service_cidr`] (`10.200.0.0`–`10.249.255.255`).
pub const DEFAULT_SERVICE_CIDR: Ipv4Cidr = Ipv4Cidr {
    addr: Ipv4Addr::new(10, 250, 0, 0),
    prefix_len: 16,
};

/// NodePort range (kube-apiserver's default `--service-node-port-range`).
pub const NODE_PORT_RANGE: std::ops::RangeInclusive<u16> = 30000..=32767;

/// The service CIDR (kube-apiserver `--service-cluster-ip-range`) of the testbed whose
/// plan has hash index `plan_index` (`Plan::index`, 0..=199): a /18 (16 382 ClusterIPs)
/// at `10.200.0.0 + index·16384`, i.e. `10.<200 + index/4>.<(index%4)·64>.0/18`, so
/// the CIDRs of all 200 indexes tile `10.200.0.0`–`10.249.255.255`. That cannot collide
/// with any plan's pod blocks (`10.<index>.<i>.0/24`, index < 200), with the underlay
/// (`172.20.<index>.0/24`) or with [`DEFAULT_SERVICE_CIDR`], and two testbeds get
/// different ranges. (A real cluster's default is `10.96.0.0/12`, which would overlap
/// the pod blocks of indexes 96–111 here.)
pub fn service_cidr(plan_index: u8) -> Ipv4Cidr {
    let base = u32::from(Ipv4Addr::new(10, 200, 0, 0)) + u32::from(plan_index) * 16384;
    Ipv4Cidr {
        addr: Ipv4Addr::from(base),
        prefix_len: 18,
    }
}

fn cause(reason: &str, field: &str, message: String) -> Cause {
    (reason.into(), field.into(), message)
}

fn set_default(m: &mut Value, key: &str, v: Value) {
    if let Some(o) = m.as_object_mut() {
        o.entry(key.to_string()).or_insert(v);
    }
}

/// `spec.type`, default `ClusterIP`.
fn svc_type(obj: &Value) -> &str {
    obj["spec"]["type"].as_str().unwrap_or("ClusterIP")
}

/// Whether the Service gets a ClusterIP (every type but `ExternalName`, unless headless:
/// `clusterIP: None`).
fn wants_cluster_ip(obj: &Value) -> bool {
    svc_type(obj) != "ExternalName" && obj["spec"]["clusterIP"].as_str() != Some("None")
}

/// Service defaults (`SetDefaults_Service`): `type: ClusterIP`, `sessionAffinity: None`,
/// per port `protocol: TCP` and `targetPort` = `port`; `internalTrafficPolicy: Cluster`
/// and single-stack IPv4 families (all but `ExternalName`); `externalTrafficPolicy:
/// Cluster` for NodePort/LoadBalancer; `clusterIPs` from `clusterIP`; status
/// `{loadBalancer: {}}`.
pub(crate) fn default_service(obj: &mut Value) {
    if !obj["spec"].is_object() {
        obj["spec"] = json!({});
    }
    let spec = &mut obj["spec"];
    set_default(spec, "type", json!("ClusterIP"));
    set_default(spec, "sessionAffinity", json!("None"));
    if let Some(ports) = spec["ports"].as_array_mut() {
        for p in ports {
            set_default(p, "protocol", json!("TCP"));
            if p["targetPort"].is_null() || p["targetPort"] == json!(0) {
                p["targetPort"] = p["port"].clone();
            }
        }
    }
    let ty = spec["type"].as_str().unwrap_or("ClusterIP").to_string();
    if ty != "ExternalName" {
        set_default(spec, "internalTrafficPolicy", json!("Cluster"));
        set_default(spec, "ipFamilies", json!(["IPv4"]));
        set_default(spec, "ipFamilyPolicy", json!("SingleStack"));
    }
    if ty == "NodePort" || ty == "LoadBalancer" {
        set_default(spec, "externalTrafficPolicy", json!("Cluster"));
    }
    if ty == "LoadBalancer" {
        set_default(spec, "allocateLoadBalancerNodePorts", json!(true));
    }
    // clusterIPs[0] mirrors clusterIP (both directions, as the registry normalises).
    let ip = spec["clusterIP"].as_str().unwrap_or("").to_string();
    let ips0 = spec["clusterIPs"][0].as_str().unwrap_or("").to_string();
    if !ip.is_empty() && ips0.is_empty() {
        spec["clusterIPs"] = json!([ip]);
    } else if ip.is_empty() && !ips0.is_empty() {
        spec["clusterIP"] = json!(ips0);
    }
    if !obj["status"].is_object() {
        obj["status"] = json!({"loadBalancer": {}});
    }
}

/// IANA service name as a named `targetPort` (`validation.IsValidPortName`): 1–15
/// characters, lower-case alphanumerics and `-`, at least one letter, no leading,
/// trailing or double `-`.
fn is_port_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 15
        && s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && s.bytes().any(|c| c.is_ascii_lowercase())
        && !s.starts_with('-')
        && !s.ends_with('-')
        && !s.contains("--")
}

fn port_in_range(v: &Value) -> bool {
    v.as_i64().is_some_and(|p| (1..=65535).contains(&p))
}

/// Validation subset of `ValidateService` on a defaulted Service: `spec.type`, ports
/// (required unless headless or ExternalName; `port` 1–65535; `protocol`
/// TCP/UDP/SCTP; names required when there are several and unique; `targetPort` a port
/// number or an IANA port name), `externalName` for ExternalName, `clusterIP` /
/// `clusterIPs[0]` a valid IPv4 address, `None` or empty and consistent with each other.
pub(crate) fn validate_service(obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let spec = &obj["spec"];
    let ty = svc_type(obj);
    if !matches!(
        ty,
        "ClusterIP" | "NodePort" | "LoadBalancer" | "ExternalName"
    ) {
        causes.push(cause(
            "FieldValueNotSupported",
            "spec.type",
            format!("Unsupported value: \"{ty}\": supported values: \"ClusterIP\", \"ExternalName\", \"LoadBalancer\", \"NodePort\""),
        ));
    }
    let ports = spec["ports"].as_array().cloned().unwrap_or_default();
    let headless = spec["clusterIP"].as_str() == Some("None");
    if ports.is_empty() && !headless && ty != "ExternalName" {
        causes.push(cause(
            "FieldValueRequired",
            "spec.ports",
            "Required value".into(),
        ));
    }
    let mut names = HashSet::new();
    for (i, p) in ports.iter().enumerate() {
        let f = |s: &str| format!("spec.ports[{i}].{s}");
        let name = p["name"].as_str().unwrap_or("");
        if ports.len() > 1 && name.is_empty() {
            causes.push(cause(
                "FieldValueRequired",
                &f("name"),
                "Required value".into(),
            ));
        } else if !name.is_empty() && !names.insert(name.to_string()) {
            causes.push(cause(
                "FieldValueDuplicate",
                &f("name"),
                format!("Duplicate value: \"{name}\""),
            ));
        }
        if !port_in_range(&p["port"]) {
            causes.push(cause(
                "FieldValueInvalid",
                &f("port"),
                format!(
                    "Invalid value: {}: must be between 1 and 65535, inclusive",
                    p["port"]
                ),
            ));
        }
        let proto = p["protocol"].as_str().unwrap_or("TCP");
        if !matches!(proto, "TCP" | "UDP" | "SCTP") {
            causes.push(cause(
                "FieldValueNotSupported",
                &f("protocol"),
                format!(
                    "Unsupported value: \"{proto}\": supported values: \"SCTP\", \"TCP\", \"UDP\""
                ),
            ));
        }
        let tp = &p["targetPort"];
        let tp_ok = match tp {
            Value::Number(_) => port_in_range(tp),
            Value::String(s) => is_port_name(s),
            _ => false,
        };
        if !tp_ok {
            causes.push(cause(
                "FieldValueInvalid",
                &f("targetPort"),
                format!("Invalid value: {tp}: must be a port number between 1 and 65535, inclusive, or an IANA service name"),
            ));
        }
    }
    if ty == "ExternalName" && spec["externalName"].as_str().unwrap_or("").is_empty() {
        causes.push(cause(
            "FieldValueRequired",
            "spec.externalName",
            "Required value".into(),
        ));
    }
    let ip = spec["clusterIP"].as_str().unwrap_or("");
    let ips0 = spec["clusterIPs"][0].as_str().unwrap_or("");
    if !ip.is_empty() && !ips0.is_empty() && ip != ips0 {
        causes.push(cause(
            "FieldValueInvalid",
            "spec.clusterIPs[0]",
            format!("Invalid value: \"{ips0}\": must match `clusterIP` when both are specified"),
        ));
    }
    if !ip.is_empty() && ip != "None" && ip.parse::<Ipv4Addr>().is_err() {
        causes.push(cause(
            "FieldValueInvalid",
            "spec.clusterIPs[0]",
            format!("Invalid value: \"{ip}\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"),
        ));
    }
    if ty == "ExternalName" && !ip.is_empty() && ip != "None" {
        causes.push(cause(
            "FieldValueInvalid",
            "spec.clusterIPs",
            format!("Invalid value: [\"{ip}\"]: may not be set for ExternalName services"),
        ));
    }
    causes
}

/// The ClusterIPs and NodePorts held by `others` (every other Service).
fn in_use<'a>(others: impl Iterator<Item = &'a Value>) -> (HashSet<Ipv4Addr>, HashSet<i64>) {
    let mut ips = HashSet::new();
    let mut node_ports = HashSet::new();
    for s in others {
        if let Some(ip) = s["spec"]["clusterIP"]
            .as_str()
            .and_then(|s| s.parse::<Ipv4Addr>().ok())
        {
            ips.insert(ip);
        }
        for p in s["spec"]["ports"].as_array().into_iter().flatten() {
            if let Some(n) = p["nodePort"].as_i64() {
                node_ports.insert(n);
            }
        }
    }
    (ips, node_ports)
}

/// Fills what the Service still lacks and checks what it asks for, against the
/// ClusterIPs and NodePorts of `others`:
/// - ClusterIP (all but ExternalName and headless): a given one must lie in `cidr`
///   (not its network or broadcast address) and be free; an empty one gets a random
///   free address of `cidr` at offset ≥ 10 (kube-apiserver's bitmap allocator scans
///   from a random offset; offsets below 10 stay free for explicit requests, like its
///   static sub-range, `.1` being the `kubernetes` Service's by convention).
/// - NodePort (NodePort/LoadBalancer): a given one must lie in [`NODE_PORT_RANGE`] and be
///   free; a missing one gets a random free port.
///
/// Errors: the causes, with the allocator's messages (`failed to allocate IP …:
/// provided IP is already allocated`, `… is not in the valid range. The range of valid
/// IPs is …`; `provided port is already allocated`).
pub(crate) fn allocate<'a>(
    obj: &mut Value,
    others: impl Iterator<Item = &'a Value>,
    cidr: Ipv4Cidr,
) -> Result<(), Vec<Cause>> {
    let (ips, node_ports) = in_use(others);
    let mut causes = Vec::new();
    if wants_cluster_ip(obj) {
        let given = obj["spec"]["clusterIP"].as_str().unwrap_or("").to_string();
        let size: u32 = if cidr.prefix_len >= 32 {
            1
        } else {
            1u32 << (32 - u32::from(cidr.prefix_len))
        };
        if given.is_empty() {
            let lo = 10u32.min(size.saturating_sub(2));
            let hi = size.saturating_sub(2); // last usable offset (broadcast excluded)
            let span = hi.saturating_sub(lo) + 1;
            let start = rand::random_range(0..span.max(1));
            let free = (0..span)
                .map(|k| cidr.nth(lo + (start + k) % span))
                .find(|ip| !ips.contains(ip));
            match free {
                Some(ip) => {
                    obj["spec"]["clusterIP"] = json!(ip.to_string());
                    obj["spec"]["clusterIPs"] = json!([ip.to_string()]);
                }
                None => causes.push(cause(
                    "FieldValueInvalid",
                    "spec.clusterIPs",
                    format!("Invalid value: []: failed to allocate IP: range is full (service CIDR {cidr})"),
                )),
            }
        } else if let Ok(ip) = given.parse::<Ipv4Addr>() {
            let offset = u32::from(ip).wrapping_sub(u32::from(cidr.addr));
            if !cidr.contains(ip) || offset == 0 || offset >= size.saturating_sub(1) {
                causes.push(cause(
                    "FieldValueInvalid",
                    "spec.clusterIPs",
                    format!("Invalid value: [\"{ip}\"]: failed to allocate IP {ip}: the provided IP ({ip}) is not in the valid range. The range of valid IPs is {cidr}"),
                ));
            } else if ips.contains(&ip) {
                causes.push(cause(
                    "FieldValueInvalid",
                    "spec.clusterIPs",
                    format!("Invalid value: [\"{ip}\"]: failed to allocate IP {ip}: provided IP is already allocated"),
                ));
            } else {
                obj["spec"]["clusterIPs"] = json!([ip.to_string()]);
            }
        }
    } else if svc_type(obj) == "ExternalName" {
        if let Some(m) = obj["spec"].as_object_mut() {
            m.remove("clusterIPs");
            m.remove("clusterIP");
        }
    } else {
        obj["spec"]["clusterIPs"] = json!(["None"]);
    }
    if matches!(svc_type(obj), "NodePort" | "LoadBalancer") {
        let mut taken = node_ports;
        if let Some(ports) = obj["spec"]["ports"].as_array_mut() {
            for (i, p) in ports.iter_mut().enumerate() {
                match p["nodePort"].as_i64() {
                    Some(n)
                        if !(i64::from(*NODE_PORT_RANGE.start())
                            ..=i64::from(*NODE_PORT_RANGE.end()))
                            .contains(&n) =>
                    {
                        causes.push(cause(
                            "FieldValueInvalid",
                            &format!("spec.ports[{i}].nodePort"),
                            format!("Invalid value: {n}: provided port is not in the valid range. The range of valid ports is {}-{}", NODE_PORT_RANGE.start(), NODE_PORT_RANGE.end()),
                        ));
                    }
                    Some(n) if !taken.insert(n) => {
                        causes.push(cause(
                            "FieldValueInvalid",
                            &format!("spec.ports[{i}].nodePort"),
                            format!("Invalid value: {n}: provided port is already allocated"),
                        ));
                    }
                    Some(_) => {}
                    None => {
                        let span = i64::from(NODE_PORT_RANGE.end() - NODE_PORT_RANGE.start()) + 1;
                        let start = rand::random_range(0..span);
                        let base = i64::from(*NODE_PORT_RANGE.start());
                        if let Some(n) = (0..span)
                            .map(|k| base + (start + k) % span)
                            .find(|n| !taken.contains(n))
                        {
                            taken.insert(n);
                            p["nodePort"] = json!(n);
                        }
                    }
                }
            }
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(causes)
    }
}

/// Update rules: values the registry allocated carry over when the new object leaves
/// them empty (`patchAllocatedValues` in `pkg/registry/core/service/storage/storage.go`:
/// `clusterIP`/`clusterIPs` while neither side is ExternalName, `nodePort` per
/// port/protocol while both sides need node ports); a set ClusterIP may not change
/// (`spec.clusterIPs[0]: … may not change once set`). Returns the causes (empty = OK).
pub(crate) fn carry_over(old: &Value, new: &mut Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    if !new["spec"].is_object() {
        new["spec"] = json!({});
    }
    let old_ip = old["spec"]["clusterIP"].as_str().unwrap_or("").to_string();
    let both_have_ip = svc_type(old) != "ExternalName" && svc_type(new) != "ExternalName";
    if both_have_ip {
        let new_ip = new["spec"]["clusterIP"].as_str().unwrap_or("").to_string();
        let new_ips0 = new["spec"]["clusterIPs"][0]
            .as_str()
            .unwrap_or("")
            .to_string();
        let wanted = if new_ip.is_empty() { new_ips0 } else { new_ip };
        if wanted.is_empty() {
            new["spec"]["clusterIP"] = old["spec"]["clusterIP"].clone();
            new["spec"]["clusterIPs"] = old["spec"]["clusterIPs"].clone();
        } else if wanted != old_ip && !old_ip.is_empty() {
            causes.push(cause(
                "FieldValueInvalid",
                "spec.clusterIPs[0]",
                format!("Invalid value: [\"{wanted}\"]: may not change once set"),
            ));
        }
    }
    let needs_node_ports = |o: &Value| matches!(svc_type(o), "NodePort" | "LoadBalancer");
    if needs_node_ports(old) && needs_node_ports(new) {
        let old_ports = old["spec"]["ports"].as_array().cloned().unwrap_or_default();
        if let Some(ports) = new["spec"]["ports"].as_array_mut() {
            for p in ports {
                if p["nodePort"].is_null() {
                    if let Some(o) = old_ports.iter().find(|o| {
                        o["port"] == p["port"]
                            && o["protocol"].as_str().unwrap_or("TCP")
                                == p["protocol"].as_str().unwrap_or("TCP")
                    }) {
                        p["nodePort"] = o["nodePort"].clone();
                    }
                }
            }
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(spec: Value) -> Value {
        json!({"metadata": {"name": "s", "namespace": "default"}, "spec": spec})
    }

    #[test]
    fn service_cidrs_of_all_plan_indexes_are_disjoint_from_pod_blocks_and_each_other() {
        let mut seen = HashSet::new();
        for index in 0..200u8 {
            let c = service_cidr(index);
            assert_eq!(c.prefix_len, 18);
            assert_eq!(u32::from(c.addr) % 16384, 0, "{c} is aligned");
            assert!(seen.insert(c.addr), "{c} is unique");
            let first = c.addr.octets();
            let last = c.nth(16383).octets();
            for o in [first, last] {
                assert_eq!(o[0], 10);
                assert!((200..=249).contains(&o[1]), "{c}: second octet {}", o[1]);
            }
            assert!(!DEFAULT_SERVICE_CIDR.contains(c.addr));
            assert!(!DEFAULT_SERVICE_CIDR.contains(c.nth(16383)));
        }
        assert_eq!(service_cidr(0).to_string(), "10.200.0.0/18");
        assert_eq!(service_cidr(5).to_string(), "10.201.64.0/18");
        assert_eq!(service_cidr(199).to_string(), "10.249.192.0/18");
    }

    #[test]
    fn defaults_fill_type_protocol_target_port_and_families() {
        let mut s = svc(json!({"ports": [{"port": 80}], "selector": {"app": "x"}}));
        default_service(&mut s);
        assert_eq!(s["spec"]["type"], "ClusterIP");
        assert_eq!(s["spec"]["sessionAffinity"], "None");
        assert_eq!(s["spec"]["ports"][0]["protocol"], "TCP");
        assert_eq!(s["spec"]["ports"][0]["targetPort"], 80);
        assert_eq!(s["spec"]["ipFamilies"], json!(["IPv4"]));
        assert_eq!(s["spec"]["internalTrafficPolicy"], "Cluster");
        assert_eq!(s["status"], json!({"loadBalancer": {}}));
        assert!(validate_service(&s).is_empty());
    }

    #[test]
    fn validation_names_each_bad_field() {
        let mut s = svc(json!({"type": "Weird", "ports": [
            {"name": "a", "port": 0, "protocol": "ICMP"},
            {"port": 80, "targetPort": "Bad_Name"}], "clusterIP": "nope"}));
        default_service(&mut s);
        let fields: Vec<String> = validate_service(&s).into_iter().map(|c| c.1).collect();
        for f in [
            "spec.type",
            "spec.ports[0].port",
            "spec.ports[0].protocol",
            "spec.ports[1].name",
            "spec.ports[1].targetPort",
            "spec.clusterIPs[0]",
        ] {
            assert!(fields.iter().any(|x| x == f), "{f} missing in {fields:?}");
        }
        let mut empty = svc(json!({}));
        default_service(&mut empty);
        assert_eq!(validate_service(&empty)[0].1, "spec.ports");
        let mut headless = svc(json!({"clusterIP": "None"}));
        default_service(&mut headless);
        assert!(validate_service(&headless).is_empty());
    }

    #[test]
    fn allocation_picks_free_addresses_inside_the_cidr_and_rejects_taken_or_foreign_ones() {
        let cidr: Ipv4Cidr = "10.200.0.0/29".parse().unwrap(); // offsets 1..=6 usable
        let mut held = Vec::new();
        // Offsets below 10 are reserved for explicit requests, so with a /29 the lowest
        // dynamic offset is clamped to the last usable one.
        let mut a = svc(json!({"ports": [{"port": 80}]}));
        default_service(&mut a);
        allocate(&mut a, held.iter(), cidr).unwrap();
        let ip: Ipv4Addr = a["spec"]["clusterIP"].as_str().unwrap().parse().unwrap();
        assert!(cidr.contains(ip));
        assert_eq!(a["spec"]["clusterIPs"], json!([ip.to_string()]));
        held.push(a.clone());
        let mut b = a.clone();
        let e = allocate(&mut b, held.iter(), cidr).unwrap_err();
        assert!(e[0].2.contains("provided IP is already allocated"), "{e:?}");
        let mut c = svc(json!({"clusterIP": "10.9.9.9", "ports": [{"port": 80}]}));
        let e = allocate(&mut c, held.iter(), cidr).unwrap_err();
        assert!(e[0].2.contains("not in the valid range"), "{e:?}");
        let mut d = svc(json!({"clusterIP": "10.200.0.7", "ports": [{"port": 80}]}));
        assert!(
            allocate(&mut d, held.iter(), cidr).is_err(),
            "broadcast address"
        );
        let mut e2 = svc(json!({"clusterIP": "10.200.0.3", "ports": [{"port": 80}]}));
        allocate(&mut e2, held.iter(), cidr).unwrap();
        assert_eq!(e2["spec"]["clusterIPs"], json!(["10.200.0.3"]));
    }

    #[test]
    fn allocation_never_hands_out_a_held_address_until_the_range_is_full() {
        let cidr: Ipv4Cidr = "10.200.0.0/26".parse().unwrap(); // offsets 10..=62 dynamic
        let mut held: Vec<Value> = Vec::new();
        for _ in 10..=62 {
            let mut s = svc(json!({"ports": [{"port": 80}]}));
            allocate(&mut s, held.iter(), cidr).unwrap();
            held.push(s);
        }
        let ips: HashSet<&str> = held
            .iter()
            .map(|s| s["spec"]["clusterIP"].as_str().unwrap())
            .collect();
        assert_eq!(ips.len(), 53);
        let mut full = svc(json!({"ports": [{"port": 80}]}));
        let e = allocate(&mut full, held.iter(), cidr).unwrap_err();
        assert!(e[0].2.contains("range is full"), "{e:?}");
    }

    #[test]
    fn node_ports_are_allocated_in_range_and_kept_unique() {
        let mut a = svc(
            json!({"type": "NodePort", "ports": [{"name": "a", "port": 80}, {"name": "b", "port": 81}]}),
        );
        default_service(&mut a);
        allocate(&mut a, std::iter::empty(), DEFAULT_SERVICE_CIDR).unwrap();
        let n0 = a["spec"]["ports"][0]["nodePort"].as_i64().unwrap();
        let n1 = a["spec"]["ports"][1]["nodePort"].as_i64().unwrap();
        assert!(NODE_PORT_RANGE.contains(&(n0 as u16)) && n0 != n1);
        let mut b = svc(json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": n0}]}));
        let e = allocate(&mut b, [a.clone()].iter(), DEFAULT_SERVICE_CIDR).unwrap_err();
        assert!(
            e[0].2.contains("provided port is already allocated"),
            "{e:?}"
        );
    }

    #[test]
    fn store_allocates_from_its_configured_cidr_and_keeps_the_ip_across_updates() {
        let store = crate::api::Store::new();
        let cidr = service_cidr(42);
        store.set_service_cidr(cidr);
        let created = store
            .create(
                crate::api::Kind::Service,
                svc(json!({"ports": [{"port": 80}]})),
            )
            .unwrap();
        let ip: Ipv4Addr = created["spec"]["clusterIP"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(cidr.contains(ip), "{ip} in {cidr}");
        // A PUT without clusterIP keeps it; one with another address is a 422.
        let out = store
            .modify(crate::api::Kind::Service, Some("default"), "s", |s| {
                s["spec"] = json!({"ports": [{"port": 81}]});
                Ok(())
            })
            .unwrap();
        assert_eq!(out["spec"]["clusterIP"], json!(ip.to_string()));
        assert_eq!(out["spec"]["ports"][0]["targetPort"], 81);
        let e = store
            .modify(crate::api::Kind::Service, Some("default"), "s", |s| {
                s["spec"]["clusterIP"] = json!(cidr.nth(5).to_string());
                s["spec"]["clusterIPs"] = json!([cidr.nth(5).to_string()]);
                Ok(())
            })
            .unwrap_err();
        assert_eq!(e.code, 422);
        assert!(
            e.message.contains("may not change once set"),
            "{}",
            e.message
        );
        let e = store
            .create(
                crate::api::Kind::Service,
                json!({"metadata": {"name": "t", "namespace": "default"},
                    "spec": {"clusterIP": ip.to_string(), "ports": [{"port": 80}]}}),
            )
            .unwrap_err();
        assert_eq!(e.code, 422);
        assert!(e.message.contains("already allocated"), "{}", e.message);
    }

    #[test]
    fn updates_keep_allocated_values_and_refuse_a_new_cluster_ip() {
        let mut old = svc(json!({"type": "NodePort", "ports": [{"port": 80}]}));
        default_service(&mut old);
        allocate(&mut old, std::iter::empty(), DEFAULT_SERVICE_CIDR).unwrap();
        let mut new = svc(json!({"type": "NodePort", "ports": [{"port": 80, "protocol": "TCP"}]}));
        assert!(carry_over(&old, &mut new).is_empty());
        assert_eq!(new["spec"]["clusterIP"], old["spec"]["clusterIP"]);
        assert_eq!(
            new["spec"]["ports"][0]["nodePort"],
            old["spec"]["ports"][0]["nodePort"]
        );
        let mut moved = svc(json!({"clusterIP": "10.250.3.3", "ports": [{"port": 80}]}));
        let c = carry_over(&old, &mut moved);
        assert_eq!(c.len(), 1);
        assert!(c[0].2.contains("may not change once set"));
    }
}

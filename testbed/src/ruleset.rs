//! Ground truth from a node's real ruleset: the text of `nft -a monitor` and
//! `ip monitor route` (run inside the node's network namespace) turned into
//! "which workload endpoints does the dataplane dispatch now" and "which
//! Service → endpoint mappings has kube-proxy programmed now". Pure: no I/O, the
//! daemon feeds lines as they arrive and stamps a truth event for every [`Change`].
//!
//! # What is modelled
//!
//! **Calico workload dispatch** (Felix in iptables mode writing through
//! `iptables-nft-restore`, so its rules appear in nftables `table ip filter`).
//! Felix's from-/to-workload dispatch chains (`felix/rules/dispatch.go`,
//! `interfaceNameDispatchChains`: `cali-from-wl-dispatch[-…]` /
//! `cali-to-wl-dispatch[-…]`, a shallow prefix tree whose leaves always name the full
//! interface) send a workload's traffic to its policy chains with
//! `-i X -g cali-fw-X` and `-o X -g cali-tw-X`; iptables-nft shows them as
//! `iifname "X" … goto cali-fw-X` and `oifname "X" … goto cali-tw-X`. An interface
//! `X` (name starting with `cali`) is **dispatched** when, in `table ip filter`,
//! a rule of each kind exists (in any chain) **and** the main routing table has an
//! IPv4 host route (`A` or `A/32`) `dev X`. [`RulesetState::dispatched`] maps each
//! such interface to its routed addresses. Negated (`iifname != "X"`) and wildcard
//! (`iifname "cali*"`) matches never count, nor a `goto` whose chain names another
//! interface. On a dual-stack node ([`RulesetState::dual_stack`]: Felix with
//! `ipv6Support` writes the same chains through `ip6tables-nft-restore`) `X` is
//! dispatched only when `table ip6 filter` has both rules too and the main table an
//! IPv6 host route (`A` or `A/128`) `dev X` as well ([`RulesetState::dispatched6`]
//! gives those addresses).
//!
//! **kube-proxy, nftables mode** (Kubernetes `pkg/proxy/nftables/proxier.go`), in
//! `table ip kube-proxy`. Chain names come from `servicePortChainNameBase`
//! (`service-HASH8-NS/SVC/PROTO/PORTNAME`, prefix `servicePortPolicyClusterChainNamePrefix`;
//! `local-…` with the same base is the internal-traffic-policy-Local chain and is
//! accepted too) and `servicePortEndpointChainNameBase`
//! (`endpoint-HASH8-NS/SVC/PROTO/PORTNAME__IP/PORT`, `:` of IPv6 replaced by `.`;
//! the port name may be empty). A **service endpoint** `(NS, SVC, IP)` is programmed
//! when the map `service-ips` has an element whose verdict is `goto <service chain>`,
//! that chain has a rule with `goto endpoint-…__IP/…` (the `numgen … vmap { … }` or an
//! affinity rule) and that endpoint chain has a rule with `dnat to` — or when that
//! service chain DNATs to the IP itself (`dnat ip to numgen random mod N map { 0 : IP .
//! PORT, … }`: kube-proxy v1.36.3 inlines the endpoint choice so when no endpoint chain
//! is needed, seen on the testbed's nodes). The namespace and service come from the
//! service chain's name, the IP from the endpoint chain's name or the DNAT map
//! ([`RulesetState::service_endpoints`]).
//!
//! # Resolution
//!
//! The kernel applies an nftables transaction at commit; `nft monitor` then prints one
//! line per object of it followed by `# new generation N by process PID (NAME)`.
//! Object lines update the working state at once, but the derived nft state is only
//! re-evaluated at the generation line ([`RulesetState::feed_nft`] returns a
//! [`Change`] only there), so a transaction that flushes a chain or map and refills it
//! is seen as the net effect it had, and every change is stamped when the daemon reads
//! the generation line (≈ 1 ms after the commit). Each `ip monitor route` line is one
//! netlink notification sent after the FIB change: [`RulesetState::feed_route`]
//! reports at once. The getters report the state as of the last generation line
//! (nft part) and the last route line.
//!
//! Route identity follows the kernel's IPv4 FIB: a route is keyed by
//! (destination, TOS, metric) in the main table. An add line for a key that already
//! holds another device can only be a `replace` (an exclusive add of an existing key
//! fails with `EEXIST` and prints nothing): the earlier route is gone, although no
//! `Deleted` line says so (observed on this machine). A `Deleted` line removes the
//! route only if it names the device we hold for that key.
//!
//! # What it cannot see
//!
//! - Whether the dispatch chains or kube-proxy's `services` chain are reached from a
//!   hook (`cali-FORWARD`, `nat-prerouting`), the policy verdicts inside
//!   `cali-fw-X`/`cali-tw-X`, conntrack, ipsets, iptables-legacy rules, Felix's
//!   nftables (`table ip calico`) or eBPF dataplanes, kube-proxy's IPv6 tables and
//!   IPv6 Service endpoints, IPv6 workload dispatch on a node not made with
//!   [`RulesetState::dual_stack`], kube-proxy `external-…` chains (NodePort, ExternalIP, LoadBalancer)
//!   and chain names kube-proxy truncated with `...`.
//! - IPv4 routes of an interface vanish **without** `Deleted` lines when the link is
//!   deleted — and also when it is set administratively down (observed: `ip link set
//!   X down` flushes its IPv4 routes silently). The caller must report both with
//!   [`RulesetState::link_removed`].
//! - Routes added with `ip route append` (several routes per key) are modelled as
//!   replacements; multipath/`nexthop` routes are not device routes here; only the
//!   main table counts.
//! - `nft monitor` must run with `-a` (rules without `# handle N` cannot be tracked and
//!   are ignored). Lines lost by the monitor (netlink buffer overrun) are not
//!   detectable here: restart the monitor and load a snapshot
//!   ([`RulesetState::load_nft_snapshot`], [`RulesetState::load_route_snapshot`]).
//!
//! Memory holds only what matters: for the tables above (`ip filter`, `ip6 filter`,
//! `ip kube-proxy`), the chain names/handles
//! and the rules that carry a dispatch, endpoint-jump or DNAT fact, the `goto`
//! elements of `service-ips`, and the main-table IPv4 and IPv6 host routes. Deleting a
//! rule, chain, table, element or route removes every trace of it; there is no history.
//! Unknown or malformed lines are ignored, never a panic.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Workload interfaces are those whose name starts with this (Calico's default
/// `InterfacePrefix`).
pub const WORKLOAD_IFACE_PREFIX: &str = "cali";

/// Felix's from-workload policy chain prefix (`WorkloadFromEndpointPfx`).
const FROM_WORKLOAD_CHAIN_PREFIX: &str = "cali-fw-";
/// Felix's to-workload policy chain prefix (`WorkloadToEndpointPfx`).
const TO_WORKLOAD_CHAIN_PREFIX: &str = "cali-tw-";
/// kube-proxy's map of ClusterIP/ExternalIP/LB traffic (`serviceIPsMap`).
const SERVICE_IPS_MAP: &str = "service-ips";
/// kube-proxy's cluster-policy service chain prefix.
const SERVICE_CHAIN_PREFIX: &str = "service-";
/// kube-proxy's local-policy service chain prefix.
const LOCAL_CHAIN_PREFIX: &str = "local-";
/// kube-proxy's endpoint chain prefix (`servicePortEndpointChainNamePrefix`).
const ENDPOINT_CHAIN_PREFIX: &str = "endpoint-";

/// One Service → endpoint mapping kube-proxy has programmed (any port of the Service).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceEndpointKey {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub service: String,
    /// The endpoint's IPv4 address.
    pub ip: Ipv4Addr,
}

/// A change of the derived state since the last change returned. Every list is sorted
/// and none is repeated; interfaces whose routed addresses change while they stay
/// dispatched are not a change (read [`RulesetState::dispatched`] for the addresses).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Change {
    /// Interfaces that became dispatched.
    pub dispatched_added: Vec<String>,
    /// Interfaces that stopped being dispatched.
    pub dispatched_removed: Vec<String>,
    /// Service endpoints that became programmed.
    pub services_added: Vec<ServiceEndpointKey>,
    /// Service endpoints that stopped being programmed.
    pub services_removed: Vec<ServiceEndpointKey>,
}

impl Change {
    /// True when nothing changed.
    pub fn is_empty(&self) -> bool {
        self.dispatched_added.is_empty()
            && self.dispatched_removed.is_empty()
            && self.services_added.is_empty()
            && self.services_removed.is_empty()
    }
}

/// Ruleset and route truth of one node. Feed lines in arrival order.
#[derive(Debug, Default)]
pub struct RulesetState {
    nft: NftState,
    routes: Routes,
    /// Interfaces with both dispatch rules, as of the last generation line or snapshot.
    committed_dispatch: BTreeSet<String>,
    /// The same in `table ip6 filter` (counted only when `ipv6`).
    committed_dispatch6: BTreeSet<String>,
    /// The node is dual-stack ([`RulesetState::dual_stack`]): an interface is dispatched
    /// only when both families are.
    ipv6: bool,
    /// Service endpoints, as of the last generation line or snapshot.
    committed_services: BTreeSet<ServiceEndpointKey>,
    /// What the last returned change (or the start) left the caller knowing.
    reported_dispatched: BTreeSet<String>,
    reported_services: BTreeSet<ServiceEndpointKey>,
    /// `committed_services` was recomputed since the last diff (skips comparing the
    /// service sets on every route line).
    services_recomputed: bool,
    generation: Option<u64>,
}

impl RulesetState {
    /// Empty state: no rules, no routes, nothing reported.
    pub fn new() -> Self {
        Self::default()
    }

    /// Empty state of a dual-stack node: an interface counts as dispatched only when
    /// `table ip6 filter` dispatches it both ways too and it has an IPv6 host route
    /// (`A` or `A/128`, main table) beside the IPv4 one — Felix with `ipv6Support`
    /// writes the same dispatch chains through `ip6tables-nft-restore`
    /// (felix/rules/dispatch.go) and the pod's `/128` route.
    pub fn dual_stack() -> Self {
        RulesetState {
            ipv6: true,
            ..Self::default()
        }
    }

    /// Whether `dev` is dispatched now: both dispatch rules and a host route, in each
    /// family the node has.
    fn is_dispatched(&self, dev: &str) -> bool {
        self.committed_dispatch.contains(dev)
            && self.routes.has_dev(dev, false)
            && (!self.ipv6
                || (self.committed_dispatch6.contains(dev) && self.routes.has_dev(dev, true)))
    }

    /// One `nft -a monitor` line. Object lines update the working ruleset; at a
    /// `# new generation` line the derived state is re-evaluated and returned as a
    /// change when it differs from the last change returned. Other lines: `None`.
    pub fn feed_nft(&mut self, line: &str) -> Option<Change> {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("# new generation") {
            self.generation = rest
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .or(self.generation);
            return self.commit_nft();
        }
        if !t.is_empty() && !t.starts_with('#') {
            self.nft.apply_monitor_line(t);
        }
        None
    }

    /// One `ip monitor route` line; the change at once when the derived state changed.
    pub fn feed_route(&mut self, line: &str) -> Option<Change> {
        let (deleted, key, target) = parse_route_line(line)?;
        if deleted {
            if !self.routes.delete(key, target.as_deref()) {
                return None;
            }
            self.diff_devs(target.as_slice())
        } else {
            let replaced = self.routes.add(key, target.clone());
            let devs: Vec<String> = replaced.into_iter().chain(target).collect();
            self.diff_devs(&devs)
        }
    }

    /// Interface `iface` is gone or was set down: its routes went with it (the kernel
    /// prints no `Deleted` line for its IPv4 ones).
    pub fn link_removed(&mut self, iface: &str) -> Option<Change> {
        self.routes.remove_dev(iface);
        self.diff_devs(&[iface.to_string()])
    }

    /// Replaces the nft part of the state with an `nft -a list ruleset` text (taken
    /// when the monitor (re)starts); uncommitted monitor lines are dropped. Returns the
    /// change against what was last returned.
    pub fn load_nft_snapshot(&mut self, text: &str) -> Option<Change> {
        self.nft = NftState::from_listing(text);
        self.nft.filter.touched_ifaces.clear();
        self.nft.filter6.touched_ifaces.clear();
        self.committed_dispatch = self.nft.filter.dispatch_ifaces();
        self.committed_dispatch6 = self.nft.filter6.dispatch_ifaces();
        self.committed_services = self.nft.service_endpoints();
        self.nft.kube_proxy.dirty = false;
        self.services_recomputed = true;
        self.diff()
    }

    /// Replaces the route part of the state with an `ip -4 route show` text (followed
    /// by `ip -6 route show`'s on a dual-stack node). Returns the change against what
    /// was last returned.
    pub fn load_route_snapshot(&mut self, text: &str) -> Option<Change> {
        let mut routes = Routes::default();
        for line in text.lines() {
            if let Some((false, key, target)) = parse_route_line(line) {
                routes.add(key, target);
            }
        }
        self.routes = routes;
        self.diff()
    }

    /// Workload interfaces the ruleset dispatches now (both dispatch rules as of the
    /// last generation line, and at least one host route `dev X`; on a dual-stack node
    /// both in each family), each with its routed IPv4 addresses.
    pub fn dispatched(&self) -> BTreeMap<String, BTreeSet<Ipv4Addr>> {
        self.committed_dispatch
            .iter()
            .filter(|iface| self.is_dispatched(iface))
            .map(|iface| (iface.clone(), self.routes.ips_of(iface)))
            .collect()
    }

    /// The IPv6 host routes of each interface [`Self::dispatched`] holds (empty on an
    /// IPv4-only node).
    pub fn dispatched6(&self) -> BTreeMap<String, BTreeSet<Ipv6Addr>> {
        if !self.ipv6 {
            return BTreeMap::new();
        }
        self.committed_dispatch
            .iter()
            .filter(|iface| self.is_dispatched(iface))
            .map(|iface| (iface.clone(), self.routes.ips6_of(iface)))
            .collect()
    }

    /// Service endpoints kube-proxy has programmed, as of the last generation line.
    pub fn service_endpoints(&self) -> BTreeSet<ServiceEndpointKey> {
        self.committed_services.clone()
    }

    /// Number of the last `# new generation` line seen (`None` before the first).
    pub fn generation(&self) -> Option<u64> {
        self.generation
    }

    /// Re-evaluates the nft-derived state at a generation line and diffs: the
    /// dispatch state of the interfaces whose dispatch rules changed (incremental),
    /// and the service endpoints if the kube-proxy table changed (recomputed, O(its
    /// elements and kept rules); kube-proxy rewrites its whole `service-ips` map in
    /// every sync transaction anyway, so that transaction's own lines cost more).
    fn commit_nft(&mut self) -> Option<Change> {
        let mut touched: Vec<String> = self.nft.filter.touched_ifaces.drain().collect();
        for iface in &touched {
            if self.nft.filter.dispatches(iface) {
                self.committed_dispatch.insert(iface.clone());
            } else {
                self.committed_dispatch.remove(iface);
            }
        }
        let touched6: Vec<String> = self.nft.filter6.touched_ifaces.drain().collect();
        for iface in touched6 {
            if self.nft.filter6.dispatches(&iface) {
                self.committed_dispatch6.insert(iface.clone());
            } else {
                self.committed_dispatch6.remove(&iface);
            }
            touched.push(iface);
        }
        if self.nft.kube_proxy.dirty {
            self.committed_services = self.nft.service_endpoints();
            self.nft.kube_proxy.dirty = false;
            self.services_recomputed = true;
        }
        let mut change = self.diff_devs(&touched).unwrap_or_default();
        (change.services_added, change.services_removed) = self.diff_services();
        (!change.is_empty()).then_some(change)
    }

    /// [`Self::diff`] restricted to the dispatch state of `devs` (the only ones a route
    /// change can affect): O(1) per route line.
    fn diff_devs(&mut self, devs: &[String]) -> Option<Change> {
        let mut change = Change::default();
        for dev in devs {
            let now = self.is_dispatched(dev);
            let was = self.reported_dispatched.contains(dev);
            if now && !was {
                self.reported_dispatched.insert(dev.clone());
                change.dispatched_added.push(dev.clone());
            } else if was && !now {
                self.reported_dispatched.remove(dev);
                change.dispatched_removed.push(dev.clone());
            }
        }
        change.dispatched_added.sort_unstable();
        change.dispatched_added.dedup();
        change.dispatched_removed.sort_unstable();
        change.dispatched_removed.dedup();
        (!change.is_empty()).then_some(change)
    }

    /// The change from the last reported state to the current one, recorded as
    /// reported; `None` when equal.
    fn diff(&mut self) -> Option<Change> {
        let dispatched: BTreeSet<String> = self
            .committed_dispatch
            .iter()
            .filter(|iface| self.is_dispatched(iface))
            .cloned()
            .collect();
        let (services_added, services_removed) = self.diff_services();
        let change = Change {
            dispatched_added: dispatched
                .difference(&self.reported_dispatched)
                .cloned()
                .collect(),
            dispatched_removed: self
                .reported_dispatched
                .difference(&dispatched)
                .cloned()
                .collect(),
            services_added,
            services_removed,
        };
        self.reported_dispatched = dispatched;
        (!change.is_empty()).then_some(change)
    }

    /// Service endpoints (added, removed) since last reported, recorded as reported.
    fn diff_services(&mut self) -> (Vec<ServiceEndpointKey>, Vec<ServiceEndpointKey>) {
        if !std::mem::take(&mut self.services_recomputed) {
            return (Vec::new(), Vec::new());
        }
        let added: Vec<ServiceEndpointKey> = self
            .committed_services
            .difference(&self.reported_services)
            .cloned()
            .collect();
        let removed: Vec<ServiceEndpointKey> = self
            .reported_services
            .difference(&self.committed_services)
            .cloned()
            .collect();
        if !added.is_empty() || !removed.is_empty() {
            self.reported_services = self.committed_services.clone();
        }
        (added, removed)
    }
}

// ---------------------------------------------------------------------------------
// nftables

/// The tables that carry truth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TableSel {
    /// `table ip filter` (Felix through iptables-nft).
    Filter,
    /// `table ip6 filter` (Felix through ip6tables-nft, `ipv6Support`).
    Filter6,
    /// `table ip kube-proxy`.
    KubeProxy,
}

impl TableSel {
    fn of(family: &str, table: &str) -> Option<TableSel> {
        match (family, unquote(table)) {
            ("ip", "filter") => Some(TableSel::Filter),
            ("ip6", "filter") => Some(TableSel::Filter6),
            ("ip", "kube-proxy") => Some(TableSel::KubeProxy),
            _ => None,
        }
    }
}

/// What a rule contributes (rules contributing nothing are not kept).
#[derive(Debug, Clone, PartialEq, Eq)]
enum RuleFact {
    /// `iifname "X" … goto cali-fw-X`.
    FromWorkload(String),
    /// `oifname "X" … goto cali-tw-X`.
    ToWorkload(String),
    /// kube-proxy: the endpoint chains this rule `goto`s, whether it DNATs, and the
    /// endpoint IPs it DNATs to itself (kube-proxy v1.36 writes a service chain's
    /// DNAT straight into it, `dnat ip to numgen random mod N map { 0 : IP . PORT, … }`,
    /// when no endpoint chain is needed; checked with v1.36.3).
    KubeProxy {
        endpoints: Vec<String>,
        dnat: bool,
        direct: Vec<Ipv4Addr>,
    },
}

#[derive(Debug, Clone)]
struct Rule {
    chain: String,
    fact: RuleFact,
}

/// One tracked table.
#[derive(Debug, Default)]
struct TableState {
    /// Chain name → handle (for renames: `add chain T NEW # handle H` of an existing H).
    chains: HashMap<String, u64>,
    chain_by_handle: HashMap<u64, String>,
    /// Rule handle (unique per table) → rule, for rules with a fact.
    rules: HashMap<u64, Rule>,
    /// Chain name → handles of its kept rules.
    chain_rules: HashMap<String, HashSet<u64>>,
    /// `service-ips` element key → `goto` target chain (kube-proxy table only).
    elements: HashMap<String, String>,
    /// Workload interface → (from-, to-dispatch rules) kept for it (filter table only).
    dispatch_rules: HashMap<String, (u32, u32)>,
    /// Interfaces whose dispatch rules changed since the last evaluation.
    touched_ifaces: HashSet<String>,
    /// Something that can change the service endpoints changed since the last
    /// evaluation (kube-proxy table; the filter table uses `touched_ifaces`).
    dirty: bool,
}

impl TableState {
    fn add_chain(&mut self, name: &str, handle: Option<u64>) {
        let Some(handle) = handle else {
            return;
        };
        if let Some(old) = self.chain_by_handle.get(&handle).cloned() {
            if old != name {
                self.rename_chain(&old, name);
            }
            return;
        }
        if let Some(prev) = self.chains.insert(name.to_string(), handle) {
            self.chain_by_handle.remove(&prev);
        }
        self.chain_by_handle.insert(handle, name.to_string());
    }

    fn rename_chain(&mut self, old: &str, new: &str) {
        if let Some(handle) = self.chains.remove(old) {
            self.chains.insert(new.to_string(), handle);
            self.chain_by_handle.insert(handle, new.to_string());
        }
        if let Some(handles) = self.chain_rules.remove(old) {
            for h in &handles {
                if let Some(rule) = self.rules.get_mut(h) {
                    rule.chain = new.to_string();
                }
            }
            self.chain_rules.insert(new.to_string(), handles);
            self.dirty = true;
        }
    }

    fn delete_chain(&mut self, name: &str) {
        self.flush_chain(name);
        if let Some(handle) = self.chains.remove(name) {
            self.chain_by_handle.remove(&handle);
        }
    }

    fn flush_chain(&mut self, name: &str) {
        if let Some(handles) = self.chain_rules.remove(name) {
            for h in handles {
                if let Some(rule) = self.rules.remove(&h) {
                    self.count_dispatch(&rule.fact, false);
                }
            }
            self.dirty = true;
        }
    }

    fn flush_rules(&mut self) {
        if self.rules.is_empty() {
            return;
        }
        for (_, rule) in std::mem::take(&mut self.rules) {
            self.count_dispatch(&rule.fact, false);
        }
        self.chain_rules.clear();
        self.dirty = true;
    }

    /// The table is gone: nothing of it is kept but what the next evaluation needs.
    fn clear(&mut self) {
        self.flush_rules();
        let dirty = self.dirty || !self.elements.is_empty();
        let touched = std::mem::take(&mut self.touched_ifaces);
        *self = TableState::default();
        self.dirty = dirty;
        self.touched_ifaces = touched;
    }

    /// Counts a kept dispatch rule in (`add`) or out.
    fn count_dispatch(&mut self, fact: &RuleFact, add: bool) {
        let (iface, from) = match fact {
            RuleFact::FromWorkload(x) => (x, true),
            RuleFact::ToWorkload(x) => (x, false),
            RuleFact::KubeProxy { .. } => return,
        };
        let counts = self.dispatch_rules.entry(iface.clone()).or_default();
        let n = if from { &mut counts.0 } else { &mut counts.1 };
        *n = if add { *n + 1 } else { n.saturating_sub(1) };
        if *counts == (0, 0) {
            self.dispatch_rules.remove(iface);
        }
        self.touched_ifaces.insert(iface.clone());
    }

    /// Interfaces with both a from- and a to-workload dispatch rule.
    fn dispatch_ifaces(&self) -> BTreeSet<String> {
        self.dispatch_rules
            .keys()
            .filter(|iface| self.dispatches(iface))
            .cloned()
            .collect()
    }

    /// True when `iface` has both a from- and a to-dispatch rule.
    fn dispatches(&self, iface: &str) -> bool {
        self.dispatch_rules
            .get(iface)
            .is_some_and(|&(from, to)| from > 0 && to > 0)
    }

    /// Adds (or overwrites) rule `handle`; a rule without a fact only removes the old one.
    fn add_rule(&mut self, chain: &str, handle: u64, fact: Option<RuleFact>) {
        self.delete_rule(handle);
        if let Some(fact) = fact {
            self.count_dispatch(&fact, true);
            self.rules.insert(
                handle,
                Rule {
                    chain: chain.to_string(),
                    fact,
                },
            );
            self.chain_rules
                .entry(chain.to_string())
                .or_default()
                .insert(handle);
            self.dirty = true;
        }
    }

    fn delete_rule(&mut self, handle: u64) {
        if let Some(rule) = self.rules.remove(&handle) {
            self.count_dispatch(&rule.fact, false);
            if let Some(set) = self.chain_rules.get_mut(&rule.chain) {
                set.remove(&handle);
                if set.is_empty() {
                    self.chain_rules.remove(&rule.chain);
                }
            }
            self.dirty = true;
        }
    }

    fn add_elements(&mut self, body: &str) {
        for (key, target) in parse_elements(body) {
            match target {
                Some(target) => {
                    self.elements.insert(key, target);
                    self.dirty = true;
                }
                // A non-goto verdict replacing a goto one (kernel: after a delete).
                None => self.delete_element(&key),
            }
        }
    }

    fn delete_elements(&mut self, body: &str) {
        for (key, _) in parse_elements(body) {
            self.delete_element(&key);
        }
    }

    fn delete_element(&mut self, key: &str) {
        if self.elements.remove(key).is_some() {
            self.dirty = true;
        }
    }

    fn clear_elements(&mut self) {
        if !self.elements.is_empty() {
            self.elements.clear();
            self.dirty = true;
        }
    }

    /// True when chain `name` has a rule with `dnat to`.
    fn chain_dnats(&self, name: &str) -> bool {
        self.chain_rules.get(name).is_some_and(|handles| {
            handles.iter().any(|h| {
                matches!(
                    self.rules.get(h),
                    Some(Rule {
                        fact: RuleFact::KubeProxy { dnat: true, .. },
                        ..
                    })
                )
            })
        })
    }
}

#[derive(Debug, Default)]
struct NftState {
    filter: TableState,
    filter6: TableState,
    kube_proxy: TableState,
}

impl NftState {
    fn table(&mut self, sel: TableSel) -> &mut TableState {
        match sel {
            TableSel::Filter => &mut self.filter,
            TableSel::Filter6 => &mut self.filter6,
            TableSel::KubeProxy => &mut self.kube_proxy,
        }
    }

    /// Applies one `nft -a monitor` object line (not a comment line).
    fn apply_monitor_line(&mut self, line: &str) {
        let (code, comment) = split_comment(line);
        let handle = comment.and_then(parse_handle);
        let Some((verb, rest)) = next_word(code) else {
            return;
        };
        let Some((object, rest)) = next_word(rest) else {
            return;
        };
        if verb == "flush" && object == "ruleset" {
            self.filter.clear();
            self.filter6.clear();
            self.kube_proxy.clear();
            return;
        }
        let Some((family, rest)) = next_word(rest) else {
            return;
        };
        let Some((table, rest)) = next_word(rest) else {
            return;
        };
        let Some(sel) = TableSel::of(family, table) else {
            return;
        };
        let t = self.table(sel);
        let add = matches!(verb, "add" | "create" | "insert");
        let delete = matches!(verb, "delete" | "destroy");
        match object {
            "table" if delete => t.clear(),
            "table" if verb == "flush" => t.flush_rules(),
            "chain" => {
                let Some((name, _)) = next_word(rest) else {
                    return;
                };
                let name = unquote(name);
                if add {
                    t.add_chain(name, handle);
                } else if delete {
                    t.delete_chain(name);
                } else if verb == "flush" {
                    t.flush_chain(name);
                }
            }
            "rule" if add => {
                let (Some((chain, text)), Some(handle)) = (next_word(rest), handle) else {
                    return;
                };
                t.add_rule(unquote(chain), handle, rule_fact(sel, text));
            }
            "rule" if delete => {
                // `delete rule ip T C handle N`
                let words: Vec<&str> = rest.split_whitespace().collect();
                if let [.., "handle", n] = words.as_slice() {
                    if let Ok(h) = n.parse() {
                        t.delete_rule(h);
                    }
                }
            }
            "element" if sel == TableSel::KubeProxy => {
                let Some((set, body)) = next_word(rest) else {
                    return;
                };
                if unquote(set) != SERVICE_IPS_MAP {
                    return;
                }
                if add {
                    t.add_elements(body);
                } else if delete {
                    t.delete_elements(body);
                }
            }
            "set" | "map"
                if sel == TableSel::KubeProxy
                    && (delete || verb == "flush")
                    && next_word(rest)
                        .is_some_and(|(name, _)| unquote(name) == SERVICE_IPS_MAP) =>
            {
                t.clear_elements();
            }
            _ => {}
        }
    }

    /// Parses an `nft -a list ruleset` text.
    fn from_listing(text: &str) -> NftState {
        #[derive(Debug)]
        enum Block {
            Table(Option<TableSel>),
            Chain(String),
            Set(String),
            Elements,
            Other,
        }
        let mut st = NftState::default();
        let mut stack: Vec<Block> = Vec::new();
        let mut elements = String::new();
        for raw in text.lines() {
            let (code, comment) = split_comment(raw);
            let code = code.trim();
            if code.is_empty() {
                continue;
            }
            let (opens, closes) = count_braces(code);
            let net = opens as isize - closes as isize;
            let table = match stack.first() {
                Some(Block::Table(sel)) => *sel,
                _ => None,
            };
            // What this line opens, if it opens a block.
            let mut opened = Block::Other;
            match stack.last() {
                None => {
                    if let Some(("table", rest)) = next_word(code) {
                        let sel = next_word(rest).and_then(|(family, rest)| {
                            next_word(rest).and_then(|(name, _)| TableSel::of(family, name))
                        });
                        opened = Block::Table(sel);
                    }
                }
                Some(Block::Table(_)) => {
                    if let Some((kind, rest)) = next_word(code) {
                        if let Some((name, _)) = next_word(rest) {
                            let name = unquote(name).to_string();
                            match kind {
                                "chain" => {
                                    if let Some(sel) = table {
                                        let handle = comment.and_then(parse_handle);
                                        st.table(sel).add_chain(&name, handle);
                                    }
                                    opened = Block::Chain(name);
                                }
                                "set" | "map" => opened = Block::Set(name),
                                _ => {}
                            }
                        }
                    }
                }
                Some(Block::Chain(chain)) => {
                    if net == 0 {
                        if let (Some(sel), Some(handle)) = (table, comment.and_then(parse_handle)) {
                            let fact = rule_fact(sel, code);
                            let chain = chain.clone();
                            st.table(sel).add_rule(&chain, handle, fact);
                        }
                    }
                }
                Some(Block::Set(name)) => {
                    if table == Some(TableSel::KubeProxy)
                        && name == SERVICE_IPS_MAP
                        && code.starts_with("elements")
                    {
                        if net == 0 {
                            st.kube_proxy.add_elements(code);
                        } else if net > 0 {
                            elements.clear();
                            elements.push_str(code);
                            opened = Block::Elements;
                        }
                    }
                }
                Some(Block::Elements) => {
                    elements.push(' ');
                    elements.push_str(code);
                    if net < 0 {
                        st.kube_proxy.add_elements(&elements);
                        elements.clear();
                    }
                }
                Some(Block::Other) => {}
            }
            if net > 0 {
                stack.push(opened);
                for _ in 1..net {
                    stack.push(Block::Other);
                }
            } else {
                for _ in 0..(-net) {
                    stack.pop();
                }
            }
        }
        st
    }

    /// Service endpoints reachable through `service-ips` → service chain → endpoint
    /// chain with DNAT.
    fn service_endpoints(&self) -> BTreeSet<ServiceEndpointKey> {
        let t = &self.kube_proxy;
        let mut out = BTreeSet::new();
        let targets: HashSet<&str> = t.elements.values().map(String::as_str).collect();
        for chain in targets {
            let Some((namespace, service)) = parse_service_chain(chain) else {
                continue;
            };
            let Some(handles) = t.chain_rules.get(chain) else {
                continue;
            };
            for h in handles {
                let Some(Rule {
                    fact:
                        RuleFact::KubeProxy {
                            endpoints, direct, ..
                        },
                    ..
                }) = t.rules.get(h)
                else {
                    continue;
                };
                for ip in direct {
                    out.insert(ServiceEndpointKey {
                        namespace: namespace.to_string(),
                        service: service.to_string(),
                        ip: *ip,
                    });
                }
                for ep in endpoints {
                    if let Some(ip) = parse_endpoint_chain_ip(ep) {
                        if t.chain_dnats(ep) {
                            out.insert(ServiceEndpointKey {
                                namespace: namespace.to_string(),
                                service: service.to_string(),
                                ip,
                            });
                        }
                    }
                }
            }
        }
        out
    }
}

/// The IPv4 addresses a DNAT statement in `text` sends to: `dnat [ip] to IP[:PORT]`
/// or `dnat [ip] to … map { K : IP . PORT, … }` (kube-proxy's endpoint choice inlined
/// into the service chain).
fn dnat_targets(text: &str) -> Vec<Ipv4Addr> {
    let Some(i) = text.find("dnat ") else {
        return Vec::new();
    };
    let rest = &text[i + 5..];
    let rest = rest.strip_prefix("ip ").unwrap_or(rest);
    let Some(rest) = rest.strip_prefix("to ") else {
        return Vec::new();
    };
    // `IP . PORT`, `IP:PORT` or `IP`: the address is what comes before " . " or ':'.
    let ip_of = |s: &str| -> Option<Ipv4Addr> {
        s.trim()
            .split(" . ")
            .next()?
            .split(':')
            .next()?
            .trim()
            .parse()
            .ok()
    };
    match (rest.find("map {"), rest.find('}')) {
        (Some(open), Some(close)) if close > open => rest[open + 5..close]
            .split(',')
            .filter_map(|e| e.split_once(" : ").and_then(|(_, v)| ip_of(v)))
            .collect(),
        _ => rest
            .split_whitespace()
            .next()
            .and_then(ip_of)
            .into_iter()
            .collect(),
    }
}

/// The fact rule text `text` (the statement, without `# handle`) of table `sel`
/// carries, if any.
fn rule_fact(sel: TableSel, text: &str) -> Option<RuleFact> {
    let toks: Vec<&str> = tokens(text).collect();
    let next = |i: usize| toks.get(i + 1).map(|t| unquote(t));
    match sel {
        TableSel::Filter | TableSel::Filter6 => {
            let (mut iif, mut oif) = (None, None);
            let mut gotos = Vec::new();
            for (i, tok) in toks.iter().enumerate() {
                match *tok {
                    "iifname" => iif = next(i).or(iif),
                    "oifname" => oif = next(i).or(oif),
                    "goto" => gotos.extend(next(i)),
                    _ => {}
                }
            }
            if let Some(x) = dispatch_leaf(iif, &gotos, FROM_WORKLOAD_CHAIN_PREFIX) {
                Some(RuleFact::FromWorkload(x.to_string()))
            } else {
                dispatch_leaf(oif, &gotos, TO_WORKLOAD_CHAIN_PREFIX)
                    .map(|x| RuleFact::ToWorkload(x.to_string()))
            }
        }
        TableSel::KubeProxy => {
            let mut endpoints = Vec::new();
            let mut dnat = false;
            for (i, tok) in toks.iter().enumerate() {
                match *tok {
                    "goto" => {
                        if let Some(target) =
                            next(i).filter(|t| t.starts_with(ENDPOINT_CHAIN_PREFIX))
                        {
                            if !endpoints.iter().any(|e| e == target) {
                                endpoints.push(target.to_string());
                            }
                        }
                    }
                    "dnat" => {
                        dnat |= next(i) == Some("to")
                            || (next(i) == Some("ip") && next(i + 1) == Some("to"));
                    }
                    _ => {}
                }
            }
            let direct = if dnat { dnat_targets(text) } else { Vec::new() };
            (dnat || !endpoints.is_empty()).then_some(RuleFact::KubeProxy {
                endpoints,
                dnat,
                direct,
            })
        }
    }
}

/// `iface` when it is a workload interface and one of `gotos` is `prefix` + `iface`.
fn dispatch_leaf<'a>(iface: Option<&'a str>, gotos: &[&str], prefix: &str) -> Option<&'a str> {
    let iface = iface.filter(|x| is_workload_iface(x))?;
    gotos
        .iter()
        .any(|g| g.strip_prefix(prefix) == Some(iface))
        .then_some(iface)
}

/// A workload interface name: `cali…`, no wildcard, at most IFNAMSIZ-1 bytes.
fn is_workload_iface(name: &str) -> bool {
    name.len() > WORKLOAD_IFACE_PREFIX.len()
        && name.len() <= 15
        && name.starts_with(WORKLOAD_IFACE_PREFIX)
        && !name.contains(['*', '+', '"', '{', '}'])
}

/// `(namespace, service)` of a `service-HASH-NS/SVC/PROTO/PORT` (or `local-…`) chain.
fn parse_service_chain(chain: &str) -> Option<(&str, &str)> {
    let base = chain
        .strip_prefix(SERVICE_CHAIN_PREFIX)
        .or_else(|| chain.strip_prefix(LOCAL_CHAIN_PREFIX))?;
    let rest = strip_hash(base)?;
    let mut parts = rest.split('/');
    let namespace = parts.next().filter(|s| !s.is_empty())?;
    let service = parts.next().filter(|s| !s.is_empty())?;
    parts.next().filter(|s| !s.is_empty())?; // protocol
    Some((namespace, service))
}

/// Endpoint IPv4 of an `endpoint-HASH-NS/SVC/PROTO/PORT__IP/PORT` chain (`None` for
/// IPv6 endpoints and truncated names).
fn parse_endpoint_chain_ip(chain: &str) -> Option<Ipv4Addr> {
    let rest = strip_hash(chain.strip_prefix(ENDPOINT_CHAIN_PREFIX)?)?;
    let (service_part, endpoint) = rest.rsplit_once("__")?;
    if service_part.split('/').count() < 4 {
        return None;
    }
    let (ip, port) = endpoint.split_once('/')?;
    port.parse::<u16>().ok()?;
    ip.parse().ok()
}

/// Strips kube-proxy's `HASH8-` (8 base32 characters and a hyphen).
fn strip_hash(s: &str) -> Option<&str> {
    let hash = s.get(..8)?;
    if !hash
        .bytes()
        .all(|b| b.is_ascii_uppercase() || (b'2'..=b'7').contains(&b))
    {
        return None;
    }
    s.get(8..)?.strip_prefix('-')
}

/// Parses `{ K : goto C, K2 : verdict2, K3 }` (with or without `elements = `):
/// (normalised key, `goto` target if that is the verdict).
fn parse_elements(body: &str) -> Vec<(String, Option<String>)> {
    let inner = match (body.find('{'), body.rfind('}')) {
        (Some(a), Some(b)) if a < b => &body[a + 1..b],
        (Some(a), None) => &body[a + 1..],
        _ => body,
    };
    let mut out = Vec::new();
    for element in split_top_level(inner, ',') {
        let element = element.trim();
        if element.is_empty() {
            continue;
        }
        let (key, verdict) = match element.split_once(" : ") {
            Some((k, v)) => (k, Some(v)),
            None => (element, None),
        };
        // The key proper: tokens up to an element attribute.
        let key: Vec<&str> = tokens(key)
            .take_while(|t| !matches!(*t, "timeout" | "expires" | "comment" | "counter"))
            .collect();
        if key.is_empty() {
            continue;
        }
        let target = verdict.and_then(|v| {
            let mut words = tokens(v);
            match (words.next(), words.next()) {
                (Some("goto"), Some(chain)) => Some(unquote(chain).to_string()),
                _ => None,
            }
        });
        out.push((key.join(" "), target));
    }
    out
}

// ---------------------------------------------------------------------------------
// routes

/// Identity of a host route in the main table (the kernel's IPv4 FIB alias key; an
/// IPv6 route's TOS is 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct RouteKey {
    dst: IpAddr,
    tos: u8,
    metric: u32,
}

/// Main-table host routes (IPv4 `/32`, IPv6 `/128`).
#[derive(Debug, Default)]
struct Routes {
    /// Key → device (`None`: not a unicast device route, e.g. `blackhole`).
    by_key: HashMap<RouteKey, Option<String>>,
    /// Device → keys of its routes.
    by_dev: HashMap<String, HashSet<RouteKey>>,
}

impl Routes {
    /// Adds (or replaces) the route at `key`; the device whose route it replaced.
    fn add(&mut self, key: RouteKey, target: Option<String>) -> Option<String> {
        let replaced = self.by_key.insert(key, target.clone()).flatten();
        if let Some(old_dev) = &replaced {
            self.unlink(old_dev, key);
        }
        if let Some(dev) = target {
            self.by_dev.entry(dev).or_default().insert(key);
        }
        replaced
    }

    /// Removes the route at `key` if it is `target`'s; true if it was.
    fn delete(&mut self, key: RouteKey, target: Option<&str>) -> bool {
        if self.by_key.get(&key).map(Option::as_deref) != Some(target) {
            return false;
        }
        self.by_key.remove(&key);
        if let Some(dev) = target {
            self.unlink(dev, key);
        }
        true
    }

    fn unlink(&mut self, dev: &str, key: RouteKey) {
        if let Some(keys) = self.by_dev.get_mut(dev) {
            keys.remove(&key);
            if keys.is_empty() {
                self.by_dev.remove(dev);
            }
        }
    }

    fn remove_dev(&mut self, dev: &str) {
        for key in self.by_dev.remove(dev).unwrap_or_default() {
            self.by_key.remove(&key);
        }
    }

    /// Whether `dev` has a host route of the family (`v6`).
    fn has_dev(&self, dev: &str, v6: bool) -> bool {
        self.by_dev
            .get(dev)
            .is_some_and(|keys| keys.iter().any(|k| k.dst.is_ipv6() == v6))
    }

    fn ips_of(&self, dev: &str) -> BTreeSet<Ipv4Addr> {
        self.by_dev
            .get(dev)
            .map(|keys| {
                keys.iter()
                    .filter_map(|k| match k.dst {
                        IpAddr::V4(a) => Some(a),
                        IpAddr::V6(_) => None,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn ips6_of(&self, dev: &str) -> BTreeSet<Ipv6Addr> {
        self.by_dev
            .get(dev)
            .map(|keys| {
                keys.iter()
                    .filter_map(|k| match k.dst {
                        IpAddr::V6(a) => Some(a),
                        IpAddr::V4(_) => None,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Parses one `ip route` / `ip monitor route` line: (deleted, key, device of a unicast
/// route). `None` for lines that do not matter: not a host route (IPv4 `A`/`A/32`,
/// IPv6 `A`/`A/128`), not the main table, not a route at all.
fn parse_route_line(line: &str) -> Option<(bool, RouteKey, Option<String>)> {
    let mut s = line.trim();
    if let Some(rest) = s.strip_prefix("[ROUTE]") {
        s = rest.trim_start();
    }
    let deleted = match s.strip_prefix("Deleted ") {
        Some(rest) => {
            s = rest.trim_start();
            true
        }
        None => false,
    };
    let words: Vec<&str> = s.split_whitespace().collect();
    let (unicast, dst_at) = match *words.first()? {
        "unicast" => (true, 1),
        "local" | "broadcast" | "anycast" | "multicast" | "blackhole" | "unreachable"
        | "prohibit" | "throw" | "nat" | "xresolve" => (false, 1),
        _ => (true, 0),
    };
    let dst_word = *words.get(dst_at)?;
    let dst: IpAddr = match dst_word.split_once('/') {
        None => dst_word.parse().ok()?,
        Some((a, "32")) => IpAddr::V4(a.parse().ok()?),
        Some((a, "128")) => IpAddr::V6(a.parse().ok()?),
        Some(_) => return None,
    };
    let (mut dev, mut tos, mut metric, mut multipath) = (None, 0u8, 0u32, false);
    let mut i = dst_at + 1;
    while i < words.len() {
        let value = words.get(i + 1).copied();
        match words[i] {
            "dev" => dev = value,
            "table" => {
                if !matches!(value, Some("main" | "254")) {
                    return None;
                }
            }
            "metric" => metric = value?.parse().ok()?,
            "tos" | "dsfield" => tos = parse_u8(value?)?,
            // Multipath (one-line form): not one device's route.
            "nexthop" => {
                multipath = true;
                break;
            }
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    let key = RouteKey { dst, tos, metric };
    let dev = dev.filter(|_| unicast && !multipath).map(str::to_string);
    Some((deleted, key, dev))
}

fn parse_u8(s: &str) -> Option<u8> {
    match s.strip_prefix("0x") {
        Some(hex) => u8::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

// ---------------------------------------------------------------------------------
// text helpers

/// Splits at the first `#` outside double quotes: (code, text after the `#`).
fn split_comment(s: &str) -> (&str, Option<&str>) {
    let mut quoted = false;
    for (i, c) in s.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '#' if !quoted => return (&s[..i], Some(&s[i + 1..])),
            _ => {}
        }
    }
    (s, None)
}

/// `N` of a comment `handle N …`.
fn parse_handle(comment: &str) -> Option<u64> {
    let mut words = comment.split_whitespace();
    match (words.next(), words.next()) {
        (Some("handle"), Some(n)) => n.parse().ok(),
        _ => None,
    }
}

/// First whitespace-separated word and the rest.
fn next_word(s: &str) -> Option<(&str, &str)> {
    let s = s.trim_start();
    if s.is_empty() {
        return None;
    }
    Some(match s.find(char::is_whitespace) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, ""),
    })
}

/// Whitespace-separated tokens; whitespace inside double quotes does not split.
fn tokens(s: &str) -> impl Iterator<Item = &str> {
    let mut rest = s;
    std::iter::from_fn(move || {
        rest = rest.trim_start();
        if rest.is_empty() {
            return None;
        }
        let mut quoted = false;
        let mut end = rest.len();
        for (i, c) in rest.char_indices() {
            match c {
                '"' => quoted = !quoted,
                c if c.is_whitespace() && !quoted => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        let (tok, tail) = rest.split_at(end);
        rest = tail;
        Some(tok)
    })
}

/// A token without trailing `,`/`;` and surrounding double quotes.
fn unquote(tok: &str) -> &str {
    let t = tok.trim_end_matches([',', ';']);
    t.strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(t)
}

/// Counts `{` and `}` outside double quotes.
fn count_braces(s: &str) -> (usize, usize) {
    let (mut opens, mut closes, mut quoted) = (0, 0, false);
    for c in s.chars() {
        match c {
            '"' => quoted = !quoted,
            '{' if !quoted => opens += 1,
            '}' if !quoted => closes += 1,
            _ => {}
        }
    }
    (opens, closes)
}

/// Splits at `sep` outside double quotes and nested braces.
fn split_top_level(s: &str, sep: char) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut quoted, mut start) = (0usize, false, 0);
    for (i, c) in s.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '{' if !quoted => depth += 1,
            '}' if !quoted => depth = depth.saturating_sub(1),
            c if c == sep && !quoted && depth == 0 => {
                out.push(&s[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const IF1: &str = "cali12345678901";
    const IF2: &str = "cali12345678902";

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().expect("test IP")
    }

    fn key(namespace: &str, service: &str, addr: &str) -> ServiceEndpointKey {
        ServiceEndpointKey {
            namespace: namespace.to_string(),
            service: service.to_string(),
            ip: ip(addr),
        }
    }

    fn strings(xs: &[&str]) -> Vec<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    fn dispatch_change(added: &[&str], removed: &[&str]) -> Change {
        Change {
            dispatched_added: strings(added),
            dispatched_removed: strings(removed),
            ..Change::default()
        }
    }

    fn service_change(added: Vec<ServiceEndpointKey>, removed: Vec<ServiceEndpointKey>) -> Change {
        Change {
            services_added: added,
            services_removed: removed,
            ..Change::default()
        }
    }

    /// Feeds `text` line by line; every change with its 1-based line number.
    fn feed_nft_text(st: &mut RulesetState, text: &str) -> Vec<(usize, Change)> {
        text.lines()
            .enumerate()
            .filter_map(|(i, line)| st.feed_nft(line).map(|c| (i + 1, c)))
            .collect()
    }

    fn routed(pairs: &[(&str, &[&str])]) -> BTreeMap<String, BTreeSet<Ipv4Addr>> {
        pairs
            .iter()
            .map(|(iface, ips)| (iface.to_string(), ips.iter().map(|s| ip(s)).collect()))
            .collect()
    }

    /// The brief's Felix sample, first transaction (from-dispatch for IF1 only).
    const FELIX_GEN2: &str = r#"add table ip filter # handle 1
create chain ip filter cali-from-wl-dispatch # handle 1
create chain ip filter cali-fw-cali12345678901 # handle 2
add rule ip filter cali-fw-cali12345678901  counter packets 0 bytes 0 accept # handle 3
add rule ip filter cali-from-wl-dispatch iifname "cali12345678901"  counter packets 0 bytes 0 goto cali-fw-cali12345678901 # handle 4
add rule ip filter cali-from-wl-dispatch  counter packets 0 bytes 0 drop # handle 5
# new generation 2 by process 6284 (iptables-nft-re)"#;

    /// To-dispatch for IF1 and IF2 (chain handle 7, rules 10 and 11).
    const FELIX_TO_RULES: &str = r#"create chain ip filter cali-to-wl-dispatch # handle 7
create chain ip filter cali-tw-cali12345678901 # handle 8
create chain ip filter cali-tw-cali12345678902 # handle 9
add rule ip filter cali-to-wl-dispatch oifname "cali12345678901" counter packets 0 bytes 0 goto cali-tw-cali12345678901 # handle 10
add rule ip filter cali-to-wl-dispatch oifname "cali12345678902" counter packets 0 bytes 0 goto cali-tw-cali12345678902 # handle 11
# new generation 3 by process 6285 (iptables-nft-re)"#;

    /// A node where IF1 is dispatched (10.7.1.5) and IF2 has only its to-rule.
    fn dispatched_node() -> RulesetState {
        let mut st = RulesetState::new();
        assert_eq!(
            st.feed_route("10.7.1.5 dev cali12345678901 scope link "),
            None
        );
        assert!(feed_nft_text(&mut st, FELIX_GEN2).is_empty());
        assert_eq!(
            feed_nft_text(&mut st, FELIX_TO_RULES),
            vec![(6, dispatch_change(&[IF1], &[]))]
        );
        assert_eq!(st.dispatched(), routed(&[(IF1, &["10.7.1.5"])]));
        st
    }

    #[test]
    fn dispatch_needs_from_rule_to_rule_and_route() {
        // Route and from-rule only: nothing.
        let mut st = RulesetState::new();
        assert_eq!(
            st.feed_route("10.7.1.5 dev cali12345678901 scope link "),
            None
        );
        assert!(feed_nft_text(&mut st, FELIX_GEN2).is_empty());
        assert!(st.dispatched().is_empty());
        // Both rules but no route: nothing.
        let mut st = RulesetState::new();
        assert!(feed_nft_text(&mut st, FELIX_GEN2).is_empty());
        assert!(feed_nft_text(&mut st, FELIX_TO_RULES).is_empty());
        assert!(st.dispatched().is_empty());
        // The route completes it: reported at the route line.
        assert_eq!(
            st.feed_route("10.7.1.5 dev cali12345678901 scope link "),
            Some(dispatch_change(&[IF1], &[]))
        );
        assert_eq!(st.dispatched(), routed(&[(IF1, &["10.7.1.5"])]));
        // The same route again (a replace with `proto 80`) is no change.
        assert_eq!(
            st.feed_route("10.7.1.5 dev cali12345678901 proto 80 scope link "),
            None
        );
        // Rules first, then route, via dispatched_node's order: rules complete it.
        let st = dispatched_node();
        assert_eq!(st.dispatched(), routed(&[(IF1, &["10.7.1.5"])]));
    }

    #[test]
    fn removing_the_from_rule_reports_removal() {
        let mut st = dispatched_node();
        let text = "delete rule ip filter cali-from-wl-dispatch handle 4\n\
                    # new generation 4 by process 6286 (iptables-nft-re)";
        assert_eq!(
            feed_nft_text(&mut st, text),
            vec![(2, dispatch_change(&[], &[IF1]))]
        );
        assert!(st.dispatched().is_empty());
    }

    #[test]
    fn removing_the_to_rule_reports_removal() {
        let mut st = dispatched_node();
        let text = "delete rule ip filter cali-to-wl-dispatch handle 10\n\
                    # new generation 4 by process 6286 (iptables-nft-re)";
        assert_eq!(
            feed_nft_text(&mut st, text),
            vec![(2, dispatch_change(&[], &[IF1]))]
        );
    }

    #[test]
    fn removing_the_route_reports_removal_at_once() {
        let mut st = dispatched_node();
        assert_eq!(
            st.feed_route("Deleted 10.7.1.5 dev cali12345678901 proto 80 scope link "),
            Some(dispatch_change(&[], &[IF1]))
        );
        assert!(st.dispatched().is_empty());
        assert_eq!(
            st.feed_route("10.7.1.5 dev cali12345678901 scope link "),
            Some(dispatch_change(&[IF1], &[]))
        );
    }

    #[test]
    fn changes_are_reported_only_at_generation_lines() {
        let mut st = RulesetState::new();
        st.feed_route("10.7.1.5 dev cali12345678901 scope link ");
        let all = format!("{FELIX_GEN2}\n{FELIX_TO_RULES}");
        let lines: Vec<&str> = all.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let change = st.feed_nft(line);
            if i + 1 < lines.len() {
                assert_eq!(change, None, "line {}: {line}", i + 1);
                assert!(st.dispatched().is_empty(), "visible before commit: {line}");
            } else {
                assert_eq!(change, Some(dispatch_change(&[IF1], &[])));
            }
        }
        assert_eq!(st.generation(), Some(3));
        // A removal followed by a re-add in one transaction is no change.
        let text = "delete rule ip filter cali-from-wl-dispatch handle 4\n\
                    add rule ip filter cali-from-wl-dispatch iifname \"cali12345678901\" counter packets 0 bytes 0 goto cali-fw-cali12345678901 # handle 12\n\
                    # new generation 4 by process 6286 (iptables-nft-re)";
        assert!(feed_nft_text(&mut st, text).is_empty());
        assert_eq!(st.dispatched(), routed(&[(IF1, &["10.7.1.5"])]));
        // The delete alone is visible only at its generation line.
        assert_eq!(
            st.feed_nft("delete rule ip filter cali-from-wl-dispatch handle 12"),
            None
        );
        assert_eq!(st.dispatched(), routed(&[(IF1, &["10.7.1.5"])]));
        assert_eq!(
            st.feed_nft("# new generation 5 by process 6287 (iptables-nft-re)"),
            Some(dispatch_change(&[], &[IF1]))
        );
        assert_eq!(st.generation(), Some(5));
    }

    #[test]
    fn replaced_rule_with_reused_handle_is_tracked() {
        let mut st = dispatched_node();
        st.feed_route("10.7.1.6 dev cali12345678902 scope link ");
        // The brief's generations 3 and 4: rule 4 goes; rule 5 (the drop) is replaced
        // by a from-rule for IF2 that jumps to IF1's chain (not a dispatch leaf).
        let text = r#"delete rule ip filter cali-from-wl-dispatch handle 4
# new generation 4 by process 6286 (iptables-nft-re)
add rule ip filter cali-from-wl-dispatch iifname "cali12345678901" counter packets 0 bytes 0 goto cali-fw-cali12345678901 # handle 6
delete rule ip filter cali-from-wl-dispatch handle 5
add rule ip filter cali-from-wl-dispatch iifname "cali12345678902" counter packets 0 bytes 0 goto cali-fw-cali12345678901 # handle 5
# new generation 5 by process 6401 (iptables-nft-re)
delete rule ip filter cali-from-wl-dispatch handle 5
add rule ip filter cali-from-wl-dispatch iifname "cali12345678902" counter packets 0 bytes 0 goto cali-fw-cali12345678902 # handle 5
# new generation 6 by process 6402 (iptables-nft-re)
delete rule ip filter cali-from-wl-dispatch handle 5
add rule ip filter cali-from-wl-dispatch counter packets 0 bytes 0 drop # handle 5
# new generation 7 by process 6403 (iptables-nft-re)"#;
        assert_eq!(
            feed_nft_text(&mut st, text),
            vec![
                (2, dispatch_change(&[], &[IF1])),
                (6, dispatch_change(&[IF1], &[])),
                (9, dispatch_change(&[IF2], &[])),
                (12, dispatch_change(&[], &[IF2])),
            ]
        );
        assert_eq!(st.dispatched(), routed(&[(IF1, &["10.7.1.5"])]));
        // Handle 5 now holds a rule without a fact: nothing of IF2's rule is kept.
        assert!(!st.nft.filter.rules.contains_key(&5));
    }

    #[test]
    fn add_without_delete_overwrites_the_handle() {
        let mut st = dispatched_node();
        let text =
            "add rule ip filter cali-from-wl-dispatch counter packets 0 bytes 0 drop # handle 4\n\
                    # new generation 4 by process 1 (nft)";
        assert_eq!(
            feed_nft_text(&mut st, text),
            vec![(2, dispatch_change(&[], &[IF1]))]
        );
    }

    #[test]
    fn chain_delete_drops_its_rules() {
        let mut st = dispatched_node();
        let text = "delete chain ip filter cali-from-wl-dispatch\n\
                    # new generation 4 by process 1 (iptables-nft)";
        assert_eq!(
            feed_nft_text(&mut st, text),
            vec![(2, dispatch_change(&[], &[IF1]))]
        );
        assert!(!st.nft.filter.chains.contains_key("cali-from-wl-dispatch"));
        assert!(!st
            .nft
            .filter
            .chain_rules
            .contains_key("cali-from-wl-dispatch"));
    }

    #[test]
    fn chain_flush_drops_its_rules() {
        let mut st = dispatched_node();
        let text = "flush chain ip filter cali-to-wl-dispatch\n\
                    # new generation 4 by process 1 (nft)";
        assert_eq!(
            feed_nft_text(&mut st, text),
            vec![(2, dispatch_change(&[], &[IF1]))]
        );
    }

    #[test]
    fn table_delete_drops_every_rule_and_chain() {
        let mut st = dispatched_node();
        let text = "delete table ip filter # handle 1\n\
                    # new generation 4 by process 1 (nft)";
        assert_eq!(
            feed_nft_text(&mut st, text),
            vec![(2, dispatch_change(&[], &[IF1]))]
        );
        assert!(st.nft.filter.rules.is_empty());
        assert!(st.nft.filter.chains.is_empty());
        assert!(st.nft.filter.chain_by_handle.is_empty());
        assert!(st.nft.filter.chain_rules.is_empty());
    }

    #[test]
    fn flush_ruleset_drops_everything() {
        let mut st = dispatched_node();
        let text = "flush ruleset\n# new generation 4 by process 1 (nft)";
        assert_eq!(
            feed_nft_text(&mut st, text),
            vec![(2, dispatch_change(&[], &[IF1]))]
        );
    }

    #[test]
    fn chain_rename_keeps_rules_under_the_new_name() {
        // `iptables -E` shows as `add chain` with the old chain's handle (observed).
        let mut st = dispatched_node();
        let text = "add chain ip filter cali-to-renamed # handle 7\n\
                    # new generation 4 by process 1 (iptables-nft)";
        assert!(feed_nft_text(&mut st, text).is_empty());
        assert_eq!(st.nft.filter.rules[&10].chain, "cali-to-renamed");
        assert!(!st.nft.filter.chains.contains_key("cali-to-wl-dispatch"));
        let text = "delete chain ip filter cali-to-renamed\n\
                    # new generation 5 by process 1 (iptables-nft)";
        assert_eq!(
            feed_nft_text(&mut st, text),
            vec![(2, dispatch_change(&[], &[IF1]))]
        );
    }

    #[test]
    fn wildcard_negated_foreign_and_mismatched_rules_do_not_dispatch() {
        let mut st = RulesetState::new();
        st.feed_route("10.7.1.5 dev cali12345678901 scope link ");
        st.feed_route("10.7.9.9 dev eth0 scope link ");
        let text = r#"add rule ip filter d iifname "cali*" counter packets 0 bytes 0 goto cali-fw-cali12345678901 # handle 20
add rule ip filter d iifname != "cali12345678901" counter packets 0 bytes 0 goto cali-fw-cali12345678901 # handle 21
add rule ip filter d iifname "eth0" goto cali-fw-eth0 # handle 22
add rule ip filter d oifname "eth0" goto cali-tw-eth0 # handle 23
add rule ip filter d iifname "cali12345678901" counter comment "goto cali-fw-cali12345678901" drop # handle 24
add rule ip filter d oifname "cali12345678901" goto cali-fw-cali12345678901 # handle 25
add rule ip filter d iifname "cali12345678901" goto cali-sm-cali12345678901 # handle 26
add rule ip filter d iifname "cali12345678901" jump cali-fw-cali12345678901 # handle 27
add rule ip filter d oifname "cali12345678901" goto cali-tw-cali12345678901 # handle 28
add rule ip filter d oifname "cali12345678901" goto cali-tw-cali12345678901 # handle 29
# new generation 2 by process 1 (iptables-nft-re)"#;
        assert!(feed_nft_text(&mut st, text).is_empty());
        assert!(st.dispatched().is_empty());
        // Only the two to-rules carry a fact.
        let mut kept: Vec<u64> = st.nft.filter.rules.keys().copied().collect();
        kept.sort_unstable();
        assert_eq!(kept, vec![28, 29]);
        // Removing one of two identical to-rules keeps the other one counting.
        let text = r#"add rule ip filter d iifname "cali12345678901" goto cali-fw-cali12345678901 # handle 30
# new generation 3 by process 1 (iptables-nft-re)
delete rule ip filter d handle 28
# new generation 4 by process 1 (iptables-nft-re)"#;
        assert_eq!(
            feed_nft_text(&mut st, text),
            vec![(2, dispatch_change(&[IF1], &[]))]
        );
    }

    #[test]
    fn other_tables_and_families_are_ignored() {
        let mut st = RulesetState::new();
        st.feed_route("10.7.1.5 dev cali12345678901 scope link ");
        let mut text = String::new();
        for table in [
            "ip6 filter",
            "inet filter",
            "ip mangle",
            "ip raw",
            "bridge filter",
        ] {
            text.push_str(&format!(
                "add rule {table} d iifname \"{IF1}\" goto cali-fw-{IF1} # handle 4\n\
                 add rule {table} d oifname \"{IF1}\" goto cali-tw-{IF1} # handle 5\n"
            ));
        }
        text.push_str("# new generation 2 by process 1 (nft)");
        assert!(feed_nft_text(&mut st, &text).is_empty());
        assert!(st.dispatched().is_empty());
        assert!(st.nft.filter.rules.is_empty());
    }

    /// The brief's kube-proxy sample (generations 8 and 9).
    const KP_MONITOR: &str = r#"add table ip kube-proxy # handle 4
add chain ip kube-proxy services # handle 1
add map ip kube-proxy service-ips { # handle 3 type ipv4_addr . inet_proto . inet_service : verdict; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"; } 
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips # handle 4
add chain ip kube-proxy service-ULMVA6XW-firstpacket/fp-svc-1/tcp/http # handle 5
add chain ip kube-proxy endpoint-5OJB2KTY-firstpacket/fp-svc-1/tcp/http__10.7.1.5/8080 # handle 6
add rule ip kube-proxy endpoint-5OJB2KTY-firstpacket/fp-svc-1/tcp/http__10.7.1.5/8080 ip saddr 10.7.1.5 jump mark-for-masquerade # handle 7
add rule ip kube-proxy endpoint-5OJB2KTY-firstpacket/fp-svc-1/tcp/http__10.7.1.5/8080 meta l4proto tcp dnat to 10.7.1.5:8080 # handle 8
add rule ip kube-proxy service-ULMVA6XW-firstpacket/fp-svc-1/tcp/http ip daddr 10.96.0.5 tcp dport 80 ip saddr != 10.7.0.0/16 jump mark-for-masquerade # handle 9
add rule ip kube-proxy service-ULMVA6XW-firstpacket/fp-svc-1/tcp/http numgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-firstpacket/fp-svc-1/tcp/http__10.7.1.5/8080 } # handle 11
add element ip kube-proxy service-ips { 10.96.0.5 . tcp . 80 : goto service-ULMVA6XW-firstpacket/fp-svc-1/tcp/http }
# new generation 8 by process 10018 (nft)
delete element ip kube-proxy service-ips { 10.96.0.5 . tcp . 80 : goto service-ULMVA6XW-firstpacket/fp-svc-1/tcp/http }
delete rule ip kube-proxy service-ULMVA6XW-firstpacket/fp-svc-1/tcp/http handle 9
delete rule ip kube-proxy service-ULMVA6XW-firstpacket/fp-svc-1/tcp/http handle 11
delete set ip kube-proxy __map0
delete rule ip kube-proxy endpoint-5OJB2KTY-firstpacket/fp-svc-1/tcp/http__10.7.1.5/8080 handle 7
delete rule ip kube-proxy endpoint-5OJB2KTY-firstpacket/fp-svc-1/tcp/http__10.7.1.5/8080 handle 8
delete chain ip kube-proxy endpoint-5OJB2KTY-firstpacket/fp-svc-1/tcp/http__10.7.1.5/8080
# new generation 9 by process 10019 (nft)"#;

    /// KP_MONITOR up to and including generation 8.
    fn kp_programmed() -> RulesetState {
        let mut st = RulesetState::new();
        let gen8: String = KP_MONITOR.lines().take(12).collect::<Vec<_>>().join("\n");
        assert_eq!(
            feed_nft_text(&mut st, &gen8),
            vec![(
                12,
                service_change(vec![key("firstpacket", "fp-svc-1", "10.7.1.5")], vec![])
            )]
        );
        st
    }

    /// kube-proxy v1.36.3 as seen on a testbed node: the endpoint's DNAT inlined into
    /// the service chain, no endpoint chain.
    #[test]
    fn kube_proxy_inline_dnat_map_programs_and_removes_the_endpoint() {
        let mut st = RulesetState::new();
        let text = r#"add table ip kube-proxy # handle 6
add chain ip kube-proxy service-TCG7BHYF-firstpacket/fp-a597we1n-0-svc/tcp/http # handle 69
add element ip kube-proxy service-ips { 10.221.105.237 . tcp . 80 : goto service-TCG7BHYF-firstpacket/fp-a597we1n-0-svc/tcp/http }
add rule ip kube-proxy service-TCG7BHYF-firstpacket/fp-a597we1n-0-svc/tcp/http meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.85.1.10 . 8080, 1 : 10.85.2.7 . 8080 } # handle 71
# new generation 49 by process 19042 (nft)
delete rule ip kube-proxy service-TCG7BHYF-firstpacket/fp-a597we1n-0-svc/tcp/http handle 71
delete set ip kube-proxy __map1
delete element ip kube-proxy service-ips { 10.221.105.237 . tcp . 80 : goto service-TCG7BHYF-firstpacket/fp-a597we1n-0-svc/tcp/http }
# new generation 50 by process 19059 (nft)
"#;
        let changes = feed_nft_text(&mut st, text);
        assert_eq!(changes.len(), 2, "{changes:?}");
        let k = |ip| key("firstpacket", "fp-a597we1n-0-svc", ip);
        assert_eq!(
            changes[0].1,
            service_change(vec![k("10.85.1.10"), k("10.85.2.7")], vec![])
        );
        assert_eq!(
            changes[1].1,
            service_change(vec![], vec![k("10.85.1.10"), k("10.85.2.7")])
        );
        assert_eq!(dnat_targets("dnat to 10.7.1.5:8080"), vec![ip("10.7.1.5")]);
        assert!(dnat_targets("meta l4proto tcp accept").is_empty());
    }

    #[test]
    fn kube_proxy_sample_programs_then_removes_the_endpoint() {
        let mut st = RulesetState::new();
        let svc = key("firstpacket", "fp-svc-1", "10.7.1.5");
        assert_eq!(
            feed_nft_text(&mut st, KP_MONITOR),
            vec![
                (12, service_change(vec![svc.clone()], vec![])),
                (20, service_change(vec![], vec![svc])),
            ]
        );
        assert!(st.service_endpoints().is_empty());
        assert_eq!(st.generation(), Some(9));
    }

    #[test]
    fn kube_proxy_needs_element_service_rule_and_endpoint_dnat() {
        let svc = key("firstpacket", "fp-svc-1", "10.7.1.5");
        // Without the element (line 11): nothing.
        let mut st = RulesetState::new();
        let no_element: String = KP_MONITOR
            .lines()
            .take(12)
            .enumerate()
            .filter(|(i, _)| *i != 10)
            .map(|(_, l)| l)
            .collect::<Vec<_>>()
            .join("\n");
        assert!(feed_nft_text(&mut st, &no_element).is_empty());
        assert!(st.service_endpoints().is_empty());
        // Without the vmap rule (line 10): nothing.
        let mut st = RulesetState::new();
        let no_vmap: String = KP_MONITOR
            .lines()
            .take(12)
            .enumerate()
            .filter(|(i, _)| *i != 9)
            .map(|(_, l)| l)
            .collect::<Vec<_>>()
            .join("\n");
        assert!(feed_nft_text(&mut st, &no_vmap).is_empty());
        // Without the dnat rule (line 8): nothing.
        let mut st = RulesetState::new();
        let no_dnat: String = KP_MONITOR
            .lines()
            .take(12)
            .enumerate()
            .filter(|(i, _)| *i != 7)
            .map(|(_, l)| l)
            .collect::<Vec<_>>()
            .join("\n");
        assert!(feed_nft_text(&mut st, &no_dnat).is_empty());

        // Each removal alone is reported; putting it back is reported again.
        let mut st = kp_programmed();
        let steps: [(&str, &str); 3] = [
            (
                "delete element ip kube-proxy service-ips { 10.96.0.5 . tcp . 80 : goto service-ULMVA6XW-firstpacket/fp-svc-1/tcp/http }",
                "add element ip kube-proxy service-ips { 10.96.0.5 . tcp . 80 : goto service-ULMVA6XW-firstpacket/fp-svc-1/tcp/http }",
            ),
            (
                "delete rule ip kube-proxy service-ULMVA6XW-firstpacket/fp-svc-1/tcp/http handle 11",
                "add rule ip kube-proxy service-ULMVA6XW-firstpacket/fp-svc-1/tcp/http numgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-firstpacket/fp-svc-1/tcp/http__10.7.1.5/8080 } # handle 12",
            ),
            (
                "delete rule ip kube-proxy endpoint-5OJB2KTY-firstpacket/fp-svc-1/tcp/http__10.7.1.5/8080 handle 8",
                "add rule ip kube-proxy endpoint-5OJB2KTY-firstpacket/fp-svc-1/tcp/http__10.7.1.5/8080 meta l4proto tcp dnat to 10.7.1.5:8080 # handle 13",
            ),
        ];
        for (remove, restore) in steps {
            assert_eq!(st.feed_nft(remove), None);
            assert_eq!(
                st.feed_nft("# new generation 20 by process 1 (nft)"),
                Some(service_change(vec![], vec![svc.clone()])),
                "{remove}"
            );
            assert_eq!(st.feed_nft(restore), None);
            assert_eq!(
                st.feed_nft("# new generation 21 by process 1 (nft)"),
                Some(service_change(vec![svc.clone()], vec![])),
                "{restore}"
            );
        }
        // The masquerade rule alone does not make an endpoint chain DNAT.
        assert_eq!(
            st.feed_nft("delete rule ip kube-proxy endpoint-5OJB2KTY-firstpacket/fp-svc-1/tcp/http__10.7.1.5/8080 handle 13"),
            None
        );
        assert_eq!(
            st.feed_nft("# new generation 22 by process 1 (nft)"),
            Some(service_change(vec![], vec![svc]))
        );
    }

    #[test]
    fn several_elements_per_line_and_delete_by_key_alone() {
        let mut st = RulesetState::new();
        let a = key("ns-a", "svc-a", "10.7.1.5");
        let b = key("ns-b", "dns", "10.7.2.9");
        let text = r#"add chain ip kube-proxy service-AAAAAAAA-ns-a/svc-a/tcp/ # handle 5
add chain ip kube-proxy service-BBBBBBBB-ns-b/dns/udp/dns # handle 6
add chain ip kube-proxy endpoint-CCCCCCCC-ns-a/svc-a/tcp/__10.7.1.5/8080 # handle 7
add chain ip kube-proxy endpoint-DDDDDDDD-ns-b/dns/udp/dns__10.7.2.9/53 # handle 8
add rule ip kube-proxy endpoint-CCCCCCCC-ns-a/svc-a/tcp/__10.7.1.5/8080 meta l4proto tcp dnat to 10.7.1.5:8080 # handle 9
add rule ip kube-proxy endpoint-DDDDDDDD-ns-b/dns/udp/dns__10.7.2.9/53 meta l4proto udp dnat to 10.7.2.9:53 # handle 10
add rule ip kube-proxy service-AAAAAAAA-ns-a/svc-a/tcp/ numgen random mod 1 vmap { 0 : goto endpoint-CCCCCCCC-ns-a/svc-a/tcp/__10.7.1.5/8080 } # handle 11
add rule ip kube-proxy service-BBBBBBBB-ns-b/dns/udp/dns numgen random mod 1 vmap { 0 : goto endpoint-DDDDDDDD-ns-b/dns/udp/dns__10.7.2.9/53 } # handle 12
add element ip kube-proxy service-ips { 10.96.0.5 . tcp . 80 : goto service-AAAAAAAA-ns-a/svc-a/tcp/, 10.96.0.9 . udp . 53 : goto service-BBBBBBBB-ns-b/dns/udp/dns }
# new generation 2 by process 1 (nft)
delete element ip kube-proxy service-ips { 10.96.0.5 . tcp . 80 }
# new generation 3 by process 1 (nft)"#;
        assert_eq!(
            feed_nft_text(&mut st, text),
            vec![
                (10, service_change(vec![a.clone(), b.clone()], vec![])),
                (12, service_change(vec![], vec![a])),
            ]
        );
        assert_eq!(st.service_endpoints(), BTreeSet::from([b]));
        assert_eq!(st.nft.kube_proxy.elements.len(), 1);
    }

    #[test]
    fn service_chain_with_several_endpoints_and_local_policy_chain() {
        let mut st = RulesetState::new();
        let text = r#"add rule ip kube-proxy endpoint-5OJB2KTY-ns/s/tcp/http__10.7.1.5/8080 meta l4proto tcp dnat to 10.7.1.5:8080 # handle 9
add rule ip kube-proxy endpoint-AAAAAAAA-ns/s/tcp/http__10.7.1.6/8080 meta l4proto tcp dnat to 10.7.1.6:8080 # handle 10
add rule ip kube-proxy service-ULMVA6XW-ns/s/tcp/http numgen random mod 2 vmap { 0 : goto endpoint-5OJB2KTY-ns/s/tcp/http__10.7.1.5/8080, 1 : goto endpoint-AAAAAAAA-ns/s/tcp/http__10.7.1.6/8080 } # handle 13
add rule ip kube-proxy local-ULMVA6XW-ns/l/tcp/http numgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-ns/s/tcp/http__10.7.1.5/8080 } # handle 14
add element ip kube-proxy service-ips { 10.96.0.5 . tcp . 80 : goto service-ULMVA6XW-ns/s/tcp/http }
add element ip kube-proxy service-ips { 10.96.0.6 . tcp . 80 : goto local-ULMVA6XW-ns/l/tcp/http }
add element ip kube-proxy service-ips { 10.96.0.7 . tcp . 80 : goto external-ULMVA6XW-ns/x/tcp/http }
# new generation 2 by process 1 (nft)"#;
        assert_eq!(feed_nft_text(&mut st, text).len(), 1);
        assert_eq!(
            st.service_endpoints(),
            BTreeSet::from([
                key("ns", "l", "10.7.1.5"),
                key("ns", "s", "10.7.1.5"),
                key("ns", "s", "10.7.1.6"),
            ])
        );
    }

    #[test]
    fn flushing_and_refilling_the_map_in_one_transaction_is_no_change() {
        // kube-proxy flushes `service-ips` on every sync (observed as element deletes).
        let mut st = kp_programmed();
        let text = r#"delete element ip kube-proxy service-ips { 10.96.0.5 . tcp . 80 : goto service-ULMVA6XW-firstpacket/fp-svc-1/tcp/http }
add element ip kube-proxy service-ips { 10.96.0.5 . tcp . 80 : goto service-ULMVA6XW-firstpacket/fp-svc-1/tcp/http }
# new generation 9 by process 1 (nft)"#;
        assert!(feed_nft_text(&mut st, text).is_empty());
        assert_eq!(st.service_endpoints().len(), 1);
    }

    #[test]
    fn deleting_or_flushing_the_map_drops_its_elements() {
        for line in [
            "delete set ip kube-proxy service-ips",
            "delete map ip kube-proxy service-ips",
            "flush map ip kube-proxy service-ips",
            "delete table ip kube-proxy # handle 4",
        ] {
            let mut st = kp_programmed();
            assert_eq!(st.feed_nft(line), None);
            assert_eq!(
                st.feed_nft("# new generation 9 by process 1 (nft)"),
                Some(service_change(
                    vec![],
                    vec![key("firstpacket", "fp-svc-1", "10.7.1.5")]
                )),
                "{line}"
            );
            assert!(st.nft.kube_proxy.elements.is_empty());
        }
        // Another set's deletion (the anonymous vmap) changes nothing.
        let mut st = kp_programmed();
        st.feed_nft("delete set ip kube-proxy __map0");
        assert_eq!(st.feed_nft("# new generation 9 by process 1 (nft)"), None);
    }

    #[test]
    fn chain_names_parse_as_kube_proxy_writes_them() {
        assert_eq!(
            parse_service_chain("service-ULMVA6XW-firstpacket/fp-svc-1/tcp/http"),
            Some(("firstpacket", "fp-svc-1"))
        );
        assert_eq!(
            parse_service_chain("local-ULMVA6XW-ns/svc/udp/"),
            Some(("ns", "svc"))
        );
        assert_eq!(parse_service_chain("services"), None);
        assert_eq!(parse_service_chain("service-ulmva6xw-ns/svc/tcp/p"), None);
        assert_eq!(parse_service_chain("external-ULMVA6XW-ns/svc/tcp/p"), None);
        assert_eq!(
            parse_endpoint_chain_ip(
                "endpoint-5OJB2KTY-firstpacket/fp-svc-1/tcp/http__10.7.1.5/8080"
            ),
            Some(ip("10.7.1.5"))
        );
        assert_eq!(
            parse_endpoint_chain_ip("endpoint-5OJB2KTY-ns/svc/tcp/__10.7.1.5/8080"),
            Some(ip("10.7.1.5"))
        );
        // IPv6 endpoint (`:` → `.`), truncated name, missing port, no hash.
        assert_eq!(
            parse_endpoint_chain_ip("endpoint-5OJB2KTY-ns/svc/tcp/p__fd00..1/8080"),
            None
        );
        assert_eq!(
            parse_endpoint_chain_ip("endpoint-5OJB2KTY-ns/svc/tcp/p__10.7.1.5/80..."),
            None
        );
        assert_eq!(
            parse_endpoint_chain_ip("endpoint-5OJB2KTY-ns/svc/tcp/p__10.7.1.5"),
            None
        );
        assert_eq!(
            parse_endpoint_chain_ip("endpoint-ns/svc/tcp/p__10.7.1.5/80"),
            None
        );
    }

    /// The brief's `nft -a list ruleset` sample.
    const BRIEF_LISTING: &str = "table ip filter { # handle 1
\tchain cali-from-wl-dispatch { # handle 1
\t\tiifname \"cali12345678901\" counter packets 0 bytes 0 goto cali-fw-cali12345678901 # handle 6
\t\t counter packets 0 bytes 0 drop # handle 5
\t}

\tchain cali-fw-cali12345678901 { # handle 2
\t\t counter packets 0 bytes 0 accept # handle 3
\t}
}
table ip kube-proxy { # handle 4
\tcomment \"rules for kube-proxy\"
\tmap service-ips { # handle 3
\t\ttype ipv4_addr . inet_proto . inet_service : verdict
\t\tcomment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\"
\t\telements = { 10.96.0.5 . tcp . 80 : goto service-ULMVA6XW-firstpacket/fp-svc-1/tcp/http, 10.96.0.1 . tcp . 443 : goto service-2QRHZV4L-default/kubernetes/tcp/https }
\t}
\tchain service-ULMVA6XW-firstpacket/fp-svc-1/tcp/http { # handle 5
\t\tip daddr 10.96.0.5 tcp dport 80 ip saddr != 10.7.0.0/16 jump mark-for-masquerade # handle 9
\t\tnumgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-firstpacket/fp-svc-1/tcp/http__10.7.1.5/8080 } # handle 11
\t}
}
# Warning: table ip filter is managed by iptables-nft, do not touch!
";

    #[test]
    fn brief_snapshot_parses_but_programs_nothing() {
        // From-rule without to-rule; service chain whose endpoint chain does not exist.
        let mut st = RulesetState::new();
        assert_eq!(st.load_nft_snapshot(BRIEF_LISTING), None);
        assert_eq!(
            st.load_route_snapshot("10.7.1.5 dev cali12345678901 scope link\n"),
            None
        );
        assert!(st.dispatched().is_empty());
        assert!(st.service_endpoints().is_empty());
        let kp = &st.nft.kube_proxy;
        let mut elements: Vec<(&str, &str)> = kp
            .elements
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        elements.sort_unstable();
        assert_eq!(
            elements,
            vec![
                (
                    "10.96.0.1 . tcp . 443",
                    "service-2QRHZV4L-default/kubernetes/tcp/https"
                ),
                (
                    "10.96.0.5 . tcp . 80",
                    "service-ULMVA6XW-firstpacket/fp-svc-1/tcp/http"
                ),
            ]
        );
        assert_eq!(
            kp.chains["service-ULMVA6XW-firstpacket/fp-svc-1/tcp/http"],
            5
        );
        assert_eq!(
            st.nft.filter.rules[&6].fact,
            RuleFact::FromWorkload(IF1.to_string())
        );
        assert_eq!(st.nft.filter.rules.len(), 1);
        assert_eq!(st.nft.filter.chain_by_handle[&2], "cali-fw-cali12345678901");
    }

    /// A fuller listing: to-dispatch, base chain, set, multi-line elements (as nft
    /// prints long element lists), endpoint chains.
    const FULL_LISTING: &str = "table ip filter { # handle 1
\tchain FORWARD { # handle 1
\t\ttype filter hook forward priority filter; policy accept;
\t\t counter packets 0 bytes 0 jump cali-FORWARD # handle 2
\t}

\tchain cali-from-wl-dispatch { # handle 3
\t\tiifname \"cali12345678901\" counter packets 0 bytes 0 goto cali-fw-cali12345678901 # handle 6
\t\tiifname \"cali12345678902\" counter packets 0 bytes 0 goto cali-fw-cali12345678902 # handle 7
\t\t counter packets 0 bytes 0 drop comment \"cali:Unknown interface }\" # handle 8
\t}

\tchain cali-to-wl-dispatch { # handle 4
\t\toifname \"cali12345678901\" counter packets 0 bytes 0 goto cali-tw-cali12345678901 # handle 9
\t\toifname \"cali12345678902\" counter packets 0 bytes 0 goto cali-tw-cali12345678902 # handle 10
\t}
}
table ip6 filter { # handle 2
\tchain cali-to-wl-dispatch { # handle 1
\t\toifname \"cali12345678903\" counter packets 0 bytes 0 goto cali-tw-cali12345678903 # handle 2
\t}
}
table ip kube-proxy { # handle 3
\tcomment \"rules for kube-proxy\"
\tset cluster-ips { # handle 2
\t\ttype ipv4_addr
\t\tcomment \"Active ClusterIPs\"
\t\telements = { 10.96.0.5, 10.96.0.6,
\t\t\t     10.96.0.7 }
\t}

\tmap service-ips { # handle 3
\t\ttype ipv4_addr . inet_proto . inet_service : verdict
\t\tcomment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\"
\t\telements = { 10.96.0.5 . tcp . 80 : goto service-ULMVA6XW-firstpacket/fp-svc-1/tcp/http,
\t\t\t     10.96.0.6 . tcp . 80 : goto service-ULMVA6XW-firstpacket/fp-svc-1/tcp/http,
\t\t\t     10.96.0.7 . udp . 53 : goto service-BBBBBBBB-kube-system/kube-dns/udp/dns }
\t}

\tchain service-ULMVA6XW-firstpacket/fp-svc-1/tcp/http { # handle 5
\t\tip daddr 10.96.0.5 tcp dport 80 ip saddr != 10.7.0.0/16 jump mark-for-masquerade # handle 11
\t\tnumgen random mod 2 vmap { 0 : goto endpoint-5OJB2KTY-firstpacket/fp-svc-1/tcp/http__10.7.1.5/8080, 1 : goto endpoint-AAAAAAAA-firstpacket/fp-svc-1/tcp/http__10.7.1.6/8080 } # handle 13
\t}

\tchain endpoint-5OJB2KTY-firstpacket/fp-svc-1/tcp/http__10.7.1.5/8080 { # handle 6
\t\tip saddr 10.7.1.5 jump mark-for-masquerade # handle 8
\t\tmeta l4proto tcp dnat to 10.7.1.5:8080 # handle 9
\t}

\tchain endpoint-AAAAAAAA-firstpacket/fp-svc-1/tcp/http__10.7.1.6/8080 { # handle 7
\t\tip saddr 10.7.1.6 jump mark-for-masquerade # handle 10
\t}
}
# Warning: table ip filter is managed by iptables-nft, do not touch!
";

    #[test]
    fn full_snapshot_with_multiline_elements() {
        let mut st = RulesetState::new();
        assert_eq!(
            st.load_nft_snapshot(FULL_LISTING),
            Some(service_change(
                vec![key("firstpacket", "fp-svc-1", "10.7.1.5")],
                vec![]
            ))
        );
        assert_eq!(st.nft.kube_proxy.elements.len(), 3);
        assert_eq!(
            st.nft.kube_proxy.elements["10.96.0.7 . udp . 53"],
            "service-BBBBBBBB-kube-system/kube-dns/udp/dns"
        );
        let routes = "default via 10.6.0.1 dev eth0
blackhole 10.7.1.0/24 proto bird
10.7.1.5 dev cali12345678901 scope link
10.7.1.7 dev cali12345678901 scope link
10.7.1.6 dev cali12345678902 scope link
10.7.2.0/24 via 10.6.0.3 dev eth0
";
        assert_eq!(
            st.load_route_snapshot(routes),
            Some(dispatch_change(&[IF1, IF2], &[]))
        );
        assert_eq!(
            st.dispatched(),
            routed(&[(IF1, &["10.7.1.5", "10.7.1.7"]), (IF2, &["10.7.1.6"])])
        );
        // Monitor lines continue from the snapshot's handles.
        let text = "delete rule ip filter cali-to-wl-dispatch handle 10\n\
                    # new generation 40 by process 1 (iptables-nft-re)";
        assert_eq!(
            feed_nft_text(&mut st, text),
            vec![(2, dispatch_change(&[], &[IF2]))]
        );
    }

    #[test]
    fn snapshot_replaces_the_nft_state() {
        let mut st = kp_programmed();
        st.feed_route("10.7.1.5 dev cali12345678901 scope link ");
        assert_eq!(
            st.load_nft_snapshot(FULL_LISTING),
            Some(Change {
                dispatched_added: strings(&[IF1]),
                ..Change::default()
            })
        );
        // Same endpoint, nothing new; the monitor-era chains are gone.
        assert!(!st.nft.kube_proxy.chains.contains_key("services"));
        // Uncommitted monitor lines are dropped by a snapshot.
        st.feed_nft("delete rule ip filter cali-to-wl-dispatch handle 9");
        assert_eq!(st.load_nft_snapshot(FULL_LISTING), None);
        assert_eq!(st.feed_nft("# new generation 50 by process 1 (nft)"), None);
        // An empty ruleset removes everything.
        assert_eq!(
            st.load_nft_snapshot(""),
            Some(Change {
                dispatched_removed: strings(&[IF1]),
                services_removed: vec![key("firstpacket", "fp-svc-1", "10.7.1.5")],
                ..Change::default()
            })
        );
    }

    /// Felix's dispatch of IF1 both ways in one table (`ip` or `ip6`), one transaction.
    fn felix_dispatch(family: &str, generation: u64) -> String {
        format!(
            "add table {family} filter # handle 1\n\
             create chain {family} filter cali-from-wl-dispatch # handle 1\n\
             create chain {family} filter cali-to-wl-dispatch # handle 2\n\
             add rule {family} filter cali-from-wl-dispatch iifname \"{IF1}\" counter packets 0 bytes 0 goto cali-fw-{IF1} # handle 3\n\
             add rule {family} filter cali-to-wl-dispatch oifname \"{IF1}\" counter packets 0 bytes 0 goto cali-tw-{IF1} # handle 4\n\
             # new generation {generation} by process 7 (ip6tables-nft-r)\n"
        )
    }

    #[test]
    fn a_dual_stack_node_dispatches_an_interface_only_when_both_families_do() {
        const V6: &str = "fd21:66db:2e67:1::6";
        // IPv4-only node: the ip6 table and IPv6 routes change nothing.
        let mut v4 = RulesetState::new();
        v4.feed_route(&format!("10.7.1.5 dev {IF1} scope link"));
        assert_eq!(
            feed_nft_text(&mut v4, &felix_dispatch("ip", 2)),
            vec![(6, dispatch_change(&[IF1], &[]))]
        );
        assert!(feed_nft_text(&mut v4, &felix_dispatch("ip6", 3)).is_empty());
        assert_eq!(
            v4.feed_route(&format!("{V6} dev {IF1} metric 1024 pref medium")),
            None
        );
        assert!(v4.dispatched6().is_empty());

        // Dual-stack: IPv4 dispatch and route are not enough, nor the ip6 rules without
        // the /128 route; the last of the four completes it.
        let mut st = RulesetState::dual_stack();
        assert_eq!(
            st.feed_route(&format!("10.7.1.5 dev {IF1} scope link")),
            None
        );
        assert!(feed_nft_text(&mut st, &felix_dispatch("ip", 2)).is_empty());
        assert!(feed_nft_text(&mut st, &felix_dispatch("ip6", 3)).is_empty());
        assert!(st.dispatched().is_empty());
        assert_eq!(
            st.feed_route(&format!("{V6} dev {IF1} metric 1024 pref medium")),
            Some(dispatch_change(&[IF1], &[]))
        );
        assert_eq!(st.dispatched(), routed(&[(IF1, &["10.7.1.5"])]));
        assert_eq!(
            st.dispatched6()[IF1],
            [V6.parse::<Ipv6Addr>().unwrap()].into_iter().collect()
        );
        // The ip6 to-dispatch rule goes: revoked, though IPv4 still dispatches.
        assert_eq!(
            feed_nft_text(
                &mut st,
                "delete rule ip6 filter cali-to-wl-dispatch handle 4\n# new generation 4 by process 7 (ip6tables-nft-r)\n"
            ),
            vec![(2, dispatch_change(&[], &[IF1]))]
        );
        assert!(feed_nft_text(&mut st, &felix_dispatch("ip6", 5)).len() == 1);
        // The IPv6 route deleted: revoked; the link removed: nothing left.
        assert_eq!(
            st.feed_route(&format!("Deleted {V6} dev {IF1} metric 1024 pref medium")),
            Some(dispatch_change(&[], &[IF1]))
        );
        assert_eq!(
            st.feed_route(&format!("{V6}/128 dev {IF1} metric 1024")),
            Some(dispatch_change(&[IF1], &[]))
        );
        assert_eq!(st.link_removed(IF1), Some(dispatch_change(&[], &[IF1])));
        assert!(st.dispatched6().is_empty());

        // Snapshots: both tables from one listing, both families' routes from one text.
        let mut snap = RulesetState::dual_stack();
        let listing = format!(
            "table ip filter {{ # handle 1\n\tchain cali-from-wl-dispatch {{ # handle 1\n\t\tiifname \"{IF1}\" counter packets 0 bytes 0 goto cali-fw-{IF1} # handle 3\n\t}}\n\tchain cali-to-wl-dispatch {{ # handle 2\n\t\toifname \"{IF1}\" counter packets 0 bytes 0 goto cali-tw-{IF1} # handle 4\n\t}}\n}}\n"
        );
        let listing6 = listing.replace("table ip filter", "table ip6 filter");
        assert_eq!(snap.load_nft_snapshot(&listing), None);
        assert_eq!(
            snap.load_route_snapshot(&format!("10.7.1.5 dev {IF1} scope link\n{V6} dev {IF1} metric 1024 pref medium\nfe80::/64 dev {IF1} proto kernel metric 256 pref medium\n")),
            None
        );
        assert_eq!(
            snap.load_nft_snapshot(&format!("{listing}{listing6}")),
            Some(dispatch_change(&[IF1], &[]))
        );
    }

    #[test]
    fn ipv6_host_routes_parse_and_other_ipv6_routes_do_not() {
        let v6: IpAddr = "fd21:66db:2e67:1::6".parse().unwrap();
        let k = RouteKey {
            dst: v6,
            tos: 0,
            metric: 1024,
        };
        let dev = Some(IF1.to_string());
        assert_eq!(
            parse_route_line(&format!(
                "fd21:66db:2e67:1::6 dev {IF1} metric 1024 pref medium"
            )),
            Some((false, k, dev.clone()))
        );
        assert_eq!(
            parse_route_line(&format!(
                "Deleted fd21:66db:2e67:1::6/128 dev {IF1} metric 1024 pref medium"
            )),
            Some((true, k, dev))
        );
        for other in [
            format!("fe80::/64 dev {IF1} proto kernel metric 256 pref medium"),
            "fd21:66db:2e67:2::/120 via fd21:66db:2e67::c dev eth0 metric 1024 pref medium".to_string(),
            format!("local fe80::ecee:eeff:feee:eeee dev {IF1} table local proto kernel metric 0 pref medium"),
            format!("multicast ff00::/8 dev {IF1} table local proto kernel metric 256 pref medium"),
        ] {
            assert_eq!(parse_route_line(&other), None, "{other}");
        }
    }

    #[test]
    fn route_lines_parse_as_ip_monitor_prints_them() {
        let k = |dst: &str, metric: u32, tos: u8| RouteKey {
            dst: IpAddr::V4(ip(dst)),
            tos,
            metric,
        };
        let dev = |d: &str| Some(d.to_string());
        assert_eq!(
            parse_route_line("10.7.1.5 dev cali12345678901 scope link "),
            Some((false, k("10.7.1.5", 0, 0), dev(IF1)))
        );
        assert_eq!(
            parse_route_line("10.7.1.5 dev cali12345678901 proto 80 scope link "),
            Some((false, k("10.7.1.5", 0, 0), dev(IF1)))
        );
        assert_eq!(
            parse_route_line("Deleted 10.7.1.5 dev cali12345678901 proto 80 scope link "),
            Some((true, k("10.7.1.5", 0, 0), dev(IF1)))
        );
        assert_eq!(
            parse_route_line("10.7.1.9/32 dev cali12345678901 scope link metric 5 "),
            Some((false, k("10.7.1.9", 5, 0), dev(IF1)))
        );
        assert_eq!(
            parse_route_line("10.7.1.8 tos 0x10 dev cali12345678901 scope link "),
            Some((false, k("10.7.1.8", 0, 16), dev(IF1)))
        );
        assert_eq!(
            parse_route_line("blackhole 10.7.1.5 "),
            Some((false, k("10.7.1.5", 0, 0), None))
        );
        assert_eq!(
            parse_route_line("[ROUTE]10.7.1.5 via 169.254.1.1 dev cali12345678901 onlink"),
            Some((false, k("10.7.1.5", 0, 0), dev(IF1)))
        );
        assert_eq!(
            parse_route_line("10.7.1.5 table main dev cali12345678901"),
            Some((false, k("10.7.1.5", 0, 0), dev(IF1)))
        );
        for ignored in [
            "Deleted fe80::/64 dev tmpx proto kernel metric 256 pref medium",
            "Deleted multicast ff00::/8 dev cali12345678901 table local proto kernel metric 256 pref medium",
            "10.7.1.6 dev cali12345678901 table 100 scope link ",
            "Deleted local 169.254.1.1 dev cali12345678901 table local proto kernel scope host src 169.254.1.1 ",
            "blackhole 10.7.1.0/24 ",
            "10.7.2.0/24 via 10.6.0.3 dev eth0",
            "default via 10.6.0.1 dev eth0",
            "\tnexthop via 10.6.0.3 dev eth0 weight 1",
            "10.7.1.5 dev cali12345678901 metric x",
            "Timestamp: Mon Jan  1 00:00:00 2024 123 usec",
            "",
        ] {
            assert_eq!(parse_route_line(ignored), None, "{ignored}");
        }
    }

    /// IF1 and IF2 have both dispatch rules; IF1 routes 10.7.1.5.
    fn two_iface_node() -> RulesetState {
        let mut st = RulesetState::new();
        let text = format!(
            "{FELIX_TO_RULES}\n\
             add rule ip filter cali-from-wl-dispatch iifname \"{IF1}\" goto cali-fw-{IF1} # handle 4\n\
             add rule ip filter cali-from-wl-dispatch iifname \"{IF2}\" goto cali-fw-{IF2} # handle 5\n\
             # new generation 4 by process 1 (iptables-nft-re)"
        );
        assert!(feed_nft_text(&mut st, &text).is_empty());
        assert_eq!(
            st.feed_route("10.7.1.5 dev cali12345678901 scope link "),
            Some(dispatch_change(&[IF1], &[]))
        );
        st
    }

    #[test]
    fn route_replace_moves_the_address_to_the_new_device() {
        // `ip route replace 10.7.1.5 dev IF2` prints only the new route (observed).
        let mut st = two_iface_node();
        assert_eq!(
            st.feed_route("10.7.1.5 dev cali12345678902 scope link "),
            Some(dispatch_change(&[IF2], &[IF1]))
        );
        assert_eq!(st.dispatched(), routed(&[(IF2, &["10.7.1.5"])]));
        // A `Deleted` line naming the old device no longer matches anything.
        assert_eq!(
            st.feed_route("Deleted 10.7.1.5 dev cali12345678901 scope link "),
            None
        );
        assert_eq!(st.dispatched(), routed(&[(IF2, &["10.7.1.5"])]));
    }

    #[test]
    fn blackhole_replace_removes_the_device_route() {
        let mut st = two_iface_node();
        assert_eq!(
            st.feed_route("blackhole 10.7.1.5 "),
            Some(dispatch_change(&[], &[IF1]))
        );
        assert_eq!(st.feed_route("Deleted blackhole 10.7.1.5 "), None);
        assert!(st.routes.by_key.is_empty());
    }

    #[test]
    fn routes_with_other_metrics_are_separate() {
        let mut st = two_iface_node();
        assert_eq!(
            st.feed_route("10.7.1.5 dev cali12345678901 scope link metric 5 "),
            None
        );
        assert_eq!(
            st.feed_route("Deleted 10.7.1.5 dev cali12345678901 scope link "),
            None
        );
        assert_eq!(st.dispatched(), routed(&[(IF1, &["10.7.1.5"])]));
        assert_eq!(
            st.feed_route("Deleted 10.7.1.5 dev cali12345678901 scope link metric 5 "),
            Some(dispatch_change(&[], &[IF1]))
        );
    }

    #[test]
    fn routes_in_other_tables_ipv6_and_prefixes_do_not_dispatch() {
        let mut st = two_iface_node();
        for line in [
            "10.7.1.6 dev cali12345678902 table 100 scope link ",
            "2001:db8::1 dev cali12345678902 metric 1024 pref medium",
            "10.7.1.0/26 dev cali12345678902 scope link ",
            "multicast ff00::/8 dev cali12345678902 table local proto kernel metric 256 pref medium",
            "local 10.7.1.6 dev cali12345678902 table local proto kernel scope host src 10.7.1.6",
            "unreachable 10.7.1.6 ",
        ] {
            assert_eq!(st.feed_route(line), None, "{line}");
        }
        assert_eq!(st.dispatched(), routed(&[(IF1, &["10.7.1.5"])]));
        // A device route replacing the unreachable one (same key) dispatches IF2.
        assert_eq!(
            st.feed_route("10.7.1.6/32 dev cali12345678902 scope link "),
            Some(dispatch_change(&[IF2], &[]))
        );
        assert_eq!(
            st.dispatched(),
            routed(&[(IF1, &["10.7.1.5"]), (IF2, &["10.7.1.6"])])
        );
    }

    #[test]
    fn link_removed_drops_its_routes() {
        let mut st = two_iface_node();
        assert_eq!(
            st.feed_route("10.7.1.6 dev cali12345678902 scope link "),
            Some(dispatch_change(&[IF2], &[]))
        );
        assert_eq!(
            st.feed_route("10.7.1.9 dev cali12345678901 scope link metric 5 "),
            None
        );
        assert_eq!(st.link_removed(IF1), Some(dispatch_change(&[], &[IF1])));
        assert_eq!(st.link_removed(IF1), None);
        assert_eq!(st.link_removed("eth0"), None);
        assert_eq!(st.dispatched(), routed(&[(IF2, &["10.7.1.6"])]));
        assert!(!st.routes.by_dev.contains_key(IF1));
        assert_eq!(st.routes.by_key.len(), 1);
    }

    #[test]
    fn route_snapshot_replaces_the_routes() {
        let mut st = two_iface_node();
        assert_eq!(
            st.load_route_snapshot("10.7.1.6 dev cali12345678902 scope link\n"),
            Some(dispatch_change(&[IF2], &[IF1]))
        );
        assert_eq!(st.dispatched(), routed(&[(IF2, &["10.7.1.6"])]));
        assert_eq!(
            st.load_route_snapshot(""),
            Some(dispatch_change(&[], &[IF2]))
        );
    }

    #[test]
    fn garbage_lines_are_ignored() {
        let mut st = dispatched_node();
        let garbage = [
            "",
            " ",
            "add",
            "add rule",
            "add rule ip",
            "add rule ip filter",
            "add rule ip filter cali-from-wl-dispatch",
            "add rule ip filter cali-from-wl-dispatch # handle",
            "add rule ip filter cali-from-wl-dispatch # handle x",
            "add rule ip filter c iifname",
            "add rule ip filter c iifname \"unterminated goto # handle 99",
            "delete rule ip filter cali-from-wl-dispatch handle",
            "delete rule ip filter cali-from-wl-dispatch handle -4",
            "delete rule ip filter cali-from-wl-dispatch handle 99999999999999999999999",
            "delete chain ip filter",
            "delete table ip",
            "add element ip kube-proxy service-ips {",
            "add element ip kube-proxy service-ips }{ : goto",
            "delete element ip kube-proxy service-ips { , , : }",
            "add chain ip filter x # handle 1",
            "}",
            "{{{",
            "# Warning: table ip filter is managed by iptables-nft, do not touch!",
            "# new generation",
            "# new generation x by process",
            "ünïcödé ☃ \u{0}",
            "add rule ip kube-proxy service-X numgen vmap { 0 : goto endpoint- } # handle 5",
        ];
        for line in garbage {
            assert_eq!(st.feed_route(line), None, "route: {line:?}");
            // `add chain ip filter x # handle 1` renames chain 1; harmless.
            let _ = st.feed_nft(line);
        }
        assert_eq!(st.feed_nft("# new generation 99 by process 1 (nft)"), None);
        assert_eq!(st.dispatched(), routed(&[(IF1, &["10.7.1.5"])]));
        assert!(st.service_endpoints().is_empty());
        for text in [
            "}}}}",
            "table ip filter {",
            "table ip filter {\n\tchain c {\n\t\tx # handle 1\n",
            "\u{0}{\"}",
        ] {
            let mut st = RulesetState::new();
            assert_eq!(st.load_nft_snapshot(text), None, "{text:?}");
            assert_eq!(st.load_route_snapshot(text), None, "{text:?}");
        }
    }

    #[test]
    fn deleting_everything_leaves_no_trace() {
        let mut st = dispatched_node();
        feed_nft_text(&mut st, KP_MONITOR);
        let text = r#"delete rule ip filter cali-from-wl-dispatch handle 4
delete rule ip filter cali-to-wl-dispatch handle 10
delete rule ip filter cali-to-wl-dispatch handle 11
delete chain ip filter cali-from-wl-dispatch
delete chain ip filter cali-to-wl-dispatch
delete chain ip filter cali-fw-cali12345678901
delete chain ip filter cali-tw-cali12345678901
delete chain ip filter cali-tw-cali12345678902
delete chain ip kube-proxy service-ULMVA6XW-firstpacket/fp-svc-1/tcp/http
delete chain ip kube-proxy services
# new generation 10 by process 1 (nft)"#;
        assert_eq!(
            feed_nft_text(&mut st, text),
            vec![(11, dispatch_change(&[], &[IF1]))]
        );
        st.feed_route("Deleted 10.7.1.5 dev cali12345678901 scope link ");
        for t in [&st.nft.filter, &st.nft.kube_proxy] {
            assert!(t.chains.is_empty(), "{:?}", t.chains);
            assert!(t.chain_by_handle.is_empty());
            assert!(t.rules.is_empty());
            assert!(t.chain_rules.is_empty());
            assert!(t.elements.is_empty());
            assert!(t.dispatch_rules.is_empty());
            assert!(t.touched_ifaces.is_empty());
        }
        assert!(st.routes.by_key.is_empty());
        assert!(st.routes.by_dev.is_empty());
    }

    #[test]
    fn text_helpers_respect_quotes() {
        assert_eq!(
            split_comment(r#"add rule ip t c comment "a # handle 9" # handle 2"#),
            (
                r#"add rule ip t c comment "a # handle 9" "#,
                Some(" handle 2")
            )
        );
        assert_eq!(
            tokens(r#"iifname "a b" goto x,"#).collect::<Vec<_>>(),
            vec!["iifname", "\"a b\"", "goto", "x,"]
        );
        assert_eq!(unquote("\"cali1\","), "cali1");
        assert_eq!(count_braces("{ \"}\" }"), (1, 1));
        assert_eq!(
            split_top_level("a, {b, c}, \"d,e\"", ','),
            vec!["a", " {b, c}", " \"d,e\""]
        );
        assert_eq!(
            parse_elements(
                "{ 10.0.0.1 . tcp . 80 : goto c, 10.0.0.2 timeout 5s expires 3s : drop, 10.0.0.3 }"
            ),
            vec![
                ("10.0.0.1 . tcp . 80".to_string(), Some("c".to_string())),
                ("10.0.0.2".to_string(), None),
                ("10.0.0.3".to_string(), None),
            ]
        );
    }

    /// `iptables-nft-restore --noflush` of a Felix-like dispatch (two workloads), then a
    /// rewrite of the to-dispatch chain without the second one, as `nft -a monitor`
    /// printed it on this machine (nftables 1.0.6, iptables 1.8.9). Appended rules
    /// carry the position (`handle 11`) right after the chain name; the rule's own
    /// handle is the trailing comment.
    const FELIX_CAPTURE: &str = r#"add table ip filter # handle 1
create chain ip filter cali-from-wl-dispatch # handle 1
create chain ip filter cali-to-wl-dispatch # handle 2
create chain ip filter cali-fw-cali12345678901 # handle 3
create chain ip filter cali-tw-cali12345678901 # handle 4
create chain ip filter cali-fw-cali12345678902 # handle 5
create chain ip filter cali-tw-cali12345678902 # handle 6
add rule ip filter cali-fw-cali12345678901  counter packets 0 bytes 0 accept # handle 7
add rule ip filter cali-tw-cali12345678901  counter packets 0 bytes 0 accept # handle 8
add rule ip filter cali-fw-cali12345678902 counter packets 0 bytes 0 accept # handle 9
add rule ip filter cali-tw-cali12345678902 counter packets 0 bytes 0 accept # handle 10
add rule ip filter cali-from-wl-dispatch iifname "cali12345678901"  counter packets 0 bytes 0 goto cali-fw-cali12345678901 # handle 11
add rule ip filter cali-from-wl-dispatch handle 11 iifname "cali12345678902"  counter packets 0 bytes 0 goto cali-fw-cali12345678902 # handle 12
add rule ip filter cali-from-wl-dispatch  counter packets 0 bytes 0 drop # handle 13
add rule ip filter cali-to-wl-dispatch oifname "cali12345678901"  counter packets 0 bytes 0 goto cali-tw-cali12345678901 # handle 14
add rule ip filter cali-to-wl-dispatch handle 14 oifname "cali12345678902"  counter packets 0 bytes 0 goto cali-tw-cali12345678902 # handle 15
add rule ip filter cali-to-wl-dispatch  counter packets 0 bytes 0 drop # handle 16
# new generation 2 by process 16242 (iptables-nft-re)
delete rule ip filter cali-to-wl-dispatch handle 14
delete rule ip filter cali-to-wl-dispatch handle 15
delete rule ip filter cali-to-wl-dispatch handle 16
add rule ip filter cali-to-wl-dispatch oifname "cali12345678901"  counter packets 0 bytes 0 goto cali-tw-cali12345678901 # handle 17
add rule ip filter cali-to-wl-dispatch  counter packets 0 bytes 0 drop # handle 18
# new generation 4 by process 16246 (iptables-nft-re)"#;

    #[test]
    fn captured_iptables_restore_output_is_understood() {
        let mut st = RulesetState::new();
        assert_eq!(
            st.feed_route("10.7.1.5 dev cali12345678901 scope link "),
            None
        );
        assert_eq!(
            st.feed_route("10.7.1.6 dev cali12345678902 scope link "),
            None
        );
        assert_eq!(
            feed_nft_text(&mut st, FELIX_CAPTURE),
            vec![
                (18, dispatch_change(&[IF1, IF2], &[])),
                (24, dispatch_change(&[], &[IF2])),
            ]
        );
        assert_eq!(
            st.nft.filter.rules[&12].fact,
            RuleFact::FromWorkload(IF2.to_string())
        );
        assert_eq!(st.dispatched(), routed(&[(IF1, &["10.7.1.5"])]));
    }
}

//! NetworkPolicy truth on real Felix (issue 32, docs/design.md §6 `policy_programmed` /
//! `policy_revoked`), read from the node's IP sets, never from Felix's word.
//!
//! Felix renders a policy rule's pod or namespace selector as a kernel IP set of the
//! selected pods' IPs, named `cali40s:` + the selector's hash (IPv4; felix/ipsets/
//! ipset_defs.go `NameForMainIPSet`, IDs `s:…` from felix/labelindex), and the rule
//! matches it (`-m set --match-set cali40s:… src`, in a `cali-pi-…` / `cali-po-…`
//! policy chain reached from the pod's `cali-tw-IFACE` (ingress) or `cali-fw-IFACE`
//! (egress) chain, [`workload_sets`]). A peer is therefore **admitted** to a local pod
//! from the moment its IP is a member of a `cali40s:` set that one of the pod's chains
//! matches, and **revoked** when no such set holds it. Felix writes a set's members before the rules
//! that use it and removes the rules before the set (felix/dataplane/linux/
//! int_dataplane.go: IP set updates, then the iptables tables, then IP set deletions),
//! so both halves count: a new policy admits when its rule goes in, a new peer of an
//! existing policy when its IP goes into the set, and a deleted policy revokes when its
//! rule goes.
//!
//! The rules: `nft monitor` ([`crate::truth_watch`]) announces every commit to the
//! `filter` table the moment it lands ([`RulesChanged::note`], stamped as the line is
//! read) and wakes the poll, which reads at once which sets the rules match
//! (`iptables-nft-save -t filter`, slower with hundreds of policies; `nft` prints
//! the `set` match without its name) and stamps what that changes with the first commit
//! since its last read.
//!
//! The kernel announces no IP set change (ipset has no monitor), so a [`PolicyWatch`]
//! keeps one interactive `ipset -` per node (under `stdbuf -oL`, so each answer is
//! flushed) and asks it for `save` every [`POLL`]: a read of the kernel's sets without
//! a process spawn (with many sets, every four times the read's
//! duration, if longer). A change is stamped with the moment of the poll that first
//! saw it, so the truth is at most one poll late; `detail.not_before` says how late it
//! can be (the previous poll's moment; the commit's own for a rule change).
//!
//! The truth line has the simulated agent's fields ([`crate::policy_sync`]):
//! `namespace`/`pod`/`iface` the isolated pod, `uid`/`ip` the admitted peer, `detail`
//! `method: ipset`, `direction`, `sets`. What it cannot see: rules admitting an `ipBlock`
//! (rendered as CIDR matches in the pod's own policy chain, written before the endpoint
//! is dispatched: within `endpoint_programmed`), and a peer that two policies admit
//! losing one of them.

use crate::dataplane::PodNet;
use crate::truth::{unix_now, Truth, TruthEvent, TruthKind};
use crate::truth_watch::Registry;
use anyhow::{Context, Result};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, Write};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How often the node's IP sets are read (the truth's resolution).
pub const POLL: Duration = Duration::from_millis(10);

/// The prefix of Felix's IPv4 selector sets (felix/ipsets/ipset_defs.go: `cali` + `4` +
/// `0` (main, not temporary) + the set ID, `s:` for a selector).
pub const SELECTOR_SET_PREFIX: &str = "cali40s:";

/// One member of a `hash:ip` / `hash:net` set: an address and prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Member {
    pub addr: Ipv4Addr,
    pub len: u8,
}

impl Member {
    /// `10.7.1.2` or `10.7.1.0/24`; `None` for anything else (IPv6, `ip,port` members).
    pub fn parse(s: &str) -> Option<Member> {
        let (a, l) = match s.split_once('/') {
            Some((a, l)) => (a, l.parse::<u8>().ok().filter(|l| *l <= 32)?),
            None => (s, 32),
        };
        Some(Member {
            addr: a.parse().ok()?,
            len: l,
        })
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = if self.len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.len))
        };
        u32::from(self.addr) & mask == u32::from(ip) & mask
    }
}

/// Felix's selector sets in `ipset save` output: set name → members. Lines of other
/// sets, `create` lines and garbage are skipped.
pub fn parse_save(text: &str) -> BTreeMap<String, BTreeSet<Member>> {
    let mut sets: BTreeMap<String, BTreeSet<Member>> = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim_start_matches("ipset> ").trim();
        let mut w = line.split_whitespace();
        match (w.next(), w.next(), w.next()) {
            (Some("create"), Some(name), _) if name.starts_with(SELECTOR_SET_PREFIX) => {
                sets.entry(name.to_owned()).or_default();
            }
            (Some("add"), Some(name), Some(m)) if name.starts_with(SELECTOR_SET_PREFIX) => {
                if let Some(m) = Member::parse(m) {
                    sets.entry(name.to_owned()).or_default().insert(m);
                }
            }
            _ => {}
        }
    }
    sets
}

/// A node's `filter` table changed (fed by the ruleset monitor): a generation counter and
/// Policy direction of a set match: ingress (a `cali-tw-` chain, the peer is the
/// source, `src`) or egress (`cali-fw-`, the peer is the destination, `dst`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }
}

/// Which `cali40s:` sets each workload interface's policies match, per direction, from
/// an `iptables-save -t filter` text: every chain reachable (`-j`/`-g`) from the
/// interface's `cali-tw-IFACE` (ingress; felix/rules/endpoints.go) or `cali-fw-IFACE`
/// (egress) chain — policy groups `cali-gi-`/`cali-go-`, policies `cali-pi-`/`cali-po-`,
/// profiles — and their `--match-set NAME src` (ingress) or `dst` (egress) matches.
pub fn workload_sets(save: &str) -> BTreeMap<(String, Direction), BTreeSet<String>> {
    #[derive(Default)]
    struct Chain {
        jumps: Vec<String>,
        src: Vec<String>,
        dst: Vec<String>,
    }
    let mut chains: BTreeMap<&str, Chain> = BTreeMap::new();
    for line in save.lines() {
        let mut w = line.split_whitespace();
        if w.next() != Some("-A") {
            continue;
        }
        let Some(chain) = w.next() else { continue };
        let c = chains.entry(chain).or_default();
        let words: Vec<&str> = w.collect();
        for (i, word) in words.iter().enumerate() {
            match *word {
                "-j" | "-g" | "--jump" | "--goto" => {
                    if let Some(t) = words.get(i + 1).filter(|t| t.starts_with("cali")) {
                        c.jumps.push((*t).to_owned());
                    }
                }
                "--match-set" => {
                    if let (Some(n), Some(d)) = (words.get(i + 1), words.get(i + 2)) {
                        if n.starts_with(SELECTOR_SET_PREFIX) {
                            match *d {
                                "src" => c.src.push((*n).to_owned()),
                                "dst" => c.dst.push((*n).to_owned()),
                                _ => {}
                            }
                        }
                    }
                }
                _ => {}
            }
        }
    }
    let mut out = BTreeMap::new();
    for (prefix, dir) in [
        ("cali-tw-", Direction::Ingress),
        ("cali-fw-", Direction::Egress),
    ] {
        for root in chains.keys().filter(|c| {
            c.strip_prefix(prefix)
                .is_some_and(|iface| iface.starts_with("cali"))
        }) {
            let iface = &root[prefix.len()..];
            let mut seen = BTreeSet::new();
            let mut todo = vec![*root];
            let mut sets = BTreeSet::new();
            while let Some(c) = todo.pop() {
                if !seen.insert(c) {
                    continue;
                }
                let Some(ch) = chains.get(c) else { continue };
                let found = match dir {
                    Direction::Ingress => &ch.src,
                    Direction::Egress => &ch.dst,
                };
                sets.extend(found.iter().cloned());
                todo.extend(ch.jumps.iter().map(String::as_str));
            }
            if !sets.is_empty() {
                out.insert((iface.to_owned(), dir), sets);
            }
        }
    }
    out
}

/// An admitted pair: the isolated workload's interface, the direction, the peer's IP.
pub type Pair = (String, Direction, Ipv4Addr);

/// The pairs the sets admit now: for each workload's sets (from [`workload_sets`]),
/// each IP of `ips` a member covers, with the sets that do.
pub fn admitted_pairs(
    sets: &BTreeMap<String, BTreeSet<Member>>,
    refs: &BTreeMap<(String, Direction), BTreeSet<String>>,
    ips: &[Ipv4Addr],
) -> BTreeMap<Pair, Vec<String>> {
    let mut out = BTreeMap::new();
    for ((iface, dir), names) in refs {
        let members: Vec<(&String, &BTreeSet<Member>)> = names
            .iter()
            .filter_map(|n| sets.get(n).map(|m| (n, m)))
            .collect();
        for ip in ips {
            let by: Vec<String> = members
                .iter()
                .filter(|(_, ms)| ms.iter().any(|m| m.contains(*ip)))
                .map(|(n, _)| (*n).clone())
                .collect();
            if !by.is_empty() {
                out.insert((iface.clone(), *dir, *ip), by);
            }
        }
    }
    out
}

/// Commits to a node's `filter` table, fed by the ruleset monitor: a generation counter
/// and the moment (Unix seconds) of the first commit the poller has not taken yet; a
/// poller waiting in [`RulesChanged::wait`] wakes at once.
#[derive(Debug, Default)]
pub struct RulesChanged {
    state: std::sync::Mutex<Commits>,
    wake: std::sync::Condvar,
}

#[derive(Debug, Default, Clone, Copy)]
struct Commits {
    gen: u64,
    first_untaken: Option<f64>,
}

impl RulesChanged {
    fn lock(&self) -> std::sync::MutexGuard<'_, Commits> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A monitor line read at `at`: counts when it is a commit to `ip filter`.
    pub fn note(&self, line: &str, at: f64) {
        if line.contains(" ip filter ") {
            let mut s = self.lock();
            s.gen += 1;
            s.first_untaken.get_or_insert(at);
            self.wake.notify_all();
        }
    }

    /// The generation now and the moment of the first commit since the last take.
    fn take(&self) -> (u64, Option<f64>) {
        let mut s = self.lock();
        (s.gen, s.first_untaken.take())
    }

    /// Sleeps up to `d`, or until the generation is other than `seen`.
    fn wait(&self, seen: Option<u64>, d: Duration) {
        let s = self.lock();
        let _ = self.wake.wait_timeout_while(s, d, |s| Some(s.gen) == seen);
    }
}

/// What changed between two maps: (keys new in `now`, keys gone from `before`).
pub fn diff<K: Ord + Clone, V>(before: &BTreeMap<K, V>, now: &BTreeMap<K, V>) -> (Vec<K>, Vec<K>) {
    let added = now.keys().filter(|k| !before.contains_key(*k)).cloned();
    let gone = before.keys().filter(|k| !now.contains_key(*k)).cloned();
    (added.collect(), gone.collect())
}

/// One node's IP set watch (module docs); stops when dropped.
#[derive(Debug)]
pub struct PolicyWatch {
    stop: Arc<AtomicBool>,
}

impl Drop for PolicyWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What a poll thread needs.
struct Poller {
    node: String,
    rules: Arc<RulesChanged>,
    locals: Locals,
    truth: Truth,
    registry: Weak<Registry>,
    stop: Arc<AtomicBool>,
}

impl PolicyWatch {
    /// Starts the watch of `node`; must be called on the node's netns thread (the
    /// `ipset` process and the poll thread inherit its network namespace). Errors:
    /// `stdbuf` or `ipset` missing, or the first read failing.
    pub fn start(
        node: &str,
        registry: &Arc<Registry>,
        truth: Truth,
        rules: Arc<RulesChanged>,
        locals: Locals,
    ) -> Result<PolicyWatch> {
        let mut child = std::process::Command::new("stdbuf")
            .args(["-oL", "ipset", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("start `stdbuf -oL ipset -` (packages coreutils, ipset)")?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            anyhow::bail!("ipset: no pipes");
        };
        let mut io = SetReader {
            stdin,
            stdout: std::io::BufReader::new(stdout),
        };
        if let Err(e) = io.read_sets() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e.context(format!("first read of {node}'s IP sets")));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let p = Poller {
            node: node.to_owned(),
            rules,
            locals,
            truth,
            registry: Arc::downgrade(registry),
            stop: stop.clone(),
        };
        std::thread::Builder::new()
            .name("truth-ipset".into())
            .spawn(move || {
                p.run(&mut io);
                let _ = child.kill();
                let _ = child.wait();
            })
            .context("start the IP set poll thread")?;
        Ok(PolicyWatch { stop })
    }
}

/// The interactive `ipset -`'s pipes.
struct SetReader {
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl SetReader {
    /// One `save`, read up to the answer of the `version` after it.
    fn read_sets(&mut self) -> Result<BTreeMap<String, BTreeSet<Member>>> {
        self.stdin.write_all(b"save\nversion\n")?;
        self.stdin.flush()?;
        let mut text = String::new();
        loop {
            let mut line = String::new();
            if self.stdout.read_line(&mut line)? == 0 {
                anyhow::bail!("ipset exited");
            }
            if line.contains("protocol version") {
                return Ok(parse_save(&text));
            }
            text.push_str(&line);
        }
    }
}

/// When a change happened: `at` (the truth line's `t`) is the moment of the commit that
/// made it, or of the read of the sets that first found it; `not_before` is the
/// earliest it can have happened — the commit itself, or the start of the read before
/// (a set change between two reads is seen only by the second: the truth's resolution,
/// which under load or with many sets is longer than [`POLL`]). Both Unix seconds.
#[derive(Debug, Clone, Copy)]
struct Stamp {
    at: f64,
    not_before: f64,
}

/// The node's live workloads by interface (shared with [`crate::truth_watch`]).
pub type Locals = Arc<std::sync::Mutex<std::collections::HashMap<String, PodNet>>>;

impl Poller {
    /// Each workload's sets now (`iptables-nft-save`; in the poll thread, so in the
    /// node's netns). `None` when it cannot be read.
    fn read_refs(&self) -> Option<BTreeMap<(String, Direction), BTreeSet<String>>> {
        let out = std::process::Command::new("iptables-nft-save")
            .args(["-t", "filter"])
            .stderr(std::process::Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => Some(workload_sets(&String::from_utf8_lossy(&o.stdout))),
            Ok(o) => {
                tracing::warn!(node = %self.node, status = %o.status, "iptables-nft-save failed");
                None
            }
            Err(e) => {
                tracing::warn!(node = %self.node, error = %e, "iptables-nft-save not run");
                None
            }
        }
    }

    fn run(&self, io: &mut SetReader) {
        let mut before: BTreeMap<Pair, Vec<String>> = BTreeMap::new();
        // Who each pair was when admitted: its pods may be gone by the time it is
        // revoked.
        let mut who: BTreeMap<Pair, (PodNet, Option<PodNet>)> = BTreeMap::new();
        let mut refs = BTreeMap::new();
        let mut seen_gen = None;
        // When the previous read of the sets began: a change a read finds first
        // happened after it.
        let mut last_read: Option<f64> = None;
        while !self.stop.load(Ordering::Relaxed) {
            let Some(registry) = self.registry.upgrade() else {
                return;
            };
            let ips = registry.ips();
            // Woken by a commit (or the poll period): the sets first, at once (Felix
            // writes a new policy's set before its rule, so the set is complete by the
            // commit), then the rules when a commit came since the last read.
            let (gen, first) = self.rules.take();
            let at = unix_now();
            let started = std::time::Instant::now();
            let sets = match io.read_sets() {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(node = %self.node, error = %e, "IP set watch ended");
                    return;
                }
            };
            let took = started.elapsed();
            // What changes with new rules is stamped with the first commit since the
            // last read (a later commit in the same read can only make it early, by
            // less than a read); what changes with the sets alone, with this read.
            let mut stamp = Stamp {
                at,
                not_before: last_read.unwrap_or(at),
            };
            if seen_gen != Some(gen) {
                if let Some(r) = self.read_refs() {
                    seen_gen = Some(gen);
                    refs = r;
                    if let Some(commit) = first {
                        stamp = Stamp {
                            at: commit,
                            not_before: commit,
                        };
                    }
                }
            }
            last_read = Some(at);
            let now = admitted_pairs(&sets, &refs, &ips);
            self.transitions(&registry, &mut who, &before, &now, stamp);
            before = now;
            drop(registry);
            // Many sets (thousands of policies) make a read cost more: never spend more
            // than a fifth of a core on it. A commit wakes the poll at once.
            self.rules.wait(seen_gen, POLL.max(took * 4));
        }
    }

    /// Emits the truth for what changed from `before` to `now`, stamped `at`. A pair
    /// whose workload is not (or no longer) this node's is skipped.
    fn transitions(
        &self,
        registry: &Registry,
        who: &mut BTreeMap<Pair, (PodNet, Option<PodNet>)>,
        before: &BTreeMap<Pair, Vec<String>>,
        now: &BTreeMap<Pair, Vec<String>>,
        at: Stamp,
    ) {
        let (added, gone) = diff(before, now);
        for pair in added {
            let pod = crate::truth_watch::lock(&self.locals).get(&pair.0).cloned();
            let Some(pod) = pod else { continue };
            let peer = registry.by_ip(pair.2);
            self.emit(
                TruthKind::PolicyProgrammed,
                &pair,
                &pod,
                peer.as_ref(),
                &now[&pair],
                at,
            );
            who.insert(pair, (pod, peer));
        }
        for pair in gone {
            let Some((pod, peer)) = who.remove(&pair) else {
                continue;
            };
            // A pod's rules leaving with its endpoint are no revocation (`pod_deleted`
            // says it), as with the simulated agent.
            let live = crate::truth_watch::lock(&self.locals)
                .get(&pair.0)
                .is_some_and(|p| p.uid == pod.uid);
            if live {
                let sets = &before[&pair];
                self.emit(
                    TruthKind::PolicyRevoked,
                    &pair,
                    &pod,
                    peer.as_ref(),
                    sets,
                    at,
                );
            }
        }
    }

    /// One truth line: `namespace`/`pod`/`iface` the isolated workload's, `uid`/`ip` the
    /// peer's (as the simulated agent writes them, [`crate::policy_sync`]).
    fn emit(
        &self,
        kind: TruthKind,
        pair: &Pair,
        pod: &PodNet,
        peer: Option<&PodNet>,
        sets: &[String],
        at: Stamp,
    ) {
        let mut ev = TruthEvent::pod(kind, pod, json!({}));
        ev.uid = peer.map(|p| p.uid.clone());
        ev.ip = Some(pair.2.to_string());
        let who = match peer {
            Some(p) => json!({"kind": "pod", "namespace": p.namespace, "pod": p.pod}),
            None => json!({"kind": "ip"}),
        };
        ev.detail = json!({
            "method": "ipset",
            "direction": pair.1.as_str(),
            "sets": sets,
            "peer": who,
            "not_before": (at.not_before * 1e6).round() / 1e6,
        });
        self.truth.emit_at(ev, Some(at.at));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAVE: &str =
        "ipset> create cali40s:abc hash:net family inet hashsize 1024 maxelem 1048576\n\
add cali40s:abc 10.7.1.2\n\
add cali40s:abc 10.7.2.0/24\n\
create cali40all-ipam-pools hash:net family inet\n\
add cali40all-ipam-pools 10.7.0.0/16\n\
create cali40s:empty hash:net family inet\n\
add cali60s:v6 fd00::1\n\
garbage line\n";

    const FILTER: &str = "*filter
-A cali-tw-calia1 -m comment --comment \"cali:x\" -m mark --mark 0x0/0x20000 -j cali-gi-grp
-A cali-tw-calia1 -j cali-pri-kns.default
-A cali-gi-grp -j cali-pi-_pol
-A cali-pi-_pol -m comment --comment \"Policy default/knp.default.np ingress\" -m set --match-set cali40s:abc src -j MARK --set-xmark 0x10000/0x10000
-A cali-fw-calib2 -j cali-po-_eg
-A cali-po-_eg -m set --match-set cali40s:abc dst -j MARK --set-xmark 0x10000/0x10000
-A cali-tw-calib2 -m set --match-set cali40this-host src -j ACCEPT
-A cali-to-wl-dispatch -o calia1 -g cali-tw-calia1
COMMIT
";

    #[test]
    fn only_felix_selector_sets_are_read() {
        let sets = parse_save(SAVE);
        assert_eq!(
            sets.keys().collect::<Vec<_>>(),
            ["cali40s:abc", "cali40s:empty"]
        );
        assert_eq!(sets["cali40s:abc"].len(), 2);
        assert!(sets["cali40s:empty"].is_empty());
    }

    #[test]
    fn each_workload_gets_the_sets_its_chains_reach_per_direction() {
        let refs = workload_sets(FILTER);
        let keys: Vec<_> = refs.keys().cloned().collect();
        assert_eq!(
            keys,
            [
                ("calia1".to_owned(), Direction::Ingress),
                ("calib2".to_owned(), Direction::Egress)
            ]
        );
        assert!(refs[&keys[0]].contains("cali40s:abc"));
    }

    #[test]
    fn pairs_are_admitted_by_an_address_or_a_net_and_diffed() {
        let sets = parse_save(SAVE);
        let refs = workload_sets(FILTER);
        let ips: Vec<Ipv4Addr> = ["10.7.1.2", "10.7.1.3", "10.7.2.9"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let now = admitted_pairs(&sets, &refs, &ips);
        let got: Vec<_> = now.keys().map(|(i, d, ip)| (i.as_str(), *d, *ip)).collect();
        assert_eq!(
            got,
            [
                ("calia1", Direction::Ingress, ips[0]),
                ("calia1", Direction::Ingress, ips[2]),
                ("calib2", Direction::Egress, ips[0]),
                ("calib2", Direction::Egress, ips[2]),
            ]
        );
        // No rule, no admission; no member, no admission.
        assert!(admitted_pairs(&sets, &BTreeMap::new(), &ips).is_empty());
        let before = admitted_pairs(&parse_save(""), &refs, &ips);
        assert_eq!(diff(&before, &now).0.len(), 4);
        assert_eq!(diff(&now, &before).1.len(), 4);
    }

    #[test]
    fn filter_commits_count_and_others_do_not() {
        let r = RulesChanged::default();
        r.note("add rule ip nat cali-PREROUTING handle 4", 1.0);
        assert_eq!(r.take(), (0, None));
        r.note("add rule ip filter cali-pi-_x handle 9", 2.0);
        r.note("add rule ip filter cali-pi-_x handle 10", 2.5);
        assert_eq!(r.take(), (2, Some(2.0)));
        assert_eq!(r.take(), (2, None));
        // A waiter on an older generation returns at once; on the current one it sleeps.
        let t = std::time::Instant::now();
        r.wait(Some(1), Duration::from_secs(5));
        assert!(t.elapsed() < Duration::from_secs(1));
        r.wait(Some(2), Duration::from_millis(50));
        assert!(t.elapsed() >= Duration::from_millis(50));
    }

    #[test]
    fn members_parse_and_match_by_prefix() {
        let m = Member::parse("10.7.2.0/24").unwrap();
        assert!(m.contains("10.7.2.200".parse().unwrap()));
        assert!(!m.contains("10.7.3.1".parse().unwrap()));
        assert!(Member::parse("10.7.2.0/33").is_none());
        assert!(Member::parse("fd00::1").is_none());
        assert!(Member::parse("0.0.0.0/0")
            .unwrap()
            .contains("1.2.3.4".parse().unwrap()));
    }
}

//! Memory the scrape history holds for the whole run: one ring of observations per
//! (node, agent profile), each up to `correlate::DEFAULT_RING` long, kept for every node
//! the prober knows (at 1 000 nodes with calico-node and kube-proxy, 2 000 rings). A
//! counting global allocator (this test binary only, one test) measures the heap the
//! full rings hold.
//!
//! Rings of nodes not scraped for `correlate::HORIZON_SECONDS` keep only their newest
//! observation and give their slots back.
//!
//! Measured when this test was written (x86_64): `Observation` is 208 bytes and full
//! rings hold 218 bytes per observation. Before the rings were allocated at their
//! capacity and the names shared, the same history held 873 bytes per observation
//! (`Observation` 264 bytes with the reading's list of family names, each name copied
//! per scrape, each ring doubled to 64 slots when the 33rd arrived).

mod counting;

use prober::agents::correlate::{History, Observation, DEFAULT_RING};
use prober::agents::profiles::{builtin_profiles, find, AgentReading, CALICO_FELIX};
use prober::agents::scrape::read_page;

const NODES: usize = 200;
const PROFILES: [&str; 2] = [CALICO_FELIX, "kube-proxy"];

/// One scrape's observation, its names freshly allocated as the scraper makes them
/// (from the agent index's strings).
fn observation(node: usize, profile: &str, at: f64, reading: &AgentReading) -> Observation {
    let node = format!("node-{node:04}");
    Observation {
        at,
        profile: profile.to_owned().as_str().into(),
        pod: format!("{profile}-{node}").as_str().into(),
        uid: format!("0b9d3a52-7c1e-4f0a-9d7e-{node:0>12}")
            .as_str()
            .into(),
        node: node.as_str().into(),
        restart_count: 0,
        ready: true,
        scrape_path: Some("direct"),
        outcome: Ok(reading.clone()),
    }
}

#[test]
fn full_rings_hold_each_name_once_and_never_grow_past_their_capacity() {
    let profiles = builtin_profiles();
    let felix = find(&profiles, CALICO_FELIX).expect("felix profile");
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/felix-3.20-1.prom"
    ))
    .expect("fixture");
    let reading = read_page(felix, "fixture", &page).expect("reading");

    let before = counting::live();
    let mut history = History::new(DEFAULT_RING);
    // Two ring lengths of scrapes: every ring fills and then wraps.
    for round in 0..2 * DEFAULT_RING {
        for node in 0..NODES {
            for profile in PROFILES {
                history.push(observation(node, profile, round as f64 * 5.0, &reading));
            }
        }
    }
    let held = counting::live() - before;
    let observations = NODES * PROFILES.len() * DEFAULT_RING;
    assert_eq!(history.rings_len(), NODES * PROFILES.len());
    let ring = history
        .ring("node-0007", CALICO_FELIX)
        .expect("ring of node-0007");
    assert_eq!(ring.len(), DEFAULT_RING, "a full ring keeps its capacity");
    assert_eq!(
        ring.front().map(|o| o.at),
        Some(DEFAULT_RING as f64 * 5.0),
        "the oldest went first"
    );
    let per = held as f64 / observations as f64;
    let size = std::mem::size_of::<Observation>();
    eprintln!(
        "history: {held} bytes for {observations} observations in {} rings: {per:.0} bytes \
         per observation (Observation is {size} bytes)",
        history.rings_len()
    );
    // The slots themselves plus each ring's key and shared names spread over its
    // observations: names copied per scrape (4 allocations of 16–64 bytes each) or a
    // ring doubled past its capacity would each add more than 32 bytes per observation.
    assert!(
        per <= (size + 32) as f64,
        "{per:.0} bytes per observation > {} (Observation {size} + 32)",
        size + 32
    );

    // An hour later each node is swept once: the horizon leaves one observation per
    // ring, and the ring gives back its slots.
    let later = 2.0 * DEFAULT_RING as f64 * 5.0 + 3600.0;
    for node in 0..NODES {
        for profile in PROFILES {
            history.push(observation(node, profile, later, &reading));
        }
    }
    let cold = counting::live() - before;
    let per_ring = cold as f64 / history.rings_len() as f64;
    eprintln!(
        "history after the horizon: {cold} bytes in {} rings: {per_ring:.0} bytes per ring",
        history.rings_len()
    );
    let ring = history.ring("node-0007", CALICO_FELIX).expect("ring");
    assert_eq!(ring.iter().map(|o| o.at).collect::<Vec<_>>(), vec![later]);
    // Two slots, the key and one set of names.
    assert!(
        per_ring <= (2 * size + 512) as f64,
        "{per_ring:.0} bytes per ring holding one observation > {}",
        2 * size + 512
    );
    drop(history);
    // (The test harness itself may keep a few hundred bytes meanwhile.)
    assert!(
        counting::live() <= before + 1024,
        "history not freed on drop: {} bytes still live",
        counting::live().saturating_sub(before)
    );
}

//! Throughput of the exposition parser (docs/design.md §7: agent-metrics parse ≥ 100 MB/s) on
//! a ~1 MB Felix-like page, next to the `prometheus-parse` crate in the same run.
//!
//! Run: `cargo bench -p prober --bench expo` (release profile). Prints MB/s
//! (1 MB = 10^6 bytes) for each parser and how many samples each one returned.
//!
//! The page: every family of the real Felix 3.20 page (`tests/fixtures/felix-3.20-1.prom`)
//! repeated with distinct `endpoint="cali…"` label values (as on a node with many
//! workload endpoints) until it reaches ~1 MB, rendered by [`expo::Page`]'s `Display`.

use prober::agents::expo::{self, Page, Sample};
use std::hint::black_box;
use std::time::{Duration, Instant};

const FELIX: &str = include_str!("../tests/fixtures/felix-3.20-1.prom");
const TARGET_BYTES: usize = 1_000_000;

/// The Felix page with each family's samples repeated `copies` times, each copy with
/// its own `endpoint` label value.
fn felix_like(copies: usize) -> Result<String, expo::ParseError> {
    let base = expo::parse(FELIX)?;
    let mut page = Page::default();
    for (name, fam) in &base.families {
        let mut fam = fam.clone();
        let samples = std::mem::take(&mut fam.samples);
        for k in 0..copies {
            for s in &samples {
                let mut labels = vec![("endpoint".into(), format!("cali{k:011x}").into())];
                labels.extend(s.labels.iter().cloned());
                fam.samples.push(Sample {
                    labels,
                    ..s.clone()
                });
            }
        }
        page.families.insert(name.clone(), fam);
    }
    Ok(page.to_string())
}

/// Runs `f` repeatedly for about `budget`; returns (MB/s, last result).
fn measure<T>(bytes: usize, budget: Duration, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut out = black_box(f()); // warm-up
    let start = Instant::now();
    let mut runs = 0u32;
    while start.elapsed() < budget || runs < 5 {
        out = black_box(f());
        runs += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    (bytes as f64 * f64::from(runs) / secs / 1e6, out)
}

fn main() -> Result<(), expo::ParseError> {
    let (one, two) = (felix_like(1)?.len(), felix_like(2)?.len());
    let copies = 1 + (TARGET_BYTES.saturating_sub(one)).div_ceil(two - one);
    let text = felix_like(copies)?;
    let budget = Duration::from_secs(2);
    println!(
        "page: {} bytes, {} lines (Felix 3.20 families, distinct endpoint labels)",
        text.len(),
        text.lines().count()
    );

    let (ours, page) = measure(text.len(), budget, || expo::parse(&text));
    let page = page?;
    println!(
        "prober::agents::expo::parse      {ours:8.1} MB/s  ({} families, {} samples)",
        page.families.len(),
        page.sample_count()
    );

    let (theirs, scrape) = measure(text.len(), budget, || {
        prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
    });
    match scrape {
        Ok(scrape) => println!(
            "prometheus-parse 0.2 Scrape::parse {theirs:8.1} MB/s  ({} samples after its grouping of quantiles/buckets)",
            scrape.samples.len()
        ),
        Err(e) => println!("prometheus-parse failed: {e}"),
    }
    println!(
        "ratio: {:.1}x; target >= 100 MB/s: {}",
        ours / theirs,
        if ours >= 100.0 { "met" } else { "NOT met" }
    );
    Ok(())
}

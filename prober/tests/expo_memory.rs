//! Memory a hostile page can make the exposition parser allocate: a counting global
//! allocator (this test binary only, one test, so nothing else allocates meanwhile)
//! measures the peak of live heap bytes during `expo::parse` of pages built to be
//! expensive within the 8 MiB body limit and the parser's caps.
//!
//! Measured when this test was written: without the caps (`expo::MAX_SAMPLES`,
//! `MAX_FAMILIES`, `MAX_LABEL_PAIRS` set to `usize::MAX`) the worst page, 8 MiB of
//! distinct one-sample families, peaked at 448 MiB (56× the page); with them the worst
//! is about 22 MiB (2.7×, 50 distinct labels per sample).

use prober::agents::expo;
mod counting;

use counting::{LIVE, PEAK};
use std::sync::atomic::Ordering;

/// Peak heap bytes allocated on top of what was live before, while parsing `page`.
fn parse_peak(page: &str) -> (usize, Result<expo::Page, expo::ParseError>) {
    let base = LIVE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let got = expo::parse(page);
    (PEAK.load(Ordering::SeqCst) - base, got)
}

/// The scraper's default body limit (`ScrapeSettings::default().max_body_bytes`).
const BODY_LIMIT: usize = 8 << 20;

/// What a page within the body limit may make the parser hold at its peak: 4× the
/// limit (the caps keep the worst case near 2.7×).
const PEAK_LIMIT: usize = 4 * BODY_LIMIT;

fn fill(line: impl Fn(usize) -> String) -> String {
    let mut out = String::new();
    let mut i = 0;
    loop {
        let l = line(i);
        if out.len() + l.len() > BODY_LIMIT {
            return out;
        }
        out.push_str(&l);
        i += 1;
    }
}

#[test]
fn hostile_pages_make_the_parser_hold_at_most_four_times_the_body_limit() {
    let pages: Vec<(&str, String)> = vec![
        ("shortest samples", fill(|_| "a 1\n".to_owned())),
        ("distinct names", fill(|i| format!("m{i} 1\n"))),
        (
            "distinct label values",
            fill(|i| format!("m{{a=\"{i}\"}} 1\n")),
        ),
        (
            "50 distinct labels per sample",
            fill(|i| {
                let l: Vec<String> = (0..50).map(|k| format!("l{k}=\"{i}{k}\"")).collect();
                format!("m{{{}}} 1\n", l.join(","))
            }),
        ),
        (
            "64 labels, empty values",
            fill(|i| {
                let l: Vec<String> = (0..64).map(|k| format!("l{k}=\"\"")).collect();
                format!("m{}{{{}}} 1\n", i % 7, l.join(","))
            }),
        ),
        ("TYPE lines", fill(|i| format!("# TYPE f{i} gauge\n"))),
        (
            "HELP lines",
            fill(|i| format!("# HELP f{i} {}\n", "h".repeat(60_000))),
        ),
        (
            "long label values",
            fill(|i| format!("m{{a=\"{}{i}\"}} 1\n", "v".repeat(60_000))),
        ),
    ];
    let mut worst = 0usize;
    for (name, page) in &pages {
        let (peak, got) = parse_peak(page);
        let outcome = match &got {
            Ok(p) => format!("ok, {} samples", p.sample_count()),
            Err(e) => e.kind.reason().to_owned(),
        };
        eprintln!(
            "{name}: {} KiB page, parse peak {} KiB ({:.1}× the page), {outcome}",
            page.len() / 1024,
            peak / 1024,
            peak as f64 / page.len() as f64
        );
        drop(got);
        worst = worst.max(peak);
        assert!(
            peak <= PEAK_LIMIT,
            "{name}: parse peak {peak} bytes > {PEAK_LIMIT} (4× the body limit)"
        );
    }
    eprintln!("worst parse peak {} MiB", worst >> 20);
}

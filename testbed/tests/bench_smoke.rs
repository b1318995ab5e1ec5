//! Smoke run of the benchmark (`bash scripts/bench.sh` runs it in full into
//! `BENCHMARKS.md`): one small iteration of every section, on testbeds, asserting each
//! table is complete (every row it must have, no empty cell). Not a timed test: the
//! numbers are printed, not judged, except where a section checks a measurement against
//! the testbed's truth.
//!
//! Needs root, `ip`, `kubectl`, `wget`, `curl`, `nsenter` and the workspace binaries.

mod bench;
mod common;

use common::SERIAL;

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn smoke() -> bench::Opts {
    bench::Opts {
        smoke: true,
        parser_output: None,
    }
}

/// Prints the tables and asserts none has an empty cell and each has rows.
fn check(tables: &[bench::Table], want_titles: &[&str]) {
    for t in tables {
        eprintln!("{}", t.text());
    }
    let titles: Vec<&str> = tables.iter().map(|t| t.title.as_str()).collect();
    for w in want_titles {
        assert!(titles.contains(w), "no table {w:?} in {titles:?}");
    }
    for t in tables {
        assert!(!t.rows.is_empty(), "table {:?} has no rows", t.title);
        let empty = t.empty_cells();
        assert!(empty.is_empty(), "empty cells: {empty:#?}");
    }
    let md = bench::render(tables, &smoke(), "smoke", 0.0);
    for t in tables {
        assert!(md.contains(&format!("### {}", t.title)));
    }
}

fn root() -> bool {
    if nix::unistd::Uid::effective().is_root() {
        true
    } else {
        eprintln!("SKIPPED: needs root (network namespaces)");
        false
    }
}

#[test]
fn accuracy_mesh_and_resolution_tables_are_complete() {
    let _g = serial();
    if !root() {
        return;
    }
    let tables = bench::accuracy::run(&smoke());
    check(
        &tables,
        &[
            bench::accuracy::ACCURACY,
            bench::accuracy::PROGRAMMING,
            bench::accuracy::MESH,
            bench::accuracy::RESOLUTION,
        ],
    );
}

#[test]
fn footprint_tables_are_complete() {
    let _g = serial();
    if !root() {
        return;
    }
    let tables = bench::footprint::run(&smoke());
    check(
        &tables,
        &[bench::footprint::TARGET_SERVER, bench::footprint::PARSER],
    );
}

#[test]
fn scale_tables_are_complete() {
    let _g = serial();
    if !root() {
        return;
    }
    let tables = bench::scale::run(&smoke());
    check(&tables, bench::scale::TITLES);
}

#[test]
fn policy_table_is_complete() {
    let _g = serial();
    if !root() {
        return;
    }
    let tables = bench::policy::run(&smoke());
    check(&tables, &[bench::policy::POLICY]);
}

#[test]
fn paths_table_is_complete() {
    let _g = serial();
    if !root() {
        return;
    }
    let tables = bench::paths::run(&smoke());
    check(&tables, &[bench::paths::PATHS]);
    // Eight paths a probe, both families: a row for each.
    let rows: std::collections::BTreeSet<&str> =
        tables[0].rows.iter().map(|r| r[1].as_str()).collect();
    assert_eq!(rows.len(), 8, "{rows:?}");
    assert!(rows.iter().any(|p| p.contains("/ipv6/")), "{rows:?}");
}

#[test]
fn update_replaces_only_the_re_run_tables() {
    let table = |title: &str, cell: &str| {
        let mut t = bench::Table::new(title, "how", &["a", "b"]);
        t.row(vec!["x".into(), cell.into()]);
        t
    };
    let first = bench::render(
        &[table("One", "1"), table("Two", "2")],
        &bench::Opts::default(),
        "first run",
        10.0,
    );
    let updated = bench::update(
        &first,
        &[table("Two", "22"), table("Three", "3")],
        "two",
        "later",
        5.0,
    );
    assert!(updated.contains("first run"), "{updated}");
    assert!(updated.contains("Re-run of `two`"), "{updated}");
    for (title, n) in [("### One", 1), ("### Two", 1), ("### Three", 1)] {
        assert_eq!(updated.matches(title).count(), n, "{title} in:\n{updated}");
    }
    assert!(
        updated.contains("| x | 1 |") && updated.contains("| x | 22 |"),
        "{updated}"
    );
    assert!(!updated.contains("| x | 2 |"), "{updated}");
    assert!(updated.find("### One") < updated.find("### Two"));
    // A second re-run of the same section replaces the first one's header line.
    let again = bench::update(&updated, &[table("Two", "222")], "two", "latest", 5.0);
    assert_eq!(again.matches("Re-run of `two`").count(), 1, "{again}");
    assert!(
        again.contains("latest") && !again.contains("later"),
        "{again}"
    );
    assert!(
        again.contains("first run") && again.contains("| x | 222 |"),
        "{again}"
    );
}

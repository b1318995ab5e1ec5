//! The repository stands on its own: what users read — README, `docs/`, the fault
//! files, the manifests, every `--help` of the three binaries — and the code cite no file
//! outside the repository (the team's design notes are not shipped), every repository
//! path they cite exists, every fault file in `testbed/faults/` parses, and the
//! `--agent-config` example in `docs/agent-config.md` is a valid profiles file. README is
//! the front door (at most [`README_MAX_LINES`] lines, the two set-up commands); every
//! fault key is in the fault reference; the docs
//! book (`docs/book.toml`, `docs/src/SUMMARY.md`) lists every chapter, every relative
//! link and `#anchor` of README and the book resolves, and the reference tables (results
//! and reasons, alerts) list everything the code has. No testbed is started (the `--help`
//! texts come from the built binaries). `bash scripts/book.sh` builds the book and checks
//! the built HTML's links as well.
//!
//! Needs the workspace binaries (`cargo build --workspace --bins`).

mod common;

use common::{bin, repo_file};
use std::path::{Path, PathBuf};
use std::process::Command;

/// What a citation of a file outside the repository looks like.
const OUTSIDE: [&str; 6] = [
    "DESIGN.md",
    "DESIGN §",
    "SCENARIOS.md",
    "STYLE.md",
    "shared/",
    "notes/",
];

/// Top-level entries of the repository a cited path may start with.
const TOP: [&str; 12] = [
    "ci-examples/",
    "prober/",
    "target-server/",
    "testbed/",
    "manifests/",
    "docs/",
    "scripts/",
    "dashboards/",
    "alerts/",
    ".ci/",
    "README.md",
    "Cargo.toml",
];

/// Lines of `text` citing a file outside the repository, as `origin:line: text`.
fn outside_citations(origin: &str, text: &str) -> Vec<String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| OUTSIDE.iter().any(|o| l.contains(o)))
        .map(|(i, l)| format!("{origin}:{}: {}", i + 1, l.trim()))
        .collect()
}

fn files_under(dir: &Path, keep: &dyn Fn(&Path) -> bool, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        if p.is_dir() {
            if name == "target" || name.starts_with('.') && name != ".ci" {
                continue;
            }
            files_under(&p, keep, out);
        } else if keep(&p) {
            out.push(p);
        }
    }
}

fn rel(p: &Path) -> String {
    let root = repo_file("").canonicalize().expect("repo root");
    p.canonicalize()
        .ok()
        .and_then(|c| c.strip_prefix(&root).ok().map(|r| r.display().to_string()))
        .unwrap_or_else(|| p.display().to_string())
}

/// The documents users read: README, BENCHMARKS.md, docs/, testbed/ARCHITECTURE.md, fault
/// files, manifests.
fn user_documents() -> Vec<PathBuf> {
    let mut v = vec![
        repo_file("README.md"),
        repo_file("BENCHMARKS.md"),
        repo_file("testbed/ARCHITECTURE.md"),
    ];
    let ext = |e: &'static [&'static str]| {
        move |p: &Path| {
            p.extension()
                .and_then(|x| x.to_str())
                .is_some_and(|x| e.contains(&x))
        }
    };
    files_under(&repo_file("docs"), &ext(&["md"]), &mut v);
    files_under(&repo_file("testbed/faults"), &ext(&["yaml"]), &mut v);
    files_under(
        &repo_file("manifests"),
        &ext(&["yaml", "yml", "md"]),
        &mut v,
    );
    v
}

/// `--help` of `binary ARGS…` (must succeed).
fn help(binary: &str, args: &[&str]) -> String {
    let out = Command::new(bin(binary))
        .args(args)
        .arg("--help")
        .output()
        .expect("run --help");
    assert!(
        out.status.success(),
        "{binary} {args:?} --help failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Subcommand names listed under `Commands:` in a clap help text.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect()
}

/// Every `--help` text of the three binaries and their subcommands, with its command.
fn all_help_texts() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for b in ["prober", "target-server", "testbed"] {
        let top = help(b, &[]);
        let subs = subcommands(&top);
        out.push((b.to_owned(), top));
        for s in subs {
            out.push((format!("{b} {s}"), help(b, &[s.as_str()])));
        }
    }
    out
}

#[test]
fn nothing_users_read_cites_a_file_outside_the_repository() {
    let mut bad = Vec::new();
    for p in user_documents() {
        let text = std::fs::read_to_string(&p).expect("read document");
        bad.extend(outside_citations(&rel(&p), &text));
    }
    let helps = all_help_texts();
    assert!(
        helps.iter().any(|(c, _)| c == "prober gate")
            && helps.iter().any(|(c, _)| c == "testbed up"),
        "subcommands not found in --help: {:?}",
        helps.iter().map(|(c, _)| c).collect::<Vec<_>>()
    );
    for (cmd, text) in &helps {
        bad.extend(outside_citations(&format!("{cmd} --help"), text));
    }
    assert!(
        bad.is_empty(),
        "citations of files outside the repository:\n{}",
        bad.join("\n")
    );
}

#[test]
fn no_source_file_cites_a_file_outside_the_repository() {
    let mut files = Vec::new();
    let code = |p: &Path| {
        p.extension()
            .and_then(|x| x.to_str())
            .is_some_and(|x| ["rs", "sh", "toml", "json"].contains(&x))
            || p.file_name().is_some_and(|n| n == "run")
    };
    for top in [
        "prober",
        "target-server",
        "testbed",
        "scripts",
        ".ci",
        "dashboards",
        "alerts",
    ] {
        files_under(&repo_file(top), &code, &mut files);
    }
    files.push(repo_file("Cargo.toml"));
    assert!(files.len() > 20, "found only {} source files", files.len());
    let mut bad = Vec::new();
    for p in files {
        if p.ends_with("tests/docs.rs") {
            continue; // this file names the patterns it looks for
        }
        let text = std::fs::read_to_string(&p).unwrap_or_default();
        let mut found = outside_citations(&rel(&p), &text);
        // `.ci/run` is the one file allowed to take inputs from the team's `../shared`
        // when that directory exists (the Calico source archives Felix is built from).
        if p.ends_with(".ci/run") {
            found.retain(|l| !l.contains("../shared/calico"));
        }
        bad.extend(found);
    }
    assert!(
        bad.is_empty(),
        "citations of files outside the repository:\n{}",
        bad.join("\n")
    );
}

/// Repository paths in backticks or Markdown links of README and docs/ (`docs/x.md`,
/// `testbed/faults/s1-healthy.yaml`, `[x](scenarios.md)`), each resolved against the
/// repository root or the document's own directory.
#[test]
fn every_repository_path_the_documents_cite_exists() {
    let mut missing = Vec::new();
    let mut checked = 0;
    let mut docs = vec![repo_file("README.md")];
    files_under(
        &repo_file("docs"),
        &|p: &Path| p.extension().is_some_and(|x| x == "md"),
        &mut docs,
    );
    for doc in docs {
        let text = std::fs::read_to_string(&doc).expect("read");
        let dir = doc.parent().expect("dir").to_path_buf();
        let mut cands: Vec<(String, bool)> = Vec::new();
        // A line that says the thing is planned may name a path that does not exist yet.
        for line in text
            .lines()
            .filter(|l| !l.contains("planned") && !l.contains("not yet"))
        {
            for (i, part) in line.split('`').enumerate() {
                if i % 2 == 1 {
                    cands.push((part.to_owned(), false));
                }
            }
            for piece in line.split("](").skip(1) {
                if let Some(end) = piece.find(')') {
                    cands.push((piece[..end].to_owned(), true));
                }
            }
        }
        for (c, link) in cands {
            let c = c.split('#').next().unwrap_or_default().trim().to_owned();
            if c.is_empty() || c.contains(' ') || c.contains('*') || c.contains("://") {
                continue;
            }
            let path = if TOP.iter().any(|t| c.starts_with(t)) {
                repo_file(&c)
            } else if link && !c.starts_with('/') {
                dir.join(&c)
            } else {
                continue;
            };
            checked += 1;
            if !path.exists() {
                missing.push(format!("{}: {c}", rel(&doc)));
            }
        }
    }
    assert!(
        checked > 10,
        "only {checked} paths found: the extraction is broken"
    );
    assert!(
        missing.is_empty(),
        "cited paths that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_fault_file_parses_and_names_its_scenario() {
    let mut files = Vec::new();
    files_under(
        &repo_file("testbed/faults"),
        &|p: &Path| p.extension().is_some_and(|x| x == "yaml"),
        &mut files,
    );
    assert!(files.len() >= 9, "fault files: {files:?}");
    let scenarios = std::fs::read_to_string(repo_file("docs/scenarios.md")).expect("scenarios");
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read");
        if let Err(e) = testbed::fault::FaultFile::parse(&text) {
            panic!("{}: {e}", rel(&f));
        }
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if let Some(n) = name.strip_prefix('s').and_then(|r| r.split('-').next()) {
            if n.chars().all(|c| c.is_ascii_digit()) {
                assert!(
                    scenarios.contains(&format!("## S{n} ")),
                    "{name}: no scenario S{n} in docs/scenarios.md"
                );
                assert!(
                    text.starts_with(&format!("# docs/scenarios.md S{n} ")),
                    "{name} does not start by naming its scenario"
                );
            }
        }
    }
}

/// Every key a fault rule takes is in the fault reference — `docs/src/faults.md`, or the
/// real-agent table of `docs/src/testbed.md` — written as `` `key: `` or `` `key` ``.
#[test]
fn every_fault_primitive_is_in_the_fault_reference() {
    let docs = ["docs/src/faults.md", "docs/src/testbed.md"]
        .map(|p| std::fs::read_to_string(repo_file(p)).expect(p))
        .join("\n");
    let missing: Vec<&str> = testbed::fault::PRIMITIVE_KEYS
        .iter()
        .copied()
        .filter(|k| !docs.contains(&format!("`{k}:")) && !docs.contains(&format!("`{k}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "fault keys documented in neither docs/src/faults.md nor docs/src/testbed.md: {missing:?}"
    );
}

#[test]
fn the_agent_config_example_in_the_docs_is_a_valid_profiles_file() {
    let doc = std::fs::read_to_string(repo_file("docs/agent-config.md")).expect("doc");
    let start = doc.find("```yaml\nprofiles:").expect("yaml example") + "```yaml\n".len();
    let len = doc[start..].find("```").expect("end of example");
    let profiles = prober::agents::profiles::parse_profiles(&doc[start..start + len], "docs")
        .unwrap_or_else(|e| panic!("docs/agent-config.md example: {e}"));
    let names: Vec<&str> = profiles.iter().map(|p| p.name.as_str()).collect();
    assert!(names.contains(&"my-cni"), "{names:?}");
    assert!(!names.contains(&"aws-node"), "disable ignored: {names:?}");
    // The built-in table lists every built-in profile with its selector.
    for b in prober::agents::profiles::builtin_profiles() {
        assert!(
            doc.contains(&format!("| `{}` | `{}` |", b.name, b.selector)),
            "built-in {} ({}) missing from the table",
            b.name,
            b.selector
        );
    }
}

/// README is the front door: at most this many lines (issue 31), everything else in the
/// book.
const README_MAX_LINES: usize = 250;

/// The two set-up commands a new user runs on a fresh Linux machine, each alone in a
/// ```` ```sh ```` block of README: the demo and the tests (`.ci/run` is what CI runs).
const SETUP_COMMANDS: [&str; 2] = ["bash scripts/demo.sh", "bash .ci/run"];

/// The book's chapters that must exist (issue 31): file name under `docs/src/`.
const REQUIRED_CHAPTERS: [&str; 11] = [
    "measurement.md",
    "probe-kinds.md",
    "results.md",
    "metrics-alerts.md",
    "testbed.md",
    "faults.md",
    "benchmarks.md",
    "troubleshooting.md",
    "architecture.md",
    "design.md",
    "scenarios.md",
];

#[test]
fn readme_is_a_front_door_with_the_two_set_up_commands() {
    let readme = std::fs::read_to_string(repo_file("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move the details into the book (docs/src/)"
    );
    for cmd in SETUP_COMMANDS {
        assert!(
            readme.contains(&format!("```sh\n{cmd}\n```")),
            "README.md has no ```sh block holding exactly `{cmd}`"
        );
    }
    assert!(repo_file(".ci/run").exists(), ".ci/run is missing");
    assert!(
        repo_file("scripts/demo.sh").exists(),
        "scripts/demo.sh is missing"
    );
}

/// The chapters `docs/src/SUMMARY.md` links to, in order.
fn summary_chapters() -> Vec<String> {
    let summary = std::fs::read_to_string(repo_file("docs/src/SUMMARY.md")).expect("SUMMARY.md");
    summary
        .split("](")
        .skip(1)
        .filter_map(|p| p.find(')').map(|e| p[..e].to_owned()))
        .collect()
}

#[test]
fn the_book_lists_every_chapter_and_its_includes_exist() {
    assert!(
        repo_file("docs/book.toml").exists(),
        "docs/book.toml is missing"
    );
    let chapters = summary_chapters();
    for c in REQUIRED_CHAPTERS {
        assert!(
            chapters.iter().any(|x| x == c),
            "docs/src/SUMMARY.md does not list the chapter {c}: {chapters:?}"
        );
    }
    let mut files = Vec::new();
    files_under(
        &repo_file("docs/src"),
        &|p: &Path| p.extension().is_some_and(|x| x == "md"),
        &mut files,
    );
    for c in &chapters {
        assert!(
            repo_file("docs/src").join(c).exists(),
            "docs/src/SUMMARY.md lists {c}, which does not exist"
        );
    }
    for f in &files {
        let name = rel(f);
        let inner = name.strip_prefix("docs/src/").unwrap_or(&name);
        assert!(
            inner == "SUMMARY.md" || chapters.iter().any(|c| c == inner),
            "{name} is not in docs/src/SUMMARY.md (mdBook would leave it out)"
        );
        // Every `{{#include PATH}}` names an existing file (mdBook fails on a missing one,
        // but only when the book is built).
        let text = std::fs::read_to_string(f).expect("read chapter");
        for inc in includes(&text) {
            assert!(
                f.parent().expect("dir").join(&inc).exists(),
                "{name}: {{{{#include {inc}}}}} names a file that does not exist"
            );
        }
    }
}

/// The paths of the `{{#include PATH}}` directives in `text`.
fn includes(text: &str) -> Vec<String> {
    text.split("{{#include ")
        .skip(1)
        .filter_map(|p| p.find("}}").map(|e| p[..e].trim().to_owned()))
        .collect()
}

/// `text` with its `{{#include PATH}}` directives replaced by the files' contents (`dir`:
/// the directory PATH is relative to), as mdBook renders a chapter.
fn expand_includes(text: &str, dir: &Path) -> String {
    let mut out = text.to_owned();
    for inc in includes(text) {
        let body = std::fs::read_to_string(dir.join(&inc)).unwrap_or_default();
        out = out.replace(&format!("{{{{#include {inc}}}}}"), &body);
    }
    out
}

/// The anchor mdBook and GitHub give a heading: lower case, letters, digits, `-` and `_`
/// kept, spaces turned into `-`, everything else (backticks, punctuation) dropped.
fn heading_anchor(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_lowercase().next().unwrap_or(c))
            } else if c == ' ' {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// The anchors of the Markdown headings in `text` (outside code blocks).
fn anchors(text: &str) -> Vec<String> {
    let mut fence = false;
    let mut out = Vec::new();
    for l in text.lines() {
        if l.starts_with("```") {
            fence = !fence;
        } else if !fence && l.starts_with('#') {
            let h = l.trim_start_matches('#');
            if h.starts_with(' ') {
                out.push(heading_anchor(h));
            }
        }
    }
    out
}

#[test]
fn every_link_and_anchor_of_the_readme_and_the_book_resolves() {
    assert_eq!(
        heading_anchor(" RBAC (`manifests/base/rbac.yaml`)"),
        "rbac-manifestsbaserbacyaml"
    );
    let mut docs = vec![repo_file("README.md")];
    files_under(
        &repo_file("docs"),
        &|p: &Path| p.extension().is_some_and(|x| x == "md"),
        &mut docs,
    );
    let mut bad = Vec::new();
    let mut anchors_checked = 0;
    for doc in &docs {
        let dir = doc.parent().expect("dir").to_path_buf();
        let text = std::fs::read_to_string(doc).expect("read");
        let mut fence = false;
        for line in text.lines() {
            if line.starts_with("```") {
                fence = !fence;
            }
            if fence {
                continue;
            }
            for piece in line.split("](").skip(1) {
                let Some(end) = piece.find(')') else { continue };
                let link = &piece[..end];
                if link.contains("://") || link.starts_with("mailto:") {
                    continue;
                }
                let (path, anchor) = link.split_once('#').unwrap_or((link, ""));
                let target = if path.is_empty() {
                    doc.clone()
                } else {
                    dir.join(path)
                };
                if !target.exists() {
                    bad.push(format!("{}: {link}: no such file", rel(doc)));
                    continue;
                }
                if anchor.is_empty() || target.extension().is_none_or(|x| x != "md") {
                    continue;
                }
                let body = std::fs::read_to_string(&target).expect("read link target");
                let body = expand_includes(&body, target.parent().expect("dir"));
                anchors_checked += 1;
                if !anchors(&body).iter().any(|a| a == anchor) {
                    bad.push(format!(
                        "{}: {link}: no heading with the anchor #{anchor} in {}",
                        rel(doc),
                        rel(&target)
                    ));
                }
            }
        }
    }
    assert!(
        anchors_checked > 10,
        "only {anchors_checked} anchors found: the extraction is broken"
    );
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
}

/// The rows of the first Markdown table in `text` whose first cell starts with a
/// backticked name, as (first cell, whole row).
fn table_rows(text: &str, header_starts: &str) -> Vec<(String, String)> {
    let Some(start) = text.find(header_starts) else {
        return Vec::new();
    };
    text[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let first = l.trim_matches('|').split('|').next().unwrap_or("").trim();
            (first.to_owned(), l.to_owned())
        })
        .collect()
}

/// README's short table and the results reference's full one list every result with
/// every reason of it (`firstpacket_report::Reason::result`), and no reason elsewhere.
#[test]
fn the_result_tables_list_every_reason_under_its_result() {
    use firstpacket_report::{ProbeResult, Reason};
    for (doc, header) in [
        (
            "README.md",
            "| result | counts toward the verdict | reasons |",
        ),
        ("docs/src/results.md", "| result | reasons |"),
    ] {
        let text = std::fs::read_to_string(repo_file(doc)).expect("read");
        let rows = table_rows(&text, header);
        assert!(
            !rows.is_empty(),
            "{doc}: no results table starting {header:?}"
        );
        for class in ProbeResult::ALL {
            let row = rows
                .iter()
                .find(|(first, _)| first.starts_with(&format!("`{}`", class.as_str())))
                .unwrap_or_else(|| {
                    panic!("{doc}: the results table has no row `{}`", class.as_str())
                });
            for r in Reason::ALL {
                let named = row.1.contains(&format!("`{}`", r.as_str()));
                assert_eq!(
                    named,
                    r.result() == class,
                    "{doc}: reason `{}` (result `{}`) in the row of `{}`: {}",
                    r.as_str(),
                    r.result().as_str(),
                    class.as_str(),
                    if named {
                        "listed in the wrong row"
                    } else {
                        "missing"
                    }
                );
            }
        }
    }
}

/// The results reference's table of reasons has one row per reason, naming its result.
#[test]
fn the_reasons_table_has_a_row_per_reason_with_its_result() {
    use firstpacket_report::Reason;
    let text = std::fs::read_to_string(repo_file("docs/src/results.md")).expect("results.md");
    let rows = table_rows(&text, "| reason | result | meaning |");
    assert!(!rows.is_empty(), "docs/src/results.md: no reasons table");
    for r in Reason::ALL {
        let row = rows
            .iter()
            .find(|(first, _)| *first == format!("`{}`", r.as_str()))
            .unwrap_or_else(|| {
                panic!(
                    "docs/src/results.md: no row for the reason `{}`",
                    r.as_str()
                )
            });
        let result = row.1.split('|').nth(2).unwrap_or("").trim();
        assert_eq!(
            result,
            format!("`{}`", r.result().as_str()),
            "docs/src/results.md: the reason `{}` names the wrong result",
            r.as_str()
        );
    }
    assert_eq!(
        rows.len(),
        Reason::ALL.len(),
        "docs/src/results.md: reasons that do not exist: {:?}",
        rows.iter().map(|(f, _)| f).collect::<Vec<_>>()
    );
}

/// The alerts reference's table has a row for every alert of
/// `alerts/firstpacket.rules.yaml`, and no other.
#[test]
fn the_alerts_reference_lists_every_alert_of_the_rule_file() {
    let rules = std::fs::read_to_string(repo_file("alerts/firstpacket.rules.yaml")).expect("rules");
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:").map(str::trim))
        .collect();
    assert!(alerts.len() >= 5, "alerts in the rule file: {alerts:?}");
    let doc = std::fs::read_to_string(repo_file("docs/src/metrics-alerts.md")).expect("doc");
    let rows = table_rows(&doc, "| alert | severity | fires when | for |");
    assert!(
        !rows.is_empty(),
        "docs/src/metrics-alerts.md: no alerts table"
    );
    let documented: Vec<String> = rows
        .iter()
        .map(|(f, _)| f.trim_matches('`').to_owned())
        .collect();
    let missing: Vec<&&str> = alerts
        .iter()
        .filter(|a| !documented.iter().any(|d| d == **a))
        .collect();
    let extra: Vec<&String> = documented
        .iter()
        .filter(|d| !alerts.contains(&d.as_str()))
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "docs/src/metrics-alerts.md's alerts table: missing {missing:?}, not in the rule file {extra:?}"
    );
}

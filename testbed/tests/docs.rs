//! The repository stands on its own: what users read — README, `docs/`, the fault
//! files, the manifests, every `--help` of the three binaries — and the code cite no file
//! outside the repository (the team's design notes are not shipped), every repository
//! path they cite exists, every fault file in `testbed/faults/` parses, and the
//! `--agent-config` example in `docs/agent-config.md` is a valid profiles file. No
//! testbed is started (the `--help` texts come from the built binaries).
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
const TOP: [&str; 11] = [
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

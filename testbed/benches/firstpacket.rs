//! `cargo bench -p testbed --bench firstpacket -- [--smoke] [--only SECTIONS] [--out FILE]
//! [--parser-output FILE]`: runs the benchmark sections (testbed/tests/bench/) on testbeds,
//! prints one table per measurement and writes them as Markdown to `--out` (default
//! `BENCHMARKS.md` at the repository root). `bash scripts/bench.sh` is the one command
//! that builds what it needs and runs it. Needs root (network namespaces), `kubectl`, and
//! the release binaries beside this one (`cargo build --release --workspace --bins`).
//!
//! `--update` replaces only the tables this run made in an existing `--out` file and adds
//! a line saying which sections were re-run when.
//!
//! Sections (`--only`, comma-separated): `accuracy` (accuracy, mesh, resolution),
//! `footprint` (target-server, parser), `scale` (prober at 10/100/1 000 nodes, gate wall
//! time), `policy` (NetworkPolicy latency next to kube-burner's and clusterloader2's
//! methods), `paths` (each path's accuracy: TCP and UDP, small and full-size).

#[path = "../tests/bench/mod.rs"]
mod bench;
#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

const SECTIONS: [&str; 5] = ["accuracy", "footprint", "scale", "policy", "paths"];

fn usage() -> ! {
    eprintln!(
        "usage: cargo bench -p testbed --bench firstpacket -- [--smoke] [--only {}] [--update] [--out FILE] [--parser-output FILE]\n  --update: replace only the tables this run made in an existing --out file (and say so in its header)",
        SECTIONS.join(",")
    );
    std::process::exit(2)
}

/// `p` as given when absolute, else relative to `FIRSTPACKET_BENCH_CWD` (the directory
/// `scripts/bench.sh` was started from; cargo runs benchmarks in the package directory),
/// else to the repository root.
fn user_path(p: &str) -> std::path::PathBuf {
    let p = std::path::PathBuf::from(p);
    if p.is_absolute() {
        return p;
    }
    std::env::var_os("FIRSTPACKET_BENCH_CWD")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| common::repo_file(""))
        .join(p)
}

fn main() {
    let mut opts = bench::Opts::default();
    let mut update = false;
    let mut out = common::repo_file("BENCHMARKS.md");
    let mut only: Vec<String> = SECTIONS.iter().map(|s| (*s).to_owned()).collect();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--smoke" => opts.smoke = true,
            "--update" => update = true,
            "--out" => out = user_path(&args.next().unwrap_or_else(|| usage())),
            "--parser-output" => {
                let p = user_path(&args.next().unwrap_or_else(|| usage()));
                opts.parser_output = Some(std::fs::read_to_string(&p).unwrap_or_else(|e| {
                    eprintln!("--parser-output {}: {e}", p.display());
                    std::process::exit(2)
                }));
            }
            "--only" => {
                only = args
                    .next()
                    .unwrap_or_else(|| usage())
                    .split(',')
                    .map(str::to_owned)
                    .collect();
                if let Some(bad) = only.iter().find(|s| !SECTIONS.contains(&s.as_str())) {
                    eprintln!(
                        "--only: unknown section {bad:?} (sections: {})",
                        SECTIONS.join(",")
                    );
                    std::process::exit(2)
                }
            }
            // `cargo bench` passes `--bench` to every bench target.
            "--bench" => {}
            "-h" | "--help" => usage(),
            other => {
                eprintln!("unknown argument {other:?}");
                usage()
            }
        }
    }
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("the benchmark needs root (network namespaces)");
        std::process::exit(2)
    }
    let started = std::process::Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let started = format!("{started} (load average at the start {})", bench::loadavg());
    let t0 = Instant::now();
    let mut tables = Vec::new();
    for s in &only {
        eprintln!("==> bench section {s}");
        let t = Instant::now();
        let got = match s.as_str() {
            "accuracy" => bench::accuracy::run(&opts),
            "footprint" => bench::footprint::run(&opts),
            "scale" => bench::scale::run(&opts),
            "policy" => bench::policy::run(&opts),
            "paths" => bench::paths::run(&opts),
            _ => unreachable!(),
        };
        for table in &got {
            println!("{}", table.text());
        }
        eprintln!("<== bench section {s}: {:.0}s", t.elapsed().as_secs_f64());
        tables.extend(got);
    }
    let secs = t0.elapsed().as_secs_f64();
    let md = match std::fs::read_to_string(&out) {
        Ok(old) if update => bench::update(&old, &tables, &only.join(","), &started, secs),
        _ => bench::render(&tables, &opts, &started, secs),
    };
    std::fs::write(&out, md).unwrap_or_else(|e| {
        eprintln!("write {}: {e}", out.display());
        std::process::exit(1)
    });
    eprintln!("wrote {}", out.display());
}

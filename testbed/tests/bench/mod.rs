//! The benchmark behind `BENCHMARKS.md` (`bash scripts/bench.sh` runs it in full; the
//! `bench_smoke` test runs one small iteration of every section in the default tests).
//!
//! Every section runs on a testbed and measures against its ground truth (the truth log,
//! docs/design.md §6): accuracy of firstpacket next to the operator's loop and a 1 s poller,
//! what a long-lived mesh sees, resolution vs `--dial-interval`, the prober's footprint
//! and API cost at 10 / 100 / 1 000 nodes (hollow beyond the netns ones), target-server's
//! footprint and the exposition parser's throughput, and NetworkPolicy latency next to
//! kube-burner's and clusterloader2's methods. Each section returns [`Table`]s;
//! [`render`] writes them as Markdown with the machine and the commands.
#![allow(dead_code)]

pub mod accuracy;
pub mod footprint;
pub mod paths;
pub mod policy;
pub mod scale;

use std::fmt::Write as _;

/// How much to run.
#[derive(Debug, Clone, Default)]
pub struct Opts {
    /// One small iteration of each measurement (the CI smoke run): the tables are
    /// complete but rest on few samples.
    pub smoke: bool,
    /// Output of `cargo bench -p prober --bench expo` (parser MB/s), when the script ran it.
    pub parser_output: Option<String>,
}

/// One table of the report: what was measured and how (`method`), a header, rows.
#[derive(Debug, Clone)]
pub struct Table {
    /// Short title, e.g. `Accuracy against truth`.
    pub title: String,
    /// How it was measured and what the truth is (Markdown paragraph).
    pub method: String,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
    /// Findings under the table (targets met or not), one Markdown line each.
    pub notes: Vec<String>,
}

impl Table {
    pub fn new(title: &str, method: &str, header: &[&str]) -> Table {
        Table {
            title: title.to_owned(),
            method: method.to_owned(),
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Appends a row; panics when it does not have one cell per column.
    pub fn row(&mut self, cells: Vec<String>) {
        assert_eq!(
            cells.len(),
            self.header.len(),
            "{}: row {cells:?} vs header {:?}",
            self.title,
            self.header
        );
        self.rows.push(cells);
    }

    /// Cells that are empty or `NaN` (a measurement that produced nothing), as
    /// `title: row N (first cell) / column`.
    pub fn empty_cells(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (r, row) in self.rows.iter().enumerate() {
            for (c, cell) in row.iter().enumerate() {
                if cell.trim().is_empty() || cell.contains("NaN") {
                    out.push(format!(
                        "{}: row {} ({}) / {}",
                        self.title, r, row[0], self.header[c]
                    ));
                }
            }
        }
        out
    }

    /// The table as Markdown (title as `###`).
    pub fn markdown(&self) -> String {
        let mut s = format!("### {}\n\n{}\n\n", self.title, self.method);
        // A `|` inside a cell (`p95 |err|`) would end it: escaped as GitHub's tables
        // want.
        let cells = |c: &[String]| {
            c.iter()
                .map(|x| x.replace('|', "\\|"))
                .collect::<Vec<_>>()
                .join(" | ")
        };
        let _ = writeln!(s, "| {} |", cells(&self.header));
        let _ = writeln!(
            s,
            "|{}|",
            self.header
                .iter()
                .map(|_| "---")
                .collect::<Vec<_>>()
                .join("|")
        );
        for r in &self.rows {
            let _ = writeln!(s, "| {} |", cells(r));
        }
        if !self.notes.is_empty() {
            s.push('\n');
            for n in &self.notes {
                let _ = writeln!(s, "- {n}");
            }
        }
        s
    }

    /// The table as aligned plain text (what the bench prints).
    pub fn text(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |cells: &[String]| {
            cells
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect::<Vec<_>>()
                .join("  ")
        };
        let mut s = format!("== {}\n{}\n", self.title, line(&self.header));
        for r in &self.rows {
            let _ = writeln!(s, "{}", line(r));
        }
        for n in &self.notes {
            let _ = writeln!(s, "  * {n}");
        }
        s
    }
}

/// The `q` quantile (0..=1) of `v` by nearest rank; NaN when `v` is empty.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

/// p5/p50/p95/max of signed errors, min, p95 of |error|.
pub fn stats(errs: &[f64]) -> [f64; 6] {
    let abs: Vec<f64> = errs.iter().map(|e| e.abs()).collect();
    [
        quantile(errs, 0.05),
        quantile(errs, 0.5),
        quantile(errs, 0.95),
        errs.iter().copied().fold(f64::NAN, f64::max),
        errs.iter().copied().fold(f64::NAN, f64::min),
        quantile(&abs, 0.95),
    ]
}

/// Moves the calling thread into the network namespace of process `pid`.
pub fn enter_netns_of(pid: i32) -> Result<(), String> {
    let f = std::fs::File::open(format!("/proc/{pid}/ns/net")).map_err(|e| format!("{e}"))?;
    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| format!("setns: {e}"))
}

/// Seconds as milliseconds with a sign (`+12`, `-3`), `n/a` for NaN.
pub fn ms(secs: f64) -> String {
    let v = (secs * 1000.0).round();
    if v.is_nan() {
        "n/a".into()
    } else if v == 0.0 {
        "0".into()
    } else {
        format!("{v:+.0}")
    }
}

/// Mebibytes from kibibytes, one decimal.
pub fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

/// `VmRSS`/`VmHWM` etc. of `/proc/PID/status` in KiB; `None` when the process is gone.
pub fn proc_kib(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// User + system CPU seconds of process `pid` (`/proc/PID/stat` fields 14 and 15, in
/// clock ticks of `sysconf(_SC_CLK_TCK)`); `None` when the process is gone.
pub fn proc_cpu_seconds(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    Some(ticks / hz)
}

/// The machine the numbers come from: CPU model and count, memory, kernel, rustc.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")?
                .split_once(':')
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:").map(|v| v.trim().to_owned()))
        .unwrap_or_default();
    let cmd = |c: &str, a: &[&str]| {
        std::process::Command::new(c)
            .args(a)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    format!(
        "{cpus} × {model}, {mem} memory, Linux {}, {}",
        cmd("uname", &["-r"]),
        cmd("rustc", &["--version"])
    )
}

/// `/proc/loadavg`'s first three fields (1, 5, 15 min), e.g. `0.52 0.40 0.31`: other work on
/// the machine skews the timings, so the report shows it.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// `BENCHMARKS.md`: the machine, the commands, every table.
pub fn render(tables: &[Table], opts: &Opts, started: &str, secs: f64) -> String {
    let mut s = String::from(
        "# Benchmarks\n\n\
         Generated by `bash scripts/bench.sh` (it builds the release binaries, runs \
         `cargo bench -p prober --bench expo` and `cargo bench -p testbed --bench firstpacket \
         -- --out BENCHMARKS.md`); do not edit by hand. Every number below comes from that \
         one run, on testbeds whose ground truth is the truth log (`testbed truth`), so the \
         methods compared share one machine, one run and one truth.\n\n",
    );
    let _ = writeln!(s, "- Machine: {}", machine());
    let _ = writeln!(
        s,
        "- Run: {started}, {:.0} s; load average (1/5/15 min) at the end {}{}\n",
        secs,
        loadavg(),
        if opts.smoke {
            " — **smoke run** (one small iteration of each; too few samples to judge targets)"
        } else {
            ""
        }
    );
    for t in tables {
        s.push_str(&t.markdown());
        s.push('\n');
    }
    s
}

/// An existing report `old` (as [`render`] wrote it) with the tables of `tables` replaced
/// (matched by title; new titles appended) and a header line saying `sections` were re-run
/// at `started` for `secs` seconds; an earlier re-run line of the same `sections` goes (its
/// tables are the ones replaced). Everything else is kept as it was.
pub fn update(old: &str, tables: &[Table], sections: &str, started: &str, secs: f64) -> String {
    let (head, body) = match old.find("\n### ") {
        Some(i) => old.split_at(i + 1),
        None => (old, ""),
    };
    // Sections of the body, each starting with its `### ` line.
    let mut parts: Vec<String> = Vec::new();
    for chunk in body.split("\n### ") {
        let chunk = chunk.strip_prefix("### ").unwrap_or(chunk);
        if !chunk.trim().is_empty() {
            parts.push(format!("### {}\n", chunk.trim_end()));
        }
    }
    for t in tables {
        let new = t.markdown();
        let title = format!("### {}\n", t.title);
        match parts.iter_mut().find(|p| p.starts_with(&title)) {
            Some(p) => *p = new,
            None => parts.push(new),
        }
    }
    let earlier = format!("- Re-run of `{sections}` ");
    let mut s = head
        .trim_end()
        .lines()
        .filter(|l| !l.starts_with(&earlier))
        .collect::<Vec<_>>()
        .join("\n");
    let _ = writeln!(
        s,
        "\n- Re-run of `{sections}` (`--only {sections} --update`): {started}, {secs:.0} s; load \
         average (1/5/15 min) at the end {}; its tables replace the first run's\n",
        loadavg()
    );
    for p in parts {
        s.push_str(p.trim_end());
        s.push_str("\n\n");
    }
    s
}

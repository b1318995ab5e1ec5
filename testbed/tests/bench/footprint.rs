//! target-server's footprint (RSS, static binary size, exec-to-listening) and the
//! exposition parser's throughput next to `prometheus-parse`.
use super::{mib, proc_kib, quantile, Opts, Table};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const TARGET_SERVER: &str = "target-server footprint";
pub const PARSER: &str = "Agent-metrics parser throughput";

/// Port target-server serves on in probe pods (prober::podspec::SERVER_PORT).
const PORT: u16 = 8080;

pub fn run(opts: &Opts) -> Vec<Table> {
    vec![target_server(opts), parser(opts)]
}

/// The static binary `scripts/image.sh` builds into its cache (what probe pods run).
fn static_binary() -> Option<PathBuf> {
    let dir = std::env::var_os("FIRSTPACKET_IMAGE_TARGET_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            Some(cache.join("firstpacket/image-target"))
        })?;
    let p = dir.join("x86_64-unknown-linux-gnu/release/target-server");
    p.is_file().then_some(p)
}

/// Whether `pid`'s network namespace has a TCP socket listening on `port`
/// (`/proc/PID/net/tcp{,6}`, state `0A`).
fn listening(pid: u32, port: u16) -> bool {
    let want = format!(":{port:04X} ");
    ["tcp", "tcp6"].iter().any(|f| {
        std::fs::read_to_string(format!("/proc/{pid}/net/{f}"))
            .unwrap_or_default()
            .lines()
            .skip(1)
            .any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && format!("{} ", cols[1]).ends_with(&want) && cols[3] == "0A"
            })
    })
}

/// A network namespace held open by a `sleep` started with `unshare --net`, loopback up;
/// killed on drop.
struct Netns {
    holder: std::process::Child,
}

impl Netns {
    fn new() -> Result<Netns, String> {
        let mut holder = Command::new("unshare")
            .args(["--net", "--", "sleep", "3600"])
            .spawn()
            .map_err(|e| format!("unshare: {e}"))?;
        let pid = holder.id();
        // Wait until `unshare` has exec'd `sleep` in the new netns.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|p| p.ends_with("sleep")) {
            if Instant::now() > deadline {
                let _ = holder.kill();
                return Err("unshare --net sleep did not start".into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let lo = Command::new("nsenter")
            .arg(format!("--net=/proc/{pid}/ns/net"))
            .args(["ip", "link", "set", "lo", "up"])
            .status()
            .map_err(|e| format!("nsenter: {e}"))?;
        let ns = Netns { holder };
        if !lo.success() {
            return Err(format!("ip link set lo up: {lo}"));
        }
        Ok(ns)
    }

    fn path(&self) -> String {
        format!("/proc/{}/ns/net", self.holder.id())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// One start of `bin serve --port 8080` inside `ns` (the child enters it before `exec`,
/// so the time is the binary's own): seconds from `spawn` to the listening socket, and
/// VmRSS (KiB) once listening and after `requests` GETs of `/` from inside the netns,
/// and VmHWM.
fn start_once(
    ns: &Netns,
    bin: &std::path::Path,
    requests: usize,
) -> Result<(f64, u64, u64, u64), String> {
    use std::os::unix::process::CommandExt;
    let netns = std::fs::File::open(ns.path()).map_err(|e| format!("{}: {e}", ns.path()))?;
    let mut cmd = Command::new(bin);
    cmd.args(["serve", "--port", &PORT.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: setns(2) is a plain system call, safe between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(std::io::Error::from)
        });
    }
    // With `pre_exec`, std forks and execs, and `spawn` returns once the child's `execve`
    // succeeded (it waits for its close-on-exec error pipe to close): the clock starts at
    // the exec, not before this process's fork.
    let mut child = cmd.spawn().map_err(|e| format!("{}: {e}", bin.display()))?;
    let t0 = Instant::now();
    let pid = child.id();
    // target-server writes `target-server: listening on ADDR` to stderr right after
    // listen(2): a blocked read wakes when it does (polling /proc from here added ~15 ms
    // of this process's own scheduling to what strace shows, 3–5 ms).
    let stderr = child.stderr.take();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        if let Some(e) = stderr {
            let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(e), &mut line);
        }
        let _ = tx.send((Instant::now(), line));
    });
    let result = (|| {
        let (at, line) = rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| "target-server not listening within 10 s".to_owned())?;
        if !line.contains("listening on") {
            return Err(format!("target-server did not start: {line:?}"));
        }
        if !listening(pid, PORT) {
            return Err("target-server said it listens, /proc/PID/net/tcp disagrees".into());
        }
        let up = at.duration_since(t0).as_secs_f64();
        let idle = proc_kib(pid, "VmRSS").ok_or("process gone")?;
        let script = format!(
            "i=0; while [ $i -lt {requests} ]; do wget -qO- http://127.0.0.1:{PORT}/ >/dev/null || exit 1; i=$((i+1)); done"
        );
        let ok = Command::new("nsenter")
            .arg(format!("--net={}", ns.path()))
            .args(["sh", "-c", &script])
            .status()
            .map_err(|e| format!("nsenter: {e}"))?;
        if !ok.success() {
            return Err(format!("GET / from its netns failed: {ok}"));
        }
        let busy = proc_kib(pid, "VmRSS").ok_or("process gone")?;
        let hwm = proc_kib(pid, "VmHWM").ok_or("process gone")?;
        Ok((up, idle, busy, hwm))
    })();
    let _ = child.kill();
    let _ = child.wait();
    result
}

fn target_server(opts: &Opts) -> Table {
    let mut t = Table::new(
        TARGET_SERVER,
        "Each binary is started `N` times as `target-server serve --port 8080` in a fresh \
         network namespace (made once by `unshare --net`; the child enters it before `exec`). \
         *Exec to listening*: from the child's `execve` (when std's `spawn` returns: it \
         waits for the exec through a close-on-exec pipe) until its `listening on` line \
         (written right after `listen(2)`) reaches a blocked read of its stderr. *RSS*: \
         `VmRSS` once listening and after 200 sequential `GET /` from its namespace \
         (`wget`), and the peak `VmHWM`. *Size*: the file. The static binary is the one \
         `bash scripts/image.sh` builds (glibc, `+crt-static`) and probe pods run; the \
         dynamic one is `target/release/target-server`. Targets: RSS ≤ 5 MiB, start to \
         listening ≤ 20 ms, static binary ≤ 5 MB.",
        &[
            "binary",
            "size MB",
            "starts",
            "exec→listening p50 ms",
            "p95 ms",
            "RSS idle MiB",
            "RSS after 200 GETs MiB",
            "VmHWM MiB",
        ],
    );
    let starts = if opts.smoke { 3 } else { 20 };
    let requests = 200;
    let mut bins = vec![("static (image)", static_binary())];
    bins.push((
        "dynamic (bin dir)",
        Some(crate::common::bin("target-server")),
    ));
    for (label, bin) in bins {
        let Some(bin) = bin else {
            t.row(vec![
                label.into(),
                "not built (bash scripts/image.sh)".into(),
                "0".into(),
                "n/a".into(),
                "n/a".into(),
                "n/a".into(),
                "n/a".into(),
                "n/a".into(),
            ]);
            continue;
        };
        let size = std::fs::metadata(&bin).map_or(0, |m| m.len());
        let mut ups = Vec::new();
        let (mut idle, mut busy, mut hwm) = (0, 0, 0);
        let mut errors = Vec::new();
        let ns = match Netns::new() {
            Ok(ns) => ns,
            Err(e) => panic!("a network namespace for target-server: {e}"),
        };
        for _ in 0..starts {
            match start_once(&ns, &bin, requests) {
                Ok((u, i, b, h)) => {
                    ups.push(u);
                    idle = idle.max(i);
                    busy = busy.max(b);
                    hwm = hwm.max(h);
                }
                Err(e) => errors.push(e),
            }
        }
        if !errors.is_empty() {
            t.notes.push(format!(
                "{label}: {} of {starts} starts failed: {}",
                errors.len(),
                errors[0]
            ));
        }
        // No successful start: empty cells, which the smoke test reports as incomplete.
        let kib = |v: u64| {
            if ups.is_empty() {
                String::new()
            } else {
                mib(v)
            }
        };
        let msq = |q: f64| {
            if ups.is_empty() {
                String::new()
            } else {
                format!("{:.1}", quantile(&ups, q) * 1e3)
            }
        };
        t.row(vec![
            label.into(),
            format!("{:.2}", size as f64 / 1e6),
            ups.len().to_string(),
            msq(0.5),
            msq(0.95),
            kib(idle),
            kib(busy),
            kib(hwm),
        ]);
        if label.starts_with("static") && !ups.is_empty() {
            let verdict = |ok: bool| if ok { "met" } else { "**not met**" };
            t.notes.push(format!(
                "static binary: size {:.2} MB ≤ 5 MB {}; exec→listening p95 {:.1} ms ≤ 20 ms {}; \
                 RSS max {} MiB ≤ 5 MiB {}",
                size as f64 / 1e6,
                verdict(size <= 5_000_000),
                quantile(&ups, 0.95) * 1e3,
                verdict(quantile(&ups, 0.95) <= 0.020),
                mib(busy.max(hwm)),
                verdict(busy.max(hwm) <= 5 * 1024),
            ));
        }
    }
    t
}

/// The parser's MB/s next to `prometheus-parse`: from `cargo bench -p prober --bench
/// expo`'s output when the script passed it; in the smoke run, measured here on the
/// Felix 3.20 fixture page in the test profile (labelled so; not comparable with the
/// 100 MB/s target, which is for the release build).
fn parser(opts: &Opts) -> Table {
    let mut t = Table::new(
        PARSER,
        "`cargo bench -p prober --bench expo` (release): a ~1 MB Felix-like page (every \
         family of a real Felix 3.20 page, repeated with distinct `endpoint` labels) parsed \
         for ≥ 2 s by firstpacket's exposition parser and by `prometheus-parse` 0.2 in the \
         same run. Target: ≥ 100 MB/s.",
        &["parser", "MB/s", "source"],
    );
    if let Some(out) = &opts.parser_output {
        let mbs = |prefix: &str| {
            out.lines().find(|l| l.starts_with(prefix)).and_then(|l| {
                l[prefix.len()..]
                    .split_whitespace()
                    .next()
                    .map(str::to_owned)
            })
        };
        let ours = mbs("prober::agents::expo::parse");
        let theirs = mbs("prometheus-parse 0.2 Scrape::parse");
        t.row(vec![
            "firstpacket (prober::agents::expo)".into(),
            ours.clone()
                .unwrap_or_else(|| "n/a (not in the expo output)".into()),
            "cargo bench -p prober --bench expo".into(),
        ]);
        t.row(vec![
            "prometheus-parse 0.2".into(),
            theirs.unwrap_or_else(|| "n/a (not in the expo output)".into()),
            "cargo bench -p prober --bench expo".into(),
        ]);
        if let Some(v) = ours.and_then(|v| v.parse::<f64>().ok()) {
            t.notes.push(format!(
                "{v:.0} MB/s ≥ 100 MB/s: {}",
                if v >= 100.0 { "met" } else { "**not met**" }
            ));
        }
        return t;
    }
    let page = std::fs::read_to_string(crate::common::repo_file(
        "prober/tests/fixtures/felix-3.20-1.prom",
    ))
    .expect("Felix fixture");
    let budget = Duration::from_millis(300);
    let measure = |f: &dyn Fn() -> usize| {
        let start = Instant::now();
        let mut runs = 0usize;
        while start.elapsed() < budget {
            std::hint::black_box(f());
            runs += 1;
        }
        (page.len() * runs) as f64 / start.elapsed().as_secs_f64() / 1e6
    };
    let ours = measure(&|| prober::agents::expo::parse(&page).map_or(0, |p| p.sample_count()));
    let theirs = measure(&|| {
        prometheus_parse::Scrape::parse(page.lines().map(|l| Ok(l.to_owned())))
            .map_or(0, |s| s.samples.len())
    });
    let src = "smoke: Felix 3.20 fixture page, this test's profile (not the release numbers)";
    t.row(vec![
        "firstpacket (prober::agents::expo)".into(),
        format!("{ours:.1}"),
        src.into(),
    ]);
    t.row(vec![
        "prometheus-parse 0.2".into(),
        format!("{theirs:.1}"),
        src.into(),
    ]);
    t
}

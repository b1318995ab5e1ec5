//! `prober gate` when the run fails at start-up (after the flags were parsed): exit 2
//! with a clear message, and still the `--report` artifact a CI pipeline expects
//! (verdict `inconclusive`, exit code 2, `errors[]` naming the API URL and the cause, no
//! probes), valid against the shared JSON Schema. With `--log-format json` every stderr
//! line is one JSON object. No cluster needed: the kubeconfig points at a closed port,
//! or at a tiny HTTP server that answers every request 403 like missing RBAC.

use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A temp dir of this test, removed when dropped, a failing assertion included
/// (`tempfile::TempDir`).
fn tmp(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("fp-startup-{name}-"))
        .tempdir()
        .expect("temp dir")
}

fn kubeconfig(dir: &Path, server: &str) -> PathBuf {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: {server}
    insecure-skip-tls-verify: true
users:
- name: u
  user:
    token: t
contexts:
- name: x
  context:
    cluster: c
    user: u
current-context: x
"
    );
    std::fs::write(&path, text).expect("kubeconfig");
    path
}

/// A port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// An HTTP server answering every request `403 Forbidden` with a Kubernetes `Status`.
fn forbidding_server() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut c) = conn else { continue };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match c.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let body = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"nodes is forbidden: User \"system:serviceaccount:ci:gate\" cannot list resource \"nodes\" in API group \"\" at the cluster scope","reason":"Forbidden","details":{"kind":"nodes"},"code":403}"#;
            let _ = write!(
                c,
                "HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

fn gate(kubeconfig: &Path, report: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_prober"))
        .arg("gate")
        .arg("--report")
        .arg(report)
        .args(extra)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env_remove("RUST_LOG")
        .output()
        .expect("run prober")
}

/// Reads the report and checks it against the JSON Schema and the start-up failure
/// shape; returns it.
fn checked_report(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no report at {}: {e}", path.display()));
    let value: Value = serde_json::from_str(&text).expect("report is JSON");
    let schema: Value =
        serde_json::from_str(firstpacket_report::GATE_REPORT_SCHEMA).expect("schema json");
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "schema violations: {errors:#?}");
    assert_eq!(value["verdict"], "inconclusive");
    assert_eq!(value["exit_code"], 2);
    assert_eq!(value["probes"], Value::Array(vec![]));
    assert_eq!(value["summary"]["diagnosis"], "inconclusive");
    value
}

#[test]
fn unreachable_api_still_writes_an_inconclusive_report_and_json_logs() {
    let tmpdir = tmp("closed");
    let dir = tmpdir.path();
    let port = closed_port();
    let url = format!("https://127.0.0.1:{port}");
    let kc = kubeconfig(dir, &url);
    let report = dir.join("report.json");
    let out = gate(&kc, &report, &["--log-format", "json", "--seed", "7"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr:\n{stderr}");
    let v = checked_report(&report);
    let err = v["errors"][0].as_str().expect("errors[0]");
    assert!(err.contains(&url), "{err}");
    assert!(err.contains("list nodes"), "{err}");
    assert!(err.to_lowercase().contains("refused"), "{err}");
    assert_eq!(v["errors"].as_array().map(Vec::len), Some(1));

    // Every stderr line is one JSON object; the seed and the error are among them.
    let lines: Vec<Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect();
    assert!(lines.iter().all(Value::is_object));
    assert!(
        lines.iter().any(|l| l["fields"]["seed"] == 7),
        "seed event: {stderr}"
    );
    let error = lines
        .iter()
        .find(|l| l["level"] == "ERROR")
        .expect("error event");
    assert_eq!(error["fields"]["reason"], "api_unreachable");
    assert!(
        error["fields"]["error"]
            .as_str()
            .is_some_and(|e| e.contains(&url)),
        "{error}"
    );
    assert!(
        lines.iter().any(|l| l["fields"]["path"]
            .as_str()
            .is_some_and(|p| p.ends_with("report.json"))),
        "report-written event: {stderr}"
    );
    assert!(out.stdout.is_empty(), "stdout is for results only");
}

#[test]
fn unreachable_api_in_plain_format_keeps_the_plain_error_line() {
    let tmpdir = tmp("plain");
    let dir = tmpdir.path();
    let port = closed_port();
    let kc = kubeconfig(dir, &format!("https://127.0.0.1:{port}"));
    let report = dir.join("report.json");
    let out = gate(&kc, &report, &["--seed", "7"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr:\n{stderr}");
    assert!(
        stderr.contains("firstpacket gate gate-") && stderr.contains("seed 7"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "error: cannot reach the Kubernetes API at https://127.0.0.1:{port}/"
        )),
        "{stderr}"
    );
    checked_report(&report);
}

#[test]
fn forbidden_first_list_still_writes_the_report() {
    let tmpdir = tmp("forbidden");
    let dir = tmpdir.path();
    let port = forbidding_server();
    let url = format!("http://127.0.0.1:{port}");
    let kc = kubeconfig(dir, &url);
    let report = dir.join("report.json");
    let out = gate(&kc, &report, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr:\n{stderr}");
    assert!(stderr.contains("HTTP 403 Forbidden"), "{stderr}");
    let v = checked_report(&report);
    let err = v["errors"][0].as_str().expect("errors[0]");
    assert!(err.contains(&url), "{err}");
    assert!(err.contains("list nodes") && err.contains("403"), "{err}");
}

#[test]
fn dry_run_failure_writes_no_report() {
    let tmpdir = tmp("dry");
    let dir = tmpdir.path();
    let port = closed_port();
    let kc = kubeconfig(dir, &format!("https://127.0.0.1:{port}"));
    let report = dir.join("report.json");
    let out = gate(&kc, &report, &["--dry-run"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(!report.exists(), "--dry-run writes nothing");
}

#[test]
fn kubeconfig_and_context_flags_pick_the_file_and_context() {
    let tmpdir = tmp("flags");
    let dir = tmpdir.path();
    let a = closed_port();
    let b = loop {
        let b = closed_port();
        if b != a {
            break b;
        }
    };
    let kc = kubeconfig(dir, &format!("https://127.0.0.1:{a}"));
    // A second context in the same file, pointing at another (closed) API address.
    let other = format!("https://127.0.0.1:{b}");
    let two = std::fs::read_to_string(&kc)
        .expect("kubeconfig")
        .replace(
            "clusters:\n",
            &format!("clusters:\n- name: c2\n  cluster:\n    server: {other}\n    insecure-skip-tls-verify: true\n"),
        )
        .replace(
            "contexts:\n",
            "contexts:\n- name: other\n  context:\n    cluster: c2\n    user: u\n",
        );
    let file = dir.join("two-contexts");
    std::fs::write(&file, two).expect("write kubeconfig");
    let nowhere = dir.join("no-such-kubeconfig");
    let report = dir.join("report.json");

    // --kubeconfig wins over KUBECONFIG; --context over current-context.
    let file_arg = file.to_string_lossy().into_owned();
    let out = gate(
        &nowhere,
        &report,
        &["--kubeconfig", &file_arg, "--context", "other"],
    );
    assert_eq!(out.status.code(), Some(2));
    let v = checked_report(&report);
    let err = v["errors"][0].as_str().expect("errors[0]");
    assert!(err.contains(&other), "{err}");

    // Without --context the file's current-context is used.
    let out = gate(&nowhere, &report, &["--kubeconfig", &file_arg]);
    assert_eq!(out.status.code(), Some(2));
    let v = checked_report(&report);
    let err = v["errors"][0].as_str().expect("errors[0]");
    assert!(err.contains(&format!("127.0.0.1:{a}")), "{err}");

    // A missing file or an unknown context is a clear start-up error naming it.
    let missing = nowhere.to_string_lossy().into_owned();
    let out = gate(&file, &report, &["--kubeconfig", &missing]);
    assert_eq!(out.status.code(), Some(2));
    let err = checked_report(&report)["errors"][0].to_string();
    assert!(err.contains("no-such-kubeconfig"), "{err}");
    let out = gate(&file, &report, &["--context", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    let err = checked_report(&report)["errors"][0].to_string();
    assert!(err.contains("nope"), "{err}");
}

//! Installing firstpacket as users do, on the real control plane (etcd, kube-apiserver,
//! kube-scheduler, kube-controller-manager; `bash scripts/control-plane.sh`), with
//! `helm` built by `bash scripts/helm.sh` and the prometheus-operator CRDs fetched by
//! `bash scripts/prometheus-operator-crds.sh` (`.ci/run` runs all three first):
//!
//! - `chart_lints_and_renders_the_continuous_overlay`: `helm lint`, and `helm template`
//!   with default values renders the objects of `kubectl kustomize
//!   manifests/overlays/continuous` after the normalisation `docs/src/install.md` "Helm
//!   chart" documents, and with `rbac.leastPrivilege=true` those of the overlay with
//!   `manifests/components/least-privilege` (no testbed).
//! - `kustomize_helm_and_the_gate_job_on_the_real_control_plane`: one testbed running
//!   the OCI images `scripts/image.sh` built (`--image-dir`), in steps:
//!   `kubectl apply -k manifests/overlays/continuous` gives two Ready replicas of the
//!   built prober image, one leader, probes running and metrics served (through the API
//!   server's pod proxy and the Service's named port); a server-side dry-run of every
//!   object each overlay and the chart render (ServiceMonitor and PrometheusRule against
//!   the CRDs); `helm install --set rbac.leastPrivilege=true` in another namespace gives
//!   a Ready, probing leader too (`kubectl auth can-i` checked); the CI
//!   recipe (`ci-examples/`: GitHub Actions and GitLab CI, the same commands) run
//!   against the testbed with a CNI agent rollout as the upgrade and
//!   `FIRSTPACKET_IMAGE_REGISTRY` naming a registry on loopback holding both images (the
//!   runner's prober taken out of the prober image, the Job and the probe pods pulled
//!   from it); `scripts/gate-job.sh` on S4 exits 1 with the cross-node failures, with a
//!   missing probe image exits 2, with a missing prober image exits 2, with its pod
//!   refused by Pod Security admission or unschedulable exits 2 within seconds quoting
//!   why; the gate Job with the least-privilege component passes, `kubectl auth can-i`
//!   saying what that RBAC no longer allows.
//! - `config_map_env_reaches_the_container_as_the_kubelet_gives_it`: the testbed
//!   kubelet's env from ConfigMaps (what the gate Job's thresholds use), on either control plane.
mod common;

use common::{poll_until, repo_file, Testbed, SERIAL};
use serde::Deserialize;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Labels the chart adds to what the kustomize manifests carry (Helm's bookkeeping);
/// the normalisation drops them before comparing.
const CHART_ONLY_LABELS: [&str; 3] = [
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
];

/// The path a `scripts/*.sh --print` names (the cached tool), if it exists.
fn cached_tool(script: &str) -> Option<PathBuf> {
    let out = Command::new("bash")
        .arg(repo_file(script))
        .arg("--print")
        .output()
        .ok()?;
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    p.exists().then_some(p)
}

fn helm_bin() -> Option<PathBuf> {
    let h = cached_tool("scripts/helm.sh");
    if h.is_none() {
        eprintln!("SKIPPED: helm is not built (bash scripts/helm.sh)");
    }
    h
}

/// stdout of a command on the host; panics with its stderr unless it exits 0.
fn run_ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every non-empty document of a multi-document YAML text, as JSON values.
fn yaml_docs(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("YAML: {e}\n{text}")))
        .filter(|v| !v.is_null())
        .collect()
}

/// `kubectl kustomize manifests/overlays/NAME`.
fn render_overlay(name: &str) -> String {
    run_ok(
        Command::new("kubectl")
            .arg("kustomize")
            .arg(repo_file(&format!("manifests/overlays/{name}"))),
    )
}

/// `kubectl kustomize` of a kustomization in a temporary directory: the overlay
/// `manifests/overlays/OVERLAY` with the component `manifests/components/COMPONENT`.
fn render_with_component(overlay: &str, component: &str) -> String {
    let dir = std::env::temp_dir().join(format!(
        "fp-render-{}-{}",
        std::process::id(),
        common::rand_suffix()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let manifests = repo_file("manifests").canonicalize().expect("manifests");
    let up = "../".repeat(dir.canonicalize().expect("temp dir").components().count() - 1);
    let m = format!(
        "{up}{}",
        manifests.display().to_string().trim_start_matches('/')
    );
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "resources:\n- {m}/overlays/{overlay}\ncomponents:\n- {m}/components/{component}\n"
        ),
    )
    .expect("kustomization");
    let out = run_ok(Command::new("kubectl").arg("kustomize").arg(&dir));
    let _ = std::fs::remove_dir_all(&dir);
    out
}

/// `helm template RELEASE manifests/helm/firstpacket -n NAMESPACE --set …`.
fn helm_template(helm: &Path, release: &str, namespace: &str, sets: &[&str]) -> String {
    let mut c = Command::new(helm);
    c.args(["template", release])
        .arg(repo_file("manifests/helm/firstpacket"))
        .args(["-n", namespace]);
    for s in sets {
        c.args(["--set", s]);
    }
    run_ok(&mut c)
}

/// The documented normalisation (`docs/src/install.md` "Helm chart"): the Namespace object left out
/// (Helm does not create the release namespace), the labels of [`CHART_ONLY_LABELS`]
/// dropped (an emptied `labels` map with them), objects sorted by kind, namespace, name.
fn normalise(objects: Vec<Value>) -> Vec<Value> {
    let mut v: Vec<Value> = objects
        .into_iter()
        .filter(|o| o["kind"] != "Namespace")
        .map(|mut o| {
            if let Some(md) = o["metadata"].as_object_mut() {
                if let Some(labels) = md.get_mut("labels").and_then(Value::as_object_mut) {
                    for l in CHART_ONLY_LABELS {
                        labels.remove(l);
                    }
                    if labels.is_empty() {
                        md.remove("labels");
                    }
                }
            }
            o
        })
        .collect();
    let key = |o: &Value| {
        (
            o["kind"].as_str().unwrap_or_default().to_owned(),
            o["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        )
    };
    v.sort_by_key(key);
    v
}

/// `kind/namespace/name` of each object, for messages.
fn names(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .map(|o| {
            format!(
                "{}/{}/{}",
                o["kind"].as_str().unwrap_or_default(),
                o["metadata"]["namespace"].as_str().unwrap_or("-"),
                o["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

/// The first object that differs between two normalised renderings, for the message.
fn first_difference(a: &[Value], b: &[Value]) -> String {
    if a.len() != b.len() {
        return format!("{:?}\nvs\n{:?}", names(a), names(b));
    }
    a.iter()
        .zip(b)
        .find(|(x, y)| x != y)
        .map(|(x, y)| format!("{x:#}\nvs\n{y:#}"))
        .unwrap_or_default()
}

#[test]
fn chart_lints_and_renders_the_continuous_overlay() {
    let Some(helm) = helm_bin() else {
        return;
    };
    let lint = run_ok(
        Command::new(&helm)
            .arg("lint")
            .arg(repo_file("manifests/helm/firstpacket")),
    );
    assert!(lint.contains("0 chart(s) failed"), "{lint}");

    let overlay = normalise(yaml_docs(&render_overlay("continuous")));
    let chart = normalise(yaml_docs(&helm_template(
        &helm,
        "firstpacket",
        "firstpacket",
        &[],
    )));
    assert!(
        overlay.len() >= 10,
        "the overlay rendered too little: {:?}",
        names(&overlay)
    );
    assert!(
        overlay == chart,
        "helm template (default values) and kubectl kustomize manifests/overlays/continuous differ after normalisation:\n{}",
        first_difference(&overlay, &chart)
    );
    // The comparison sees a difference in values (it can fail).
    let three = normalise(yaml_docs(&helm_template(
        &helm,
        "firstpacket",
        "firstpacket",
        &["replicas=3"],
    )));
    assert!(three != overlay, "replicas=3 rendered the same objects");

    // rbac.leastPrivilege renders the continuous overlay with the least-privilege
    // component (no pods/proxy, pods read in the release namespace only), and
    // rbac.agentNamespaces adds the same RoleBinding in each agent namespace.
    let least = normalise(yaml_docs(&render_with_component(
        "continuous",
        "least-privilege",
    )));
    let chart_least = normalise(yaml_docs(&helm_template(
        &helm,
        "firstpacket",
        "firstpacket",
        &["rbac.leastPrivilege=true"],
    )));
    assert!(
        least == chart_least,
        "helm template --set rbac.leastPrivilege=true and the continuous overlay with components/least-privilege differ:\n{}",
        first_difference(&least, &chart_least)
    );
    assert!(
        !names(&least)
            .iter()
            .any(|n| n.starts_with("ClusterRoleBinding/-/firstpacket-pods-read")),
        "least privilege still binds pods cluster-wide: {:?}",
        names(&least)
    );
    // No `get pods/proxy` (agent metrics through the API server) anywhere; the one
    // pods/proxy rule left is the probe namespace's `create` (policy_change's marks).
    let proxy_rules: Vec<(String, Value)> = least
        .iter()
        .flat_map(|d| {
            let who = format!(
                "{}/{}",
                d["kind"].as_str().unwrap_or("?"),
                d["metadata"]["name"].as_str().unwrap_or("?")
            );
            d["rules"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|r| {
                    r["resources"]
                        .as_array()
                        .is_some_and(|rs| rs.iter().any(|x| x == "pods/proxy"))
                })
                .map(move |r| (who.clone(), r))
        })
        .collect();
    assert_eq!(
        proxy_rules
            .iter()
            .map(|(w, r)| (w.as_str(), r["verbs"].clone()))
            .collect::<Vec<_>>(),
        [("Role/firstpacket-probes", serde_json::json!(["create"]))],
        "least privilege grants pods/proxy beyond create in the probe namespace: {proxy_rules:?}"
    );
    let with_agents = yaml_docs(&helm_template(
        &helm,
        "firstpacket",
        "firstpacket",
        &[
            "rbac.leastPrivilege=true",
            "rbac.agentNamespaces={kube-system}",
        ],
    ));
    let bindings: Vec<String> = names(&with_agents)
        .into_iter()
        .filter(|n| n.starts_with("RoleBinding/") && n.ends_with("/firstpacket-pods-read"))
        .collect();
    assert_eq!(
        bindings,
        [
            "RoleBinding/firstpacket/firstpacket-pods-read",
            "RoleBinding/kube-system/firstpacket-pods-read"
        ],
        "rbac.agentNamespaces"
    );

    // The ServiceMonitor toggle renders the prometheus-operator overlay's ServiceMonitor.
    let monitor = |objects: Vec<Value>| {
        normalise(objects)
            .into_iter()
            .filter(|o| o["kind"] == "ServiceMonitor")
            .collect::<Vec<_>>()
    };
    let from_overlay = monitor(yaml_docs(&render_overlay("prometheus-operator")));
    let from_chart = monitor(yaml_docs(&helm_template(
        &helm,
        "firstpacket",
        "firstpacket",
        &["serviceMonitor.enabled=true"],
    )));
    assert_eq!(from_overlay.len(), 1, "{:?}", names(&from_overlay));
    assert!(
        from_overlay == from_chart,
        "ServiceMonitor differs:\n{}",
        first_difference(&from_overlay, &from_chart)
    );

    // The PrometheusRule toggle reads files/firstpacket.rules.yaml: rendered with the
    // thresholds from values when the file is there, a clear error when it is not.
    let rules = repo_file("manifests/helm/firstpacket/files/firstpacket.rules.yaml");
    let mut c = Command::new(&helm);
    c.args(["template", "firstpacket"])
        .arg(repo_file("manifests/helm/firstpacket"))
        .args(["--set", "prometheusRule.enabled=true"]);
    let out = c.output().expect("helm template");
    if rules.is_file() {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        let rule = yaml_docs(&text)
            .into_iter()
            .find(|o| o["kind"] == "PrometheusRule");
        assert!(rule.is_some(), "no PrometheusRule rendered:\n{text}");
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("files/firstpacket.rules.yaml"),
            "prometheusRule.enabled without the rules file: {err}"
        );
        eprintln!("note: no manifests/helm/firstpacket/files/firstpacket.rules.yaml yet: the PrometheusRule toggle was checked to refuse clearly");
    }
}

// ---------------------------------------------------------------------------------------
// On the real control plane.

fn json(tb: &Testbed, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.extend(["-o", "json"]);
    let out = tb.kubectl(&a);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("kubectl {args:?}: {e}: {out}"))
}

/// Names of the Ready pods (not being deleted) matching `selector` in `ns`.
fn ready_pods(tb: &Testbed, ns: &str, selector: &str) -> Vec<String> {
    let list = json(tb, &["get", "pods", "-n", ns, "-l", selector]);
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter(|p| {
            p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .collect()
}

/// A path through the API server (`kubectl get --raw`), `None` when it fails.
fn raw(tb: &Testbed, path: &str) -> Option<String> {
    let out = tb.exec(&["kubectl", "get", "--raw", path]);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Sum of the samples of metric family `name` on an exposition page (`None`: absent).
fn metric(page: &str, name: &str) -> Option<f64> {
    let mut seen = false;
    let sum = page
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let family = series.split('{').next()?;
            (family == name).then(|| value.parse::<f64>().ok())?
        })
        .inspect(|_| seen = true)
        .sum();
    seen.then_some(sum)
}

/// The Ready replicas of a `prober run` install in `ns` (two of them), the leader among
/// them (the Lease's holder, whose /metrics says `firstpacket_leader 1` while the other
/// says 0, read through the API server's pod proxy), and probes running on it
/// (`firstpacket_probes_in_flight` or `firstpacket_probes_total` above 0).
fn assert_ready_leader_probing(tb: &Testbed, ns: &str, selector: &str) -> String {
    let pods = poll_until(
        Duration::from_secs(120),
        || ready_pods(tb, ns, selector),
        |p| p.len() == 2,
    );
    assert_eq!(
        pods.len(),
        2,
        "not 2 Ready prober pods in {ns}: {:#}",
        json(tb, &["get", "pods", "-n", ns])
    );
    let holder = tb.kubectl_until(
        &[
            "get",
            "lease",
            "firstpacket-leader",
            "-n",
            ns,
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ],
        Duration::from_secs(60),
        |h| pods.iter().any(|p| p == h.trim()),
    );
    let holder = holder.trim().to_owned();
    assert!(
        pods.contains(&holder),
        "Lease holder {holder:?}, pods {pods:?}"
    );
    let page = |pod: &str| {
        raw(
            tb,
            &format!("/api/v1/namespaces/{ns}/pods/{pod}:9090/proxy/metrics"),
        )
    };
    let leaders = poll_until(
        Duration::from_secs(30),
        || {
            pods.iter()
                .map(|p| {
                    (
                        p.clone(),
                        page(p).and_then(|m| metric(&m, "firstpacket_leader")),
                    )
                })
                .collect::<Vec<_>>()
        },
        |l| {
            l.iter()
                .all(|(p, v)| *v == Some(if *p == holder { 1.0 } else { 0.0 }))
        },
    );
    for (p, v) in &leaders {
        let want = if *p == holder { 1.0 } else { 0.0 };
        assert_eq!(
            *v,
            Some(want),
            "firstpacket_leader of {p} (holder {holder})"
        );
    }
    let probing = poll_until(
        Duration::from_secs(60),
        || page(&holder).unwrap_or_default(),
        |m| {
            metric(m, "firstpacket_probes_in_flight").unwrap_or(0.0) > 0.0
                || metric(m, "firstpacket_probes_total").unwrap_or(0.0) > 0.0
        },
    );
    assert!(
        metric(&probing, "firstpacket_probes_in_flight").unwrap_or(0.0) > 0.0
            || metric(&probing, "firstpacket_probes_total").unwrap_or(0.0) > 0.0,
        "the leader {holder} is not probing:\n{probing}"
    );
    holder
}

/// `kubectl apply --dry-run=server -f FILE` of a rendering: every object accepted.
fn dry_run(tb: &Testbed, what: &str, text: &str) {
    let objects = yaml_docs(text);
    let file = tb.manifest(&format!("dry-run-{what}.yaml"), text);
    let out = tb.kubectl(&["apply", "--dry-run=server", "-f", &file]);
    let accepted = out
        .lines()
        .filter(|l| l.contains("(server dry run)"))
        .count();
    assert_eq!(
        accepted,
        objects.len(),
        "server-side dry-run of {what}: {out}\nobjects: {:?}",
        names(&objects)
    );
    eprintln!("dry-run {what}: {accepted} objects accepted");
}

/// The commands of the CI recipes, per step: from the GitHub Actions workflow
/// `ci-examples/github-actions.yml` (every `run:` of the job's steps) and the GitLab CI
/// job `ci-examples/gitlab-ci.yml` (`before_script` + `script`). Both must list the same
/// commands but the GitHub one that writes the kubeconfig from a secret.
fn ci_example_commands() -> Vec<String> {
    let read = |f: &str| -> Value {
        let text = std::fs::read_to_string(repo_file(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{f}: {e}"))
    };
    let gh = read("ci-examples/github-actions.yml");
    let gl = read("ci-examples/gitlab-ci.yml");
    let gh_cmds: Vec<String> = gh["jobs"]
        .as_object()
        .and_then(|j| j.values().next())
        .and_then(|j| j["steps"].as_array())
        .expect("jobs.*.steps")
        .iter()
        .filter_map(|s| s["run"].as_str().map(|r| r.trim().to_owned()))
        .collect();
    let job = gl
        .as_object()
        .and_then(|o| o.values().find(|j| j["script"].is_array()))
        .expect("a GitLab job with script:");
    let gl_cmds: Vec<String> = ["before_script", "script"]
        .iter()
        .flat_map(|k| job[*k].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c.as_str().map(|c| c.trim().to_owned()))
        .collect();
    // GitHub writes the kubeconfig from a secret; GitLab's is a File variable.
    let gh_cmds: Vec<String> = gh_cmds
        .into_iter()
        .filter(|c| !c.contains("KUBECONFIG_DATA"))
        .collect();
    assert_eq!(
        gh_cmds, gl_cmds,
        "ci-examples/github-actions.yml and gitlab-ci.yml run different commands"
    );
    gh_cmds
}

/// `crane registry serve` on the machine's loopback (where the testbed's kubelets pull
/// `127.0.0.1:PORT/…` images from; a free port) with both built images pushed as
/// `127.0.0.1:PORT/firstpacket/NAME:VERSION` (what a user does with `crane push`),
/// killed on drop; as `testbed/tests/e2e_images.rs` serves one.
struct Registry {
    child: std::process::Child,
    /// `127.0.0.1:PORT/firstpacket`: what `FIRSTPACKET_IMAGE_REGISTRY` names.
    prefix: String,
    log: PathBuf,
}

impl Registry {
    fn start(crane: &Path, images: &Path) -> Registry {
        let log = std::env::temp_dir().join(format!(
            "fp-install-registry-{}-{}.log",
            std::process::id(),
            common::rand_suffix()
        ));
        let child = Command::new(crane)
            .args(["registry", "serve", "--address", "127.0.0.1:0"])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).expect("registry log"))
            .spawn()
            .expect("start crane registry serve");
        let mut reg = Registry {
            child,
            prefix: String::new(),
            log,
        };
        let port = poll_until(
            Duration::from_secs(10),
            || {
                std::fs::read_to_string(&reg.log)
                    .unwrap_or_default()
                    .split("serving on port ")
                    .nth(1)
                    .and_then(|r| r.split_whitespace().next())
                    .map(str::to_owned)
            },
            Option::is_some,
        )
        .expect("crane registry serve did not report its port");
        reg.prefix = format!("127.0.0.1:{port}/firstpacket");
        for name in ["prober", "target-server"] {
            run_ok(
                Command::new(crane)
                    .arg("push")
                    .arg(images.join(name))
                    .arg(format!(
                        "{}/{name}:{}",
                        reg.prefix,
                        env!("CARGO_PKG_VERSION")
                    )),
            );
        }
        reg
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A kustomization in the state dir on top of manifests/overlays/gate (kustomize wants a
/// relative path to it) with `config` added to the ConfigMap `firstpacket-gate` and
/// `extra` appended (e.g. an `images:` entry), `MANIFESTS` in it replaced by the
/// relative path to manifests/ (e.g. for a component). Returns its directory.
fn gate_overlay(tb: &Testbed, name: &str, config: &[(&str, &str)], extra: &str) -> PathBuf {
    let dir = tb.state.join(format!("overlay-{name}"));
    std::fs::create_dir_all(&dir).expect("overlay dir");
    let manifests = repo_file("manifests").canonicalize().expect("manifests");
    let dir_abs = dir.canonicalize().expect("overlay dir");
    let up = "../".repeat(dir_abs.components().count() - 1);
    let manifests = format!(
        "{up}{}",
        manifests.display().to_string().trim_start_matches('/')
    );
    let rel = format!("{manifests}/overlays/gate");
    let extra = extra.replace("MANIFESTS", &manifests);
    let data: String = config
        .iter()
        .map(|(k, v)| format!("      {k}: \"{v}\"\n"))
        .collect();
    let patch = if config.is_empty() {
        String::new()
    } else {
        format!("patches:\n- patch: |-\n    apiVersion: v1\n    kind: ConfigMap\n    metadata: {{name: firstpacket-gate, namespace: firstpacket}}\n    data:\n{data}")
    };
    let text = format!("resources:\n- {rel}\n{patch}{extra}");
    std::fs::write(dir.join("kustomization.yaml"), text).expect("kustomization");
    dir
}

/// `bash scripts/gate-job.sh ARGS…` against the testbed: (exit code, stdout, stderr).
fn gate_job(tb: &Testbed, cwd: &Path, args: &[&str]) -> (i32, String, String) {
    let script = repo_file("scripts/gate-job.sh");
    let mut cmd = format!("cd '{}' && bash '{}'", cwd.display(), script.display());
    for a in args {
        cmd.push_str(&format!(" '{a}'"));
    }
    let out = tb.exec(&["bash", "-c", &cmd]);
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    eprintln!("gate-job.sh {args:?}: exit {:?}\n{e}", out.status.code());
    (out.status.code().unwrap_or(-1), o, e)
}

/// The condition type (`Complete` or `Failed`) the Job controller gave Job
/// `firstpacket/firstpacket-gate` once it finished (polled: it follows the pod).
fn job_outcome(tb: &Testbed) -> String {
    tb.kubectl_until(
        &[
            "get",
            "job",
            "firstpacket-gate",
            "-n",
            "firstpacket",
            "-o",
            "jsonpath={range .status.conditions[?(@.status==\"True\")]}{.type}{\"\\n\"}{end}",
        ],
        Duration::from_secs(30),
        |c| c.lines().any(|t| t == "Complete" || t == "Failed"),
    )
    .lines()
    .find(|t| *t == "Complete" || *t == "Failed")
    .unwrap_or_default()
    .to_owned()
}

/// `spec.suspend` of Job `firstpacket/firstpacket-gate` (`true` once gate-job.sh gave up
/// on a pod that never started).
fn job_suspended(tb: &Testbed) -> String {
    tb.kubectl(&[
        "get",
        "job",
        "firstpacket-gate",
        "-n",
        "firstpacket",
        "-o",
        "jsonpath={.spec.suspend}",
    ])
    .trim()
    .to_owned()
}

fn read_report(path: &Path, ctx: &str) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{ctx}: no report {} ({e})", path.display()));
    let v: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{ctx}: report {}: {e}\n{text}", path.display()));
    common::validate(&v);
    v
}

#[test]
fn kustomize_helm_and_the_gate_job_on_the_real_control_plane() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(helm) = helm_bin() else {
        return;
    };
    let s1 = std::fs::read_to_string(repo_file("testbed/faults/s1-healthy.yaml")).expect("S1");
    // The images `scripts/image.sh` built: the Deployment, the chart and the gate Job
    // run the OCI images the manifests name (not the binary-name fallback).
    let images = common::built_image_dir();
    let images = images.to_str().expect("image dir");
    let Some(tb) = Testbed::up_real("install", 3, &s1, &["--image-dir", images]) else {
        return;
    };
    let t0 = Instant::now();
    let step = |name: &str| eprintln!("== {name} (at {:.1}s)", t0.elapsed().as_secs_f64());

    // 1. The continuous overlay, as users apply it.
    step("kubectl apply -k manifests/overlays/continuous");
    let continuous = repo_file("manifests/overlays/continuous");
    tb.kubectl(&["apply", "-k", continuous.to_str().expect("path")]);
    let selector = "app.kubernetes.io/name=firstpacket-prober";
    let leader = assert_ready_leader_probing(&tb, "firstpacket", selector);
    eprintln!("leader {leader}");
    // The replicas run the prober image the build made (the testbed kubelet reports
    // `imageID` as the image's name with its manifest digest).
    let digest = common::built_image_digest(Path::new(images), "prober");
    let pods = json(&tb, &["get", "pods", "-n", "firstpacket", "-l", selector]);
    for p in pods["items"].as_array().expect("items") {
        let id = p["status"]["containerStatuses"][0]["imageID"]
            .as_str()
            .unwrap_or_default();
        assert!(
            id.ends_with(&format!("@{digest}")),
            "{}: imageID {id:?}, built prober image {digest}",
            p["metadata"]["name"]
        );
    }
    // The Service's named port reaches the admin server of both replicas.
    let slices = json(
        &tb,
        &[
            "get",
            "endpointslices",
            "-n",
            "firstpacket",
            "-l",
            "kubernetes.io/service-name=firstpacket",
        ],
    );
    let ready_endpoints: usize = slices["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| {
            s["ports"].as_array().is_some_and(|p| {
                p.iter()
                    .any(|p| p["name"] == "metrics" && p["port"] == 9090)
            })
        })
        .map(|s| {
            s["endpoints"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|e| e["conditions"]["ready"] == true)
                .count()
        })
        .sum();
    assert_eq!(
        ready_endpoints, 2,
        "EndpointSlices of Service firstpacket: {slices:#}"
    );
    let via_service = raw(
        &tb,
        "/api/v1/namespaces/firstpacket/services/firstpacket:metrics/proxy/metrics",
    )
    .unwrap_or_default();
    assert!(
        metric(&via_service, "firstpacket_leader").is_some(),
        "no firstpacket_leader through the Service's metrics port:\n{via_service}"
    );

    // 2. Server-side dry-run of every rendered object (the CRDs first).
    step("server-side dry-run of every rendering");
    let crds = cached_tool("scripts/prometheus-operator-crds.sh");
    match &crds {
        Some(dir) => {
            for kind in ["servicemonitors", "prometheusrules"] {
                let f = dir.join(format!("monitoring.coreos.com_{kind}.yaml"));
                tb.kubectl(&["apply", "--server-side", "-f", f.to_str().expect("path")]);
            }
            tb.kubectl(&[
                "wait",
                "--for",
                "condition=established",
                "--timeout",
                "60s",
                "crd/servicemonitors.monitoring.coreos.com",
                "crd/prometheusrules.monitoring.coreos.com",
            ]);
        }
        None => eprintln!(
            "SKIPPED: ServiceMonitor/PrometheusRule dry-runs: no CRDs (bash scripts/prometheus-operator-crds.sh)"
        ),
    }
    dry_run(&tb, "continuous", &render_overlay("continuous"));
    dry_run(&tb, "gate", &render_overlay("gate"));
    if crds.is_some() {
        dry_run(
            &tb,
            "prometheus-operator",
            &render_overlay("prometheus-operator"),
        );
    }
    tb.manifest(
        "fp-helm-ns.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: fp-helm\n  labels: {pod-security.kubernetes.io/enforce: restricted}\n",
    );
    tb.kubectl(&[
        "apply",
        "-f",
        tb.state.join("fp-helm-ns.yaml").to_str().expect("path"),
    ]);
    let rules_file = repo_file("manifests/helm/firstpacket/files/firstpacket.rules.yaml");
    let mut sets = vec![];
    if crds.is_some() {
        sets.push("serviceMonitor.enabled=true");
        if rules_file.is_file() {
            sets.push("prometheusRule.enabled=true");
        }
    }
    dry_run(&tb, "helm", &helm_template(&helm, "fph", "fp-helm", &sets));

    // 3. helm install into another namespace: a Ready leader there too.
    // With rbac.leastPrivilege (the defaults are the continuous overlay of step 1, which
    // chart_lints_and_renders_the_continuous_overlay compares): `prober run` leads and
    // probes with pods read in its namespace only and no pods/proxy.
    step("helm install -n fp-helm --set rbac.leastPrivilege=true");
    let chart = repo_file("manifests/helm/firstpacket");
    let out = tb.exec(&[
        helm.to_str().expect("path"),
        "install",
        "fph",
        chart.to_str().expect("path"),
        "-n",
        "fp-helm",
        "--set",
        "rbac.leastPrivilege=true",
    ]);
    assert!(
        out.status.success(),
        "helm install: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let helm_leader = assert_ready_leader_probing(&tb, "fp-helm", selector);
    eprintln!("helm install's leader {helm_leader}");
    let fph = "system:serviceaccount:fp-helm:fph-firstpacket";
    let want: [(&[&str], &str); 3] = [
        (&["list", "pods", "-n", "fp-helm"], "yes"),
        (&["list", "pods", "-n", "kube-system"], "no"),
        (
            &["get", "pods", "--subresource=proxy", "-n", "fp-helm"],
            "no",
        ),
    ];
    for (args, want) in want {
        let mut a = vec!["kubectl", "auth", "can-i"];
        a.extend(args);
        a.extend(["--as", fph]);
        let got = String::from_utf8_lossy(&tb.exec(&a).stdout)
            .trim()
            .to_owned();
        assert_eq!(
            got,
            want,
            "kubectl auth can-i {} --as {fph}",
            args.join(" ")
        );
    }
    let out = tb.exec(&[
        helm.to_str().expect("path"),
        "uninstall",
        "fph",
        "-n",
        "fp-helm",
        "--wait",
    ]);
    assert!(
        out.status.success(),
        "helm uninstall: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The gates below get the cluster to themselves.
    tb.kubectl(&[
        "delete",
        "deployment",
        "firstpacket",
        "-n",
        "firstpacket",
        "--wait",
    ]);
    let left = tb.wait_no_probe_pods(Duration::from_secs(60));
    assert!(left.is_empty(), "probe pods left: {left:?}");

    // 4. The CI recipe (ci-examples/; runner with a kubeconfig, then the in-cluster Job)
    // with the images from a registry the user names: both pushed to one on loopback,
    // FIRSTPACKET_IMAGE_REGISTRY set, the runner's prober taken out of the prober image.
    step("CI recipe with FIRSTPACKET_IMAGE_REGISTRY");
    let crane = PathBuf::from(
        run_ok(
            Command::new("bash")
                .arg(repo_file("scripts/image.sh"))
                .arg("--crane"),
        )
        .trim(),
    );
    let registry = Registry::start(&crane, Path::new(images));
    let work = tb.state.join("ci");
    let cargo_home = work.join("cargo");
    std::fs::create_dir_all(&cargo_home).expect("ci dir");
    std::os::unix::fs::symlink(
        repo_file("").canonicalize().expect("repo"),
        work.join("firstpacket"),
    )
    .expect("symlink firstpacket");
    let env = format!(
        "export FIRSTPACKET_IMAGE_REGISTRY='{}' CARGO_HOME='{}' PATH='{}/bin:{}':\"$PATH\"",
        registry.prefix,
        cargo_home.display(),
        cargo_home.display(),
        crane.parent().expect("crane dir").display()
    );
    for cmd in ci_example_commands() {
        if cmd.starts_with("git clone") {
            // This checkout is the clone (symlinked).
            eprintln!("recipe: skipped here: {cmd}");
            continue;
        }
        if cmd.contains("upgrade-cluster") {
            // The upgrade: a CNI agent rollout on node-1.
            eprintln!("recipe: the upgrade: testbed agent roll node-1");
            common::testbed_ok(
                &tb,
                &[
                    "agent",
                    "roll",
                    "node-1",
                    "--image",
                    "docker.io/calico/node:v3.31.0",
                ],
            );
            continue;
        }
        eprintln!("recipe: {cmd}");
        let script = format!("cd '{}'\n{env}\n{cmd}", work.display());
        // The runner reaches the registry on the machine's loopback, where the kubelets
        // pull from, and the API in the testbed's host namespace (`testbed exec`):
        // getting the prober needs only the former.
        let out = if cmd.contains("get-prober.sh") {
            Command::new("bash")
                .args(["-ec", &script])
                .output()
                .expect("bash")
        } else {
            tb.exec(&["bash", "-ec", &script])
        };
        assert!(
            out.status.success(),
            "recipe step {cmd:?} exited {:?}:\n{}\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The runner ran the prober out of the image (get-prober.sh), the Job the image
    // pulled from the registry, its probe pods the registry's target-server.
    assert!(
        cargo_home.join("bin/prober").is_file(),
        "get-prober.sh installed no prober in {}",
        cargo_home.display()
    );
    let job_pod = json(
        &tb,
        &[
            "get",
            "pods",
            "-n",
            "firstpacket",
            "-l",
            "job-name=firstpacket-gate",
        ],
    );
    let job_pod = &job_pod["items"][0];
    let prober_digest = common::built_image_digest(Path::new(images), "prober");
    let id = job_pod["status"]["containerStatuses"][0]["imageID"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(
        id,
        format!("{}/prober@{prober_digest}", registry.prefix),
        "the gate Job's imageID"
    );
    let probe_image = job_pod["spec"]["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "FIRSTPACKET_IMAGE")
        .map(|e| e["value"].clone());
    assert_eq!(
        probe_image,
        Some(Value::from(format!(
            "{}/target-server:{}",
            registry.prefix,
            env!("CARGO_PKG_VERSION")
        ))),
        "the gate Job's probe image: {job_pod:#}"
    );
    assert_eq!(job_outcome(&tb), "Complete", "the S1 gate Job");
    for name in ["before.json", "after.json", "in-cluster.json"] {
        let r = read_report(&work.join(name), "recipe");
        assert_eq!(r["verdict"], "pass", "{name}: {r:#}");
        assert!(
            r["summary"]["total"].as_u64().unwrap_or(0) > 0,
            "{name}: no probes"
        );
    }
    for name in ["before.xml", "after.xml", "in-cluster.xml"] {
        let x = std::fs::read_to_string(work.join(name)).unwrap_or_default();
        assert!(x.contains("<testsuite"), "{name}: {x}");
    }

    // 5. S4 through the Job: exit 1, the cross-node failures in the report.
    step("gate Job on S4");
    tb.set_fault(
        &std::fs::read_to_string(repo_file("testbed/faults/s4-cross-node.yaml")).expect("S4"),
    );
    let s4_config = vec![("FIRSTPACKET_GIVE_UP", "10s"), ("FIRSTPACKET_JUNIT", "-")];
    let s4 = gate_overlay(&tb, "s4", &s4_config, "");
    let (code, stdout, _) = gate_job(
        &tb,
        &tb.state,
        &[
            "-k",
            s4.to_str().expect("path"),
            "--report",
            "s4.json",
            "--junit",
            "s4.xml",
            "--timeout",
            "240",
        ],
    );
    let r = read_report(&tb.state.join("s4.json"), "S4");
    assert_eq!(code, 1, "S4: exit {code}\n{stdout}\n{r:#}");
    // The Job itself only says Failed, as it will for exit 2 below.
    assert_eq!(job_outcome(&tb), "Failed", "the S4 gate Job");
    assert_eq!(r["verdict"], "fail", "{r:#}");
    assert_eq!(r["summary"]["diagnosis"], "cross_node_broken", "{r:#}");
    let failed_cross = r["probes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["kind"] == "cross_node" && p["result"] == "failed")
        .count();
    assert!(
        failed_cross >= 2,
        "S4: {failed_cross} failed cross-node probes: {r:#}"
    );
    assert!(
        stdout.contains("cross_node_broken"),
        "the gate's table is not in gate-job.sh's output:\n{stdout}"
    );
    let x = std::fs::read_to_string(tb.state.join("s4.xml")).unwrap_or_default();
    assert!(x.contains("<failure"), "S4 JUnit has no failure: {x}");
    tb.set_fault(&s1);

    // 6. A probe image that does not exist: the gate's exit 2 through the Job.
    step("gate Job with a missing probe image");
    let missing = gate_overlay(
        &tb,
        "missing-probe-image",
        &[(
            "FIRSTPACKET_IMAGE",
            "ghcr.io/firstpacket/no-such-image:0.1.0",
        )],
        "",
    );
    let (code, stdout, _) = gate_job(
        &tb,
        &tb.state,
        &[
            "-k",
            missing.to_str().expect("path"),
            "--report",
            "missing.json",
        ],
    );
    let r = read_report(&tb.state.join("missing.json"), "missing image");
    assert_eq!(code, 2, "missing probe image: exit {code}\n{stdout}\n{r:#}");
    assert_eq!(job_outcome(&tb), "Failed", "the missing-image gate Job");
    assert_eq!(r["verdict"], "inconclusive", "{r:#}");
    assert!(
        r["probes"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["reason"] == "image_pull"),
        "no image_pull probe: {r:#}"
    );

    // 7. The prober's own image missing: the Job never runs the gate; still exit 2.
    step("gate Job with a missing prober image");
    let no_prober = gate_overlay(
        &tb,
        "missing-prober-image",
        &[],
        "images:\n- {name: ghcr.io/firstpacket/prober, newName: ghcr.io/firstpacket/no-such-prober}\n",
    );
    let (code, _, stderr) = gate_job(
        &tb,
        &tb.state,
        &[
            "-k",
            no_prober.to_str().expect("path"),
            "--report",
            "none.json",
            "--pull-grace",
            "2",
            "--timeout",
            "60",
        ],
    );
    assert_eq!(code, 2, "missing prober image: exit {code}\n{stderr}");
    assert!(stderr.contains("cannot pull"), "{stderr}");

    // 8. The Job's pod refused by admission (the namespace's Pod Security `restricted`
    // and a container allowing privilege escalation): exit 2 within 30 s quoting the
    // Job controller's FailedCreate Event, the Job suspended.
    step("gate Job whose pod admission refuses");
    let refused = gate_overlay(
        &tb,
        "refused",
        &[],
        "patches:\n- target: {kind: Job, name: firstpacket-gate}\n  patch: |-\n    - op: replace\n      path: /spec/template/spec/containers/0/securityContext/allowPrivilegeEscalation\n      value: true\n",
    );
    let t = Instant::now();
    let (code, _, stderr) = gate_job(
        &tb,
        &tb.state,
        &[
            "-k",
            refused.to_str().expect("path"),
            "--report",
            "refused.json",
        ],
    );
    let took = t.elapsed();
    assert_eq!(code, 2, "admission-refused Job pod: exit {code}\n{stderr}");
    assert!(
        took < Duration::from_secs(30),
        "admission-refused Job pod: exit 2 after {took:?}"
    );
    assert!(
        stderr.contains("is forbidden")
            && stderr.contains("PodSecurity")
            && stderr.contains("allowPrivilegeEscalation"),
        "the refusal is not quoted:\n{stderr}"
    );
    assert_eq!(
        job_suspended(&tb),
        "true",
        "the refused Job is not suspended"
    );
    eprintln!("refused: exit 2 after {:.1}s", took.as_secs_f64());

    // 9. The Job's pod unschedulable (a node selector no node has): exit 2 with the
    // scheduler's message (--start-grace 2: the default's 10 s is step 8's).
    step("gate Job whose pod is unschedulable");
    let unschedulable = gate_overlay(
        &tb,
        "unschedulable",
        &[],
        "patches:\n- target: {kind: Job, name: firstpacket-gate}\n  patch: |-\n    - op: add\n      path: /spec/template/spec/nodeSelector\n      value: {firstpacket.example/no-such-node: \"true\"}\n",
    );
    let t = Instant::now();
    let (code, _, stderr) = gate_job(
        &tb,
        &tb.state,
        &[
            "-k",
            unschedulable.to_str().expect("path"),
            "--report",
            "unschedulable.json",
            "--start-grace",
            "2",
        ],
    );
    let took = t.elapsed();
    assert_eq!(code, 2, "unschedulable Job pod: exit {code}\n{stderr}");
    assert!(
        took < Duration::from_secs(20),
        "unschedulable Job pod: exit 2 after {took:?}"
    );
    assert!(
        stderr.contains("is unschedulable: 0/3 nodes are available"),
        "no scheduler message:\n{stderr}"
    );
    assert_eq!(
        job_suspended(&tb),
        "true",
        "the unschedulable Job is not suspended"
    );
    eprintln!("unschedulable: exit 2 after {:.1}s", took.as_secs_f64());

    // 10. Least-privilege RBAC (manifests/components/least-privilege) on the gate Job:
    // the ServiceAccount can list pods in its namespace only, no pods/proxy; the gate
    // still passes, with agent discovery (what it gives up) blind.
    step("gate Job with the least-privilege component");
    // kubectl apply does not prune: the base's cluster-wide binding goes by hand.
    tb.kubectl(&[
        "delete",
        "clusterrolebinding",
        "firstpacket-pods-read",
        "--ignore-not-found",
    ]);
    let lp = gate_overlay(
        &tb,
        "least-privilege",
        &[],
        "components:\n- MANIFESTS/components/least-privilege\n",
    );
    let sa = "system:serviceaccount:firstpacket:firstpacket";
    let can_i = |args: &[&str]| -> String {
        let mut a = vec!["kubectl", "auth", "can-i"];
        a.extend(args);
        a.extend(["--as", sa]);
        String::from_utf8_lossy(&tb.exec(&a).stdout)
            .trim()
            .to_owned()
    };
    let want: [(&[&str], &str); 6] = [
        (&["list", "pods", "-n", "firstpacket"], "yes"),
        (&["watch", "pods", "-n", "firstpacket"], "yes"),
        (&["create", "pods", "-n", "firstpacket"], "yes"),
        (&["list", "pods", "-n", "kube-system"], "no"),
        (&["watch", "pods", "--all-namespaces"], "no"),
        (
            &["get", "pods", "--subresource=proxy", "-n", "firstpacket"],
            "no",
        ),
    ];
    // Applied by gate-job.sh below; the authorizer follows RBAC writes within moments.
    let (code, _, stderr) = gate_job(
        &tb,
        &tb.state,
        &["-k", lp.to_str().expect("path"), "--report", "least.json"],
    );
    let answers = poll_until(
        Duration::from_secs(20),
        || want.iter().map(|(a, _)| can_i(a)).collect::<Vec<_>>(),
        |got| got.iter().zip(&want).all(|(g, (_, w))| g == w),
    );
    for (got, (args, w)) in answers.iter().zip(&want) {
        assert_eq!(got, w, "kubectl auth can-i {} --as {sa}", args.join(" "));
    }
    let r = read_report(&tb.state.join("least.json"), "least privilege");
    assert_eq!(
        code, 0,
        "least-privilege gate: exit {code}\n{stderr}\n{r:#}"
    );
    assert_eq!(r["verdict"], "pass", "{r:#}");
    assert_eq!(r["agents"]["scrape_mode"], "direct", "{:#}", r["agents"]);
    let agents_found = |r: &Value| -> u64 {
        r["agents"]["profiles"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(_, p)| p["nodes_with_agent"].as_u64().unwrap_or(0))
            .sum()
    };
    let full = read_report(&work.join("in-cluster.json"), "recipe");
    assert!(
        agents_found(&full) > 0 && agents_found(&r) == 0,
        "agent pods found: {} with the default RBAC, {} with least privilege (want some, none):\n{:#}\n{:#}",
        agents_found(&full),
        agents_found(&r),
        full["agents"],
        r["agents"]
    );
    step("done");
}

/// The testbed kubelet gives a container its environment from ConfigMaps as the real
/// kubelet does (what the gate Job's thresholds rely on): `envFrom` `configMapRef`
/// (with `prefix`), `valueFrom.configMapKeyRef`, `env` overriding `envFrom`, an optional
/// missing key left unset; a missing ConfigMap that is not optional is a
/// `CreateContainerConfigError` naming it. The container is `env` (from a bin dir of
/// its own), whose log is its environment.
#[test]
fn config_map_env_reaches_the_container_as_the_kubelet_gives_it() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let bin_dir = common::BinDir::new("cmenv", &[("env", PathBuf::from("/usr/bin/env"))]);
    let tb = Testbed::up("cmenv", 2, "rules: []\n", &["--bin-dir", bin_dir.arg()]);
    let cm = tb.manifest(
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: default}\ndata: {A: from-map, B: overridden, C: keyed}\n",
    );
    tb.kubectl(&["apply", "-f", &cm]);
    let pod = tb.manifest(
        "envpod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: envpod, namespace: default}\nspec:\n  restartPolicy: Never\n  containers:\n  - name: env\n    image: env\n    envFrom:\n    - configMapRef: {name: settings}\n    - configMapRef: {name: settings}\n      prefix: P_\n    - configMapRef: {name: absent, optional: true}\n    env:\n    - {name: B, value: literal}\n    - name: K\n      valueFrom: {configMapKeyRef: {name: settings, key: C}}\n    - name: OPT\n      valueFrom: {configMapKeyRef: {name: settings, key: nope, optional: true}}\n",
    );
    tb.kubectl(&["apply", "-f", &pod]);
    let phase = tb.kubectl_until(
        &["get", "pod", "envpod", "-o", "jsonpath={.status.phase}"],
        Duration::from_secs(60),
        |p| p == "Succeeded" || p == "Failed",
    );
    let log = tb.kubectl(&["logs", "envpod"]);
    assert_eq!(phase, "Succeeded", "{log}");
    let env: Vec<&str> = log.lines().collect();
    for want in [
        "A=from-map",
        "B=literal",
        "K=keyed",
        "P_A=from-map",
        "P_C=keyed",
    ] {
        assert!(env.contains(&want), "{want} not in the environment:\n{log}");
    }
    assert!(
        !env.iter().any(|l| l.starts_with("OPT=")),
        "an optional missing key was set:\n{log}"
    );

    // Not optional and missing: CreateContainerConfigError (after the kubelet's ~10 s
    // of re-reading), naming the ConfigMap.
    let bad = tb.manifest(
        "badpod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: badpod, namespace: default}\nspec:\n  restartPolicy: Never\n  containers:\n  - name: env\n    image: env\n    envFrom:\n    - configMapRef: {name: missing-settings}\n",
    );
    tb.kubectl(&["apply", "-f", &bad]);
    let waiting = tb.kubectl_until(
        &[
            "get",
            "pod",
            "badpod",
            "-o",
            "jsonpath={.status.containerStatuses[0].state.waiting.reason}|{.status.containerStatuses[0].state.waiting.message}",
        ],
        Duration::from_secs(40),
        |w| w.starts_with("CreateContainerConfigError"),
    );
    assert!(
        waiting.starts_with("CreateContainerConfigError") && waiting.contains("missing-settings"),
        "{waiting}"
    );
}

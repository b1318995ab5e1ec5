//! Node-side behaviour both control planes must share (`FIRSTPACKET_CONTROL_PLANE`
//! picks one): containers run with their `securityContext` identity (uid, gid,
//! capabilities, `no_new_privs`), read from the process the kubelet started.
//!
//! Needs root, `ip`, `kubectl` and the workspace binaries (and, on the real control
//! plane, its binaries).

mod common;

use common::{poll_until, proc_status, Testbed, SERIAL};
use std::time::Duration;

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const READY_TIMEOUT: Duration = Duration::from_secs(60);

fn pod(name: &str, pod_sc: &str, container_sc: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  nodeName: node-1\n  securityContext: {pod_sc}\n  containers:\n  - name: c\n    image: target-server\n    args: [serve]\n    securityContext: {container_sc}\n    readinessProbe: {{httpGet: {{path: /readyz, port: 8080}}, periodSeconds: 1}}\n"
    )
}

/// Waits for the pod's container process and returns its `/proc/PID/status`.
fn status_of(tb: &Testbed, name: &str) -> std::collections::BTreeMap<String, String> {
    let pid = poll_until(
        READY_TIMEOUT,
        || tb.container_pid("default", name),
        Option::is_some,
    )
    .unwrap_or_else(|| panic!("pod {name}: no container process within {READY_TIMEOUT:?}"));
    let st = proc_status(pid);
    assert!(!st.is_empty(), "pod {name}: process {pid} gone");
    st
}

#[test]
fn containers_run_with_their_security_context_identity() {
    let _g = serial();
    let tb = Testbed::up("secctx", 1, "rules: []\n", &[]);
    let restricted = "{allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}, seccompProfile: {type: RuntimeDefault}}";
    let m = tb.manifest(
        "pods.yaml",
        &[
            pod(
                "nonroot",
                "{runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532, supplementalGroups: [4242]}",
                restricted,
            ),
            pod("root", "{}", "{}"),
            pod("bind", "{runAsUser: 1000}", "{capabilities: {drop: [ALL], add: [NET_BIND_SERVICE]}}"),
            pod("nouser", "{runAsNonRoot: true}", restricted),
            pod(
                "readonly",
                "{runAsUser: 65532}",
                "{readOnlyRootFilesystem: true, allowPrivilegeEscalation: false}",
            ),
        ]
        .join("---\n"),
    );
    tb.kubectl(&["apply", "-f", &m]);

    // Non-root, no privileges, and still serving (Ready through its HTTP probe).
    assert!(
        tb.wait_pod_ready("default", "nonroot", READY_TIMEOUT),
        "nonroot not Ready"
    );
    let st = status_of(&tb, "nonroot");
    assert_eq!(st["Uid"], "65532\t65532\t65532\t65532", "{st:#?}");
    assert_eq!(st["Gid"], "65532\t65532\t65532\t65532", "{st:#?}");
    assert_eq!(st["Groups"], "4242", "{st:#?}");
    assert_eq!(st["NoNewPrivs"], "1", "{st:#?}");
    for set in ["CapEff", "CapPrm", "CapBnd", "CapAmb", "CapInh"] {
        assert_eq!(st[set], "0000000000000000", "{set}: {st:#?}");
    }

    // A root container keeps the runtime's default set, as before.
    assert!(
        tb.wait_pod_ready("default", "root", READY_TIMEOUT),
        "root not Ready"
    );
    let st = status_of(&tb, "root");
    assert_eq!(st["Uid"], "0\t0\t0\t0", "{st:#?}");
    assert_eq!(st["NoNewPrivs"], "0", "{st:#?}");
    let want = format!("{:016x}", testbed::security::DEFAULT_CAPS);
    assert_eq!(st["CapEff"], want, "{st:#?}");
    assert_eq!(st["CapBnd"], want, "{st:#?}");

    // drop ALL + add NET_BIND_SERVICE as uid 1000: only that in the bounding set; a
    // non-root process has no effective capabilities after execve.
    assert!(
        tb.wait_pod_ready("default", "bind", READY_TIMEOUT),
        "bind not Ready"
    );
    let st = status_of(&tb, "bind");
    assert_eq!(st["Uid"], "1000\t1000\t1000\t1000", "{st:#?}");
    assert_eq!(st["CapBnd"], format!("{:016x}", 1u64 << 10), "{st:#?}");
    assert_eq!(st["CapEff"], "0000000000000000", "{st:#?}");
    assert_eq!(st["NoNewPrivs"], "0", "{st:#?}");

    // runAsNonRoot without a user, image user root: the kubelet refuses to start it.
    let got = tb.kubectl_until(
        &[
            "get",
            "pod",
            "nouser",
            "-o",
            "jsonpath={.status.phase}|{.status.containerStatuses[0].state.waiting.reason}|{.status.containerStatuses[0].state.waiting.message}",
        ],
        READY_TIMEOUT,
        |o| o.contains("CreateContainerConfigError"),
    );
    let parts: Vec<&str> = got.splitn(3, '|').collect();
    assert_eq!(parts.len(), 3, "{got}");
    assert_eq!(parts[0], "Pending", "{got}");
    assert_eq!(parts[1], "CreateContainerConfigError", "{got}");
    assert!(
        parts[2].starts_with(
            "container has runAsNonRoot and image will run as root (pod: \"nouser_default("
        ),
        "{got}"
    );
    assert_eq!(tb.container_pid("default", "nouser"), None);

    // A non-root container writes its termination message (the probe source's report
    // goes there): the file the kubelet prepares is writable by any uid.
    let w = tb.manifest(
        "writer.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: writer}\nspec:\n  nodeName: node-1\n  restartPolicy: Never\n  securityContext: {runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532}\n  containers:\n  - name: c\n    image: target-server\n    args: [probe, --target, '127.0.0.1:1', --expect-pod, nobody, --give-up, 1s, --hold, 0s, --ready-wait, 0s]\n    securityContext: {readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}\n",
    );
    tb.kubectl(&["apply", "-f", &w]);
    let msg = tb.kubectl_until(
        &[
            "get",
            "pod",
            "writer",
            "-o",
            "jsonpath={.status.containerStatuses[0].state.terminated.message}",
        ],
        READY_TIMEOUT,
        |o| !o.is_empty(),
    );
    let report: serde_json::Value = serde_json::from_str(msg.trim())
        .unwrap_or_else(|e| panic!("termination message {msg:?} is not the report: {e}"));
    assert!(report.is_object(), "{report}");

    // readOnlyRootFilesystem: the container's / is mounted read-only, its /dev (the
    // termination-message file) writable, and it still serves.
    assert!(
        tb.wait_pod_ready("default", "readonly", READY_TIMEOUT),
        "readonly not Ready"
    );
    let pid = tb
        .container_pid("default", "readonly")
        .expect("readonly: no pid");
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
    let opts = |point: &str| {
        mounts
            .lines()
            .map(|l| l.split(' ').collect::<Vec<_>>())
            .filter(|f| f.len() > 5 && f[4] == point)
            .map(|f| f[5].split(',').next().unwrap_or_default().to_owned())
            .next_back()
    };
    assert_eq!(opts("/").as_deref(), Some("ro"), "{mounts}");
    assert_eq!(opts("/dev").as_deref(), Some("rw"), "{mounts}");
    let root_mounts = std::fs::read_to_string(format!(
        "/proc/{}/mountinfo",
        tb.container_pid("default", "root").unwrap_or(0)
    ))
    .unwrap_or_default();
    assert!(
        root_mounts.lines().any(|l| l.split(' ').nth(4) == Some("/")
            && l.split(' ').nth(5).is_some_and(|o| o.starts_with("rw"))),
        "a container without readOnlyRootFilesystem has a writable /: {root_mounts}"
    );
}

/// `kubectl create -n NS -f FILE -v=6`: (exit code, the HTTP status of the POST as
/// kubectl logged it, the `Error from server` line or else all of stderr).
fn create_logged(tb: &Testbed, ns: &str, file: &str) -> (i32, String, String) {
    let out = tb.exec(&["kubectl", "create", "-n", ns, "-f", file, "-v=6"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let post = err
        .lines()
        .find(|l| l.contains("POST") && l.contains("/pods"))
        .unwrap_or_default();
    let status = ["403 Forbidden", "201 Created"]
        .into_iter()
        .find(|s| post.contains(s))
        .unwrap_or("?")
        .to_owned();
    let line = err
        .lines()
        .find(|l| l.starts_with("Error from server"))
        .map(str::to_owned)
        // Anything else (a 422, a client-side error): all of it, for the message.
        .unwrap_or_else(|| err.clone());
    (out.status.code().unwrap_or(-1), status, line)
}

#[test]
fn pod_security_admission_rejects_what_the_namespace_level_forbids() {
    let _g = serial();
    let tb = Testbed::up("psa", 1, "rules: []\n", &[]);
    let ns = tb.manifest(
        "ns.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: r, labels: {pod-security.kubernetes.io/enforce: restricted}}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: b, labels: {pod-security.kubernetes.io/enforce: baseline}}\n",
    );
    tb.kubectl(&["apply", "-f", &ns]);
    let plain = tb.manifest(
        "plain.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: plain}\nspec:\n  containers:\n  - {name: x, image: target-server, args: [serve]}\n",
    );
    let (code, status, line) = create_logged(&tb, "r", &plain);
    assert_ne!(code, 0, "{line}");
    assert_eq!(status, "403 Forbidden", "{line}");
    let want = "pods \"plain\" is forbidden: violates PodSecurity \"restricted:latest\": allowPrivilegeEscalation != false (container \"x\" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container \"x\" must set securityContext.capabilities.drop=[\"ALL\"]), runAsNonRoot != true (pod or container \"x\" must set securityContext.runAsNonRoot=true), seccompProfile (pod or container \"x\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")";
    assert!(
        line.starts_with("Error from server (Forbidden): "),
        "{line}"
    );
    assert!(line.ends_with(want), "got:  {line}\nwant: …{want}");
    // Baseline lets it through.
    let (code, status, line) = create_logged(&tb, "b", &plain);
    assert_eq!((code, status.as_str()), (0, "201 Created"), "{line}");

    // Host namespaces, privileged and runAsUser=0: rejected by both levels, each with
    // its own checks.
    let host = tb.manifest(
        "host.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: host}\nspec:\n  hostNetwork: true\n  securityContext: {runAsNonRoot: true, runAsUser: 0, seccompProfile: {type: RuntimeDefault}}\n  containers:\n  - name: cx\n    image: target-server\n    securityContext: {privileged: true, capabilities: {drop: [ALL]}}\n",
    );
    let (code, status, line) = create_logged(&tb, "r", &host);
    assert_ne!(code, 0, "{line}");
    assert_eq!(status, "403 Forbidden", "{line}");
    assert!(
        line.ends_with("pods \"host\" is forbidden: violates PodSecurity \"restricted:latest\": host namespaces (hostNetwork=true), privileged (container \"cx\" must not set securityContext.privileged=true), allowPrivilegeEscalation != false (container \"cx\" must set securityContext.allowPrivilegeEscalation=false), runAsUser=0 (pod must not set runAsUser=0)"),
        "{line}"
    );
    let (code, status, line) = create_logged(&tb, "b", &host);
    assert_ne!(code, 0, "{line}");
    assert_eq!(status, "403 Forbidden", "{line}");
    assert!(
        line.ends_with("pods \"host\" is forbidden: violates PodSecurity \"baseline:latest\": host namespaces (hostNetwork=true), privileged (container \"cx\" must not set securityContext.privileged=true)"),
        "{line}"
    );

    // privileged with allowPrivilegeEscalation=false: invalid before admission (422).
    let invalid = tb.manifest(
        "invalid.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: invalid}\nspec:\n  containers:\n  - name: cx\n    image: target-server\n    securityContext: {privileged: true, allowPrivilegeEscalation: false}\n",
    );
    let out = tb.exec(&["kubectl", "create", "-f", &invalid, "-v=6"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("422 Unprocessable Entity"), "{err}");
    assert!(
        err.contains(
            "The Pod \"invalid\" is invalid: spec.containers[0].securityContext: Invalid value: "
        ) && err
            .contains(": cannot set `allowPrivilegeEscalation` to false and `privileged` to true"),
        "{err}"
    );

    // A pod that meets restricted is created and runs (as its non-root user).
    let ok = tb.manifest(
        "ok.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: ok}\nspec:\n  nodeName: node-1\n  securityContext: {runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532, seccompProfile: {type: RuntimeDefault}}\n  containers:\n  - name: c\n    image: target-server\n    args: [serve]\n    securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}\n    readinessProbe: {httpGet: {path: /readyz, port: 8080}, periodSeconds: 1}\n",
    );
    let (code, status, line) = create_logged(&tb, "r", &ok);
    assert_eq!((code, status.as_str()), (0, "201 Created"), "{line}");
    assert!(
        tb.wait_pod_ready("r", "ok", READY_TIMEOUT),
        "restricted pod not Ready"
    );
    let pid = tb.container_pid("r", "ok").expect("no container pid");
    assert_eq!(proc_status(pid)["Uid"], "65532\t65532\t65532\t65532");
}

/// A pod pinned by a required node affinity term (`term` is its YAML flow mapping).
fn pinned_pod(name: &str, term: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  affinity:\n    nodeAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n        nodeSelectorTerms:\n        - {term}\n  containers:\n  - {{name: c, image: target-server, args: [serve]}}\n"
    )
}

#[test]
fn hostname_label_can_differ_from_the_node_name() {
    let _g = serial();
    let tb = Testbed::up(
        "hostlabel",
        3,
        "rules: []\n",
        &["--hostname-label-suffix", ".ec2.internal"],
    );
    let nodes = tb.kubectl(&[
        "get",
        "nodes",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name}={.metadata.labels.kubernetes\\.io/hostname}{\"\\n\"}{end}",
    ]);
    let mut got: Vec<&str> = nodes.lines().collect();
    got.sort();
    assert_eq!(
        got,
        [
            "node-1=node-1.ec2.internal",
            "node-2=node-2.ec2.internal",
            "node-3=node-3.ec2.internal"
        ]
    );
    let shown = tb.kubectl(&["get", "nodes", "-L", "kubernetes.io/hostname"]);
    assert!(shown.contains("node-2.ec2.internal"), "{shown}");

    let m = tb.manifest(
        "pinned.yaml",
        &[
            pinned_pod(
                "by-name",
                "{matchFields: [{key: metadata.name, operator: In, values: [node-2]}]}",
            ),
            pinned_pod(
                "by-label",
                "{matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [node-3.ec2.internal]}]}",
            ),
            pinned_pod(
                "by-name-as-label",
                "{matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [node-1]}]}",
            ),
        ]
        .join("---\n"),
    );
    tb.kubectl(&["apply", "-f", &m]);
    for (pod, node) in [("by-name", "node-2"), ("by-label", "node-3")] {
        assert!(
            tb.wait_pod_ready("default", pod, READY_TIMEOUT),
            "{pod} not Ready"
        );
        let on = tb.kubectl(&["get", "pod", pod, "-o", "jsonpath={.spec.nodeName}"]);
        assert_eq!(on, node, "{pod}");
    }
    // The node name as the label's value matches no node: unschedulable.
    let cond = tb.kubectl_until(
        &[
            "get",
            "pod",
            "by-name-as-label",
            "-o",
            "jsonpath={.spec.nodeName}|{.status.conditions[?(@.type==\"PodScheduled\")].reason}",
        ],
        READY_TIMEOUT,
        |o| o.ends_with("Unschedulable"),
    );
    assert_eq!(cond, "|Unschedulable");
}

/// `process_start_time_seconds` of the Felix page at `ip:9091`, read from the host
/// network namespace (`testbed exec -- curl`).
fn felix_start_time(tb: &Testbed, ip: &str) -> Option<f64> {
    let out = tb.exec(&[
        "curl",
        "-sS",
        "--max-time",
        "3",
        &format!("http://{ip}:9091/metrics"),
    ]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("process_start_time_seconds "))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn agent_roll_replaces_one_nodes_calico_node_pod() {
    let _g = serial();
    let tb = Testbed::up("agentroll", 3, "rules: []\n", &[]);
    let before = tb.agent_pods();
    assert_eq!(before.len(), 3, "{before:?}");
    let node3_ip = tb.kubectl(&[
        "get",
        "node",
        "node-3",
        "-o",
        "jsonpath={.status.addresses[?(@.type==\"InternalIP\")].address}",
    ]);
    let started_before = felix_start_time(&tb, node3_ip.trim())
        .unwrap_or_else(|| panic!("no Felix page on {node3_ip}:9091"));

    let image = "docker.io/calico/node:v3.99.0";
    let mut roll = tb.cmd();
    roll.args(["agent", "roll", "node-3", "--image", image]);
    let out = common::output_within(roll, Duration::from_secs(120));
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "agent roll failed: {said}");

    let after = tb.agent_pods();
    let (old, new) = (&before["node-3"], &after["node-3"]);
    assert_ne!(new[0], old[0], "same pod name after the roll: {after:?}");
    assert_ne!(new[1], old[1], "same UID after the roll: {after:?}");
    assert_eq!(new[2], image, "{after:?}");
    assert_eq!(
        (new[3].as_str(), new[4].as_str()),
        ("0", "True"),
        "{after:?}"
    );
    assert!(said.contains(&new[0]) && said.contains(&new[1]), "{said}");
    for n in ["node-1", "node-2"] {
        assert_eq!(before[n], after[n], "{n}'s agent pod changed");
    }
    let uids = tb.kubectl(&[
        "get",
        "pods",
        "-n",
        "kube-system",
        "-o",
        "jsonpath={.items[*].metadata.uid}",
    ]);
    assert!(
        !uids.contains(&old[1]),
        "old UID {} still listed: {uids}",
        old[1]
    );
    let wide = tb.kubectl(&["get", "pod", "-n", "kube-system", "-o", "wide"]);
    let line = wide
        .lines()
        .find(|l| l.starts_with(&new[0]))
        .unwrap_or_default();
    assert!(
        line.contains("node-3") && line.contains("Running"),
        "{wide}"
    );

    // The agent process restarted: its Felix page starts later than before.
    let started_after =
        felix_start_time(&tb, node3_ip.trim()).expect("no Felix page after the roll");
    assert!(
        started_after > started_before,
        "{started_after} vs {started_before}"
    );

    let truth = tb.truth();
    let rolled: Vec<_> = truth
        .iter()
        .filter(|e| e.event == testbed::truth::TruthKind::AgentRolled)
        .collect();
    assert_eq!(rolled.len(), 1, "{rolled:?}");
    assert_eq!(rolled[0].node.as_deref(), Some("node-3"));
    assert_eq!(rolled[0].uid.as_deref(), Some(new[1].as_str()));
    assert_eq!(rolled[0].detail["old_uid"], old[1].as_str());
    assert_eq!(rolled[0].detail["image"], image);

    // Unknown node: a clear error, nothing changes.
    let mut bad = tb.cmd();
    bad.args(["agent", "roll", "node-9", "--image", image]);
    let out = common::output_within(bad, Duration::from_secs(30));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("node-9"));
    assert_eq!(tb.agent_pods(), after);
}

#[test]
fn agent_roll_with_down_time_keeps_the_nodes_new_pods_dark_until_the_agent_is_back() {
    let _g = serial();
    let tb = Testbed::up("agentdown", 2, "rules: []\n", &[]);
    let down = 4.0;
    let start = testbed::truth::unix_now();
    let mut roll = tb.cmd();
    roll.args([
        "agent",
        "roll",
        "node-2",
        "--image",
        "docker.io/calico/node:v3.99.0",
        "--down",
        "4s",
    ]);
    let roller = std::thread::spawn(move || common::output_within(roll, Duration::from_secs(120)));
    // A pod created on node-2 while its agent is down.
    std::thread::sleep(Duration::from_millis(500));
    let m = tb.manifest(
        "dark.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: dark}\nspec:\n  nodeName: node-2\n  containers:\n  - {name: c, image: target-server, args: [serve]}\n",
    );
    tb.kubectl(&["apply", "-f", &m]);
    let out = roller.join().expect("roll thread");
    assert!(
        out.status.success(),
        "agent roll failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let uid = tb.kubectl(&["get", "pod", "dark", "-o", "jsonpath={.metadata.uid}"]);
    let of = |t: &[testbed::truth::TruthEvent], kind| {
        t.iter()
            .find(|e| e.event == kind && e.uid.as_deref() == Some(uid.as_str()))
            .map(|e| e.t)
    };
    use testbed::truth::TruthKind::{AgentRolled, EndpointAdded, EndpointProgrammed};
    let truth = tb.truth_until(READY_TIMEOUT, |t| of(t, EndpointProgrammed).is_some());
    let added = of(&truth, EndpointAdded).expect("no endpoint_added for the pod");
    let programmed = of(&truth, EndpointProgrammed).expect("pod never programmed");
    assert!(
        programmed >= start + down - 0.2,
        "programmed {:.3}s after the roll started, before the agent was back ({down}s)",
        programmed - start
    );
    assert!(
        programmed - added > 1.5,
        "added {added:.3}, programmed {programmed:.3}: not held back"
    );
    let rolled = truth
        .iter()
        .find(|e| e.event == AgentRolled)
        .expect("no agent_rolled");
    assert_eq!(rolled.detail["down_seconds"], down);
    assert!(rolled.t >= programmed - 0.5, "{} vs {programmed}", rolled.t);
}

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
}

//! The probe kinds (a closed set: docs/design.md §2 "Kinds"). A leaf: the command line,
//! the planner and the probe all name kinds by this type.

use clap::ValueEnum;

/// Probe kinds (docs/design.md §2 "Kinds"; the API writes each costs: the probe module's docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum ProbeKind {
    /// Source and target on different nodes.
    CrossNode,
    /// Both on one node (control).
    SameNode,
    /// Stable-name target recreated on the same node (calico#11016).
    Recreate,
    /// Through a ClusterIP Service.
    Service,
    /// Target created among filler pods.
    Burst,
    /// As `cross_node`, but the target has no readiness probe, so its Ready means only
    /// "containers started" (issue 29): on a CNI that holds a new pod until its agent
    /// has programmed it (Calico), the target's programming delay then lands after
    /// Ready, in TTFP — the darkness an application without a readiness probe meets,
    /// and what the XDP incident's operator timed with a `wget` loop.
    Unprobed,
    /// A new pod under an existing NetworkPolicy (issue 32): the fresh target is
    /// isolated by an ingress policy that admits only this probe's fresh source (pod
    /// and namespace selector), and the source by an egress policy admitting only the
    /// target's IP (`ipBlock`); TTFP after the source's Ready is how long the nodes
    /// take to admit a new peer. A third fresh pod that no rule admits (the intruder)
    /// dials the target from its own first instant: any answer is an
    /// `isolation_breach`.
    Policy,
    /// A new NetworkPolicy over running pods (issue 32): both pods Ready, the target
    /// isolated by a deny-all policy; the prober creates an allow policy and the source
    /// times, on its own clock, from the create to the first answer, then from the
    /// policy's deletion to the first refused connection (revocation).
    PolicyChange,
}

impl ProbeKind {
    /// Pod to pod, so every path of `--protocols`/`--payload`/`--ip-families` is
    /// measured ([`crate::paths`]): all but `service`, `policy` and `policy_change`.
    pub fn pod_to_pod(self) -> bool {
        !matches!(
            self,
            ProbeKind::Service | ProbeKind::Policy | ProbeKind::PolicyChange
        )
    }

    /// The label / JSON string.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeKind::CrossNode => "cross_node",
            ProbeKind::SameNode => "same_node",
            ProbeKind::Recreate => "recreate",
            ProbeKind::Service => "service",
            ProbeKind::Burst => "burst",
            ProbeKind::Unprobed => "unprobed",
            ProbeKind::Policy => "policy",
            ProbeKind::PolicyChange => "policy_change",
        }
    }
}

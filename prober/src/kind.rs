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
}

impl ProbeKind {
    /// The label / JSON string.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeKind::CrossNode => "cross_node",
            ProbeKind::SameNode => "same_node",
            ProbeKind::Recreate => "recreate",
            ProbeKind::Service => "service",
            ProbeKind::Burst => "burst",
            ProbeKind::Unprobed => "unprobed",
        }
    }
}

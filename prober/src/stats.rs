//! Pure statistics over probe records, shared by the gate's report and the continuous
//! mode's status page: nearest-rank quantiles (`rank = ⌈q·n⌉`, 1-based, so a reported
//! quantile is always a measured value) and the TTFPs of conclusive probes.

use firstpacket_report::ProbeRecord;

/// Nearest-rank quantile `q` in (0, 1] of `values` (any order). `None` when empty.
pub fn nearest_rank(values: &[f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
    Some(v[rank - 1])
}

/// TTFPs (seconds) of conclusive probes that have one.
pub fn conclusive_ttfps(probes: &[ProbeRecord]) -> Vec<f64> {
    probes
        .iter()
        .filter(|p| p.result.is_conclusive())
        .filter_map(|p| p.ttfp_seconds)
        .collect()
}

//! Parser for the Prometheus text exposition format, version 0.0.4 — what node agents
//! (Calico Felix, Cilium, kube-proxy, aws-node) serve on `/metrics` when asked with
//! `Accept: text/plain;version=0.0.4` (docs/design.md §3 "Parsing").
//!
//! Pure: takes the page text, returns data ([`parse`] → [`Page`]); no I/O.
//!
//! # Why our own parser
//! The crates checked on crates.io do not cover the whole format: `prometheus-parse`
//! 0.2.5 splits label sets on `,` and `=` (label values with commas, braces or escapes
//! come out wrong) and silently skips lines it cannot read, so a garbage page is not an
//! error; `openmetrics-parser` 0.5 is LGPL-3.0 and targets OpenMetrics strictness. This
//! one is a single pass over the bytes, allocating only the owned strings of the result
//! (≥ 100 MB/s is the target, docs/design.md §7; `cargo bench -p prober --bench expo`).
//!
//! # Grammar (sources)
//! - Format: <https://prometheus.io/docs/instrumenting/exposition_formats/> ("Text-based
//!   format"); reference implementations `prometheus/common` `expfmt/text_parse.go`
//!   (client side) and `prometheus/prometheus` `model/textparse/promparse.go` (the
//!   server that scrapes agents in production).
//! - Lines end in `\n`; `\r`s before it are dropped (CRLF), the last line may lack its
//!   newline. Blank lines are skipped. Blanks (space, tab) separate tokens, and may
//!   lead a line.
//! - `# HELP name text`: escapes `\\` and `\n` in `text`. `# TYPE name type` with type
//!   `counter`, `gauge`, `summary`, `histogram`, `untyped` (or OpenMetrics `unknown`, read
//!   as untyped). Any other `#` line is a comment. `# EOF` (OpenMetrics) ends the page.
//! - Sample: `name[{label="value",…}] value [timestamp_ms]`. Metric names match
//!   `[a-zA-Z_:][a-zA-Z0-9_:]*`, label names `[a-zA-Z_][a-zA-Z0-9_]*`. Label values may
//!   hold any character, with escapes `\\`, `\"`, `\n`. A trailing comma in the label set
//!   and an empty set `{}` are allowed. Values are floats incl. `NaN`, `+Inf`, `-Inf`.
//!
//! # Family grouping
//! A sample joins the family declared by the preceding `# TYPE` (or `# HELP`) when its
//! name is the family name plus a suffix that the type allows: counter `""`, `_total`,
//! `_created` (OpenMetrics names counter families without `_total`); gauge `""`;
//! summary `""` (with a `quantile` label), `_sum`, `_count`, `_created`; histogram
//! `_bucket` (with an `le` label), `_sum`, `_count`, `_created`; untyped `""`,
//! `_bucket`, `_sum`, `_count`, `_created`. A sample with no declared family is
//! grouped by suffix: `x_sum`, `x_count`, `x_bucket`, `x_created` go to an untyped
//! family `x`; any other name is its own untyped family.
//!
//! # Decisions where the format leaves room (documented, tested)
//! - A repeated `# TYPE` line with the same type is tolerated; a different type is an
//!   error ([`ParseErrorKind::ConflictingType`]), and so is a `# TYPE` after samples of
//!   that family ([`ParseErrorKind::TypeAfterSamples`]) — as in `expfmt`.
//! - A repeated `# HELP` keeps the first text.
//! - Samples of a family that are not contiguous are merged into the one family.
//! - Unknown escapes (`\t`, `\x`) are kept verbatim, as the Prometheus server does.
//! - Timestamps are integer milliseconds (format 0.0.4); anything else is an error.
//! - An OpenMetrics exemplar (`# {…} v` after the value or timestamp) is ignored.
//! - Non-blank content after `# EOF` is an error; so is a label name repeated within
//!   one sample, and a summary `quantile` or histogram `le` that is not a float.
//! - Duplicate series (same name and labels twice) are not detected.
//!
//! # Caps (hostile pages)
//! The caller bounds the page's size (the scraper's body limit, 8 MiB by default); the
//! parser bounds what a page within that size can make it build, so that a garbage or
//! hostile page costs a bounded multiple of its size and never more than the caps
//! allow, and fails with a clear error instead. Each cap is far above real agent pages
//! (the fixtures in `prober/tests/fixtures/`: Felix 3.20, Cilium 1.11, kube-proxy 1.21
//! have at most 224 samples, 81 families, 9 labels per sample, 320-byte lines):
//!
//! | cap | value | error |
//! |---|---|---|
//! | line length | [`MAX_LINE_BYTES`] = 64 KiB (200× the longest real line) | [`ParseErrorKind::LineTooLong`] |
//! | samples per page | [`MAX_SAMPLES`] = 100 000 (≈ 450× the largest real page) | [`ParseErrorKind::TooManySamples`] |
//! | families per page | [`MAX_FAMILIES`] = 10 000 (≈ 120× Felix's 81) | [`ParseErrorKind::TooManyFamilies`] |
//! | labels per sample | [`MAX_LABELS_PER_SAMPLE`] = 64 (7× kube-proxy's 9) | [`ParseErrorKind::TooManyLabels`] |
//! | label pairs per page | [`MAX_LABEL_PAIRS`] = 400 000 (4 per sample at the sample cap) | [`ParseErrorKind::TooManyLabelPairs`] |
//!
//! The parse is one pass, linear in the page size (label-name duplicates are found
//! with a set above 16 labels), so time is bounded by the body limit too.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

/// Longest line accepted, bytes (module doc, "Caps").
pub const MAX_LINE_BYTES: usize = 64 * 1024;
/// Most samples on one page (module doc, "Caps").
pub const MAX_SAMPLES: usize = 100_000;
/// Most families on one page, counting `# HELP`/`# TYPE` lines without samples (module
/// doc, "Caps").
pub const MAX_FAMILIES: usize = 10_000;
/// Most labels in one sample (module doc, "Caps").
pub const MAX_LABELS_PER_SAMPLE: usize = 64;
/// Most label pairs over all samples of one page (module doc, "Caps").
pub const MAX_LABEL_PAIRS: usize = 400_000;

/// Metric type from a `# TYPE` line. Samples without one are [`MetricType::Untyped`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetricType {
    /// `counter`: monotonically increasing (resets when the process restarts).
    Counter,
    /// `gauge`: a value that goes up and down.
    Gauge,
    /// `summary`: `{quantile="q"}` samples plus `_sum` and `_count` (client_golang keeps a
    /// sliding 10-minute window for the quantiles; `_sum`/`_count` are cumulative).
    Summary,
    /// `histogram`: cumulative `_bucket{le="…"}` samples plus `_sum` and `_count`.
    Histogram,
    /// `untyped` (0.0.4), `unknown` (OpenMetrics), or no `# TYPE` line at all.
    Untyped,
}

impl MetricType {
    /// The exposition-format keyword: `counter`, `gauge`, `summary`, `histogram`,
    /// `untyped`.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
            MetricType::Summary => "summary",
            MetricType::Histogram => "histogram",
            MetricType::Untyped => "untyped",
        }
    }

    /// Reads a `# TYPE` keyword (exact, lower case); OpenMetrics `unknown` reads as
    /// [`MetricType::Untyped`]. `None` for anything else.
    pub fn from_keyword(s: &str) -> Option<MetricType> {
        Some(match s {
            "counter" => MetricType::Counter,
            "gauge" => MetricType::Gauge,
            "summary" => MetricType::Summary,
            "histogram" => MetricType::Histogram,
            "untyped" | "unknown" => MetricType::Untyped,
            _ => return None,
        })
    }

    /// Whether a sample named family name + `part`'s suffix belongs to a family of this
    /// type (see the module doc, "Family grouping").
    fn allows(self, part: Part) -> bool {
        use Part::*;
        match self {
            MetricType::Counter => matches!(part, Base | Total | Created),
            MetricType::Gauge => matches!(part, Base),
            MetricType::Summary => matches!(part, Base | Sum | Count | Created),
            MetricType::Histogram => matches!(part, Bucket | Sum | Count | Created),
            MetricType::Untyped => matches!(part, Base | Bucket | Sum | Count | Created),
        }
    }
}

impl fmt::Display for MetricType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which part of a family a sample name is: the family name plus one of these suffixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Base,
    Bucket,
    Sum,
    Count,
    Created,
    Total,
}

/// Suffixes, in the order they are tried (none is a suffix of another).
const SUFFIXES: [(&str, Part); 5] = [
    ("_bucket", Part::Bucket),
    ("_sum", Part::Sum),
    ("_count", Part::Count),
    ("_created", Part::Created),
    ("_total", Part::Total),
];

/// Splits `name` into (base, part) by its known suffix, or `(name, Base)`.
fn split_suffix(name: &str) -> (&str, Part) {
    for (suffix, part) in SUFFIXES {
        if let Some(base) = name.strip_suffix(suffix) {
            if !base.is_empty() {
                return (base, part);
            }
        }
    }
    (name, Part::Base)
}

/// The part of `family` that `sample_name` is, if it is `family` plus a known suffix
/// (or `family` itself).
fn part_of(family: &str, sample_name: &str) -> Option<Part> {
    let rest = sample_name.strip_prefix(family)?;
    if rest.is_empty() {
        return Some(Part::Base);
    }
    SUFFIXES
        .iter()
        .find(|(suffix, _)| *suffix == rest)
        .map(|(_, part)| *part)
}

/// A sample's labels: (name, unescaped value) pairs in page order.
pub type Labels = Vec<(Arc<str>, Arc<str>)>;

/// One sample line.
///
/// Strings are `Arc<str>` so that equal names, label names and label values of
/// consecutive samples of a family share one allocation (the parser's main cost;
/// docs/design.md §7 asks ≥ 100 MB/s). Compare with `&*s.name == "x"` or use
/// [`Sample::label`].
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Full sample name as written, incl. `_sum`/`_count`/`_bucket`/`_total`/`_created`.
    pub name: Arc<str>,
    /// Labels in page order, values unescaped. Empty for `name value` and `name{} value`.
    pub labels: Labels,
    /// The value; may be NaN or ±infinity.
    pub value: f64,
    /// Optional timestamp, milliseconds since the Unix epoch.
    pub timestamp_ms: Option<i64>,
}

impl Sample {
    /// The value of label `name`, if the sample has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| &**k == name)
            .map(|(_, v)| &**v)
    }

    /// Whether every `(name, value)` in `filter` equals this sample's label (an absent
    /// label counts as `""`, as in PromQL). An empty filter matches every sample.
    pub fn matches(&self, filter: &[(&str, &str)]) -> bool {
        filter
            .iter()
            .all(|(k, v)| self.label(k).unwrap_or("") == *v)
    }
}

/// One metric family: the samples under one `# TYPE` name.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    /// Family name: the `# TYPE`/`# HELP` name, or for undeclared samples the sample
    /// name less a `_sum`/`_count`/`_bucket`/`_created` suffix (module doc).
    pub name: String,
    /// Unescaped `# HELP` text, if any.
    pub help: Option<String>,
    /// Type from `# TYPE`, else [`MetricType::Untyped`].
    pub kind: MetricType,
    /// Samples in page order.
    pub samples: Vec<Sample>,
}

impl Family {
    fn new(name: &str) -> Family {
        Family {
            name: name.to_owned(),
            help: None,
            kind: MetricType::Untyped,
            samples: Vec::new(),
        }
    }

    fn part(&self, sample: &Sample) -> Option<Part> {
        part_of(&self.name, &sample.name)
    }

    /// `(Σ _sum, Σ _count)` over the series matching `label_filter`, for a summary **or**
    /// a histogram family (Felix's `felix_int_dataplane_apply_time_seconds` is a summary
    /// in most builds and a histogram in some: docs/design.md §3), also for an untyped family
    /// with those samples. Units are the family's (seconds for `*_seconds`; count is a
    /// plain number). `None` unless at least one `_sum` and one `_count` matched.
    ///
    /// Both are cumulative since the agent started: take the difference of two scrapes
    /// for the mean over a probe window (docs/design.md §3).
    pub fn sum_count(&self, label_filter: &[(&str, &str)]) -> Option<(f64, f64)> {
        let (mut sum, mut count) = (None::<f64>, None::<f64>);
        for s in self.samples.iter().filter(|s| s.matches(label_filter)) {
            match self.part(s) {
                Some(Part::Sum) => *sum.get_or_insert(0.0) += s.value,
                Some(Part::Count) => *count.get_or_insert(0.0) += s.value,
                _ => {}
            }
        }
        Some((sum?, count?))
    }

    /// `(quantile, value)` pairs of a summary, over all series, sorted by quantile (a
    /// family with several series yields each quantile once per series: use
    /// [`Family::quantiles_matching`]). Values are in the family's unit; client_golang
    /// computes them over a sliding 10-minute window, not the probe's. Empty for other
    /// types.
    pub fn quantiles(&self) -> Vec<(f64, f64)> {
        self.quantiles_matching(&[])
    }

    /// Like [`Family::quantiles`], only for series matching `label_filter`.
    pub fn quantiles_matching(&self, label_filter: &[(&str, &str)]) -> Vec<(f64, f64)> {
        if !matches!(self.kind, MetricType::Summary | MetricType::Untyped) {
            return Vec::new();
        }
        let mut out: Vec<(f64, f64)> = self
            .samples
            .iter()
            .filter(|s| self.part(s) == Some(Part::Base) && s.matches(label_filter))
            .filter_map(|s| Some((parse_float(s.label("quantile")?)?, s.value)))
            .collect();
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        out
    }

    /// Cumulative `(le, count)` buckets of a histogram, summed per `le` over all series
    /// (as PromQL `sum by (le)`), sorted by `le`; the last is `+Inf` and equals the
    /// `_count` in a consistent histogram. Empty for other types (and for untyped
    /// families without `_bucket{le}` samples).
    pub fn buckets(&self) -> Vec<(f64, f64)> {
        self.buckets_matching(&[])
    }

    /// Like [`Family::buckets`], only for series matching `label_filter`.
    pub fn buckets_matching(&self, label_filter: &[(&str, &str)]) -> Vec<(f64, f64)> {
        let mut out: Vec<(f64, f64)> = Vec::new();
        for s in &self.samples {
            if self.part(s) != Some(Part::Bucket) || !s.matches(label_filter) {
                continue;
            }
            let Some(le) = s.label("le").and_then(parse_float) else {
                continue;
            };
            // Few distinct `le`s per family (≈ 10–60): a linear search beats hashing floats.
            match out.iter_mut().find(|(b, _)| b.total_cmp(&le).is_eq()) {
                Some((_, c)) => *c += s.value,
                None => out.push((le, s.value)),
            }
        }
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        out
    }
}

/// A parsed `/metrics` page.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Page {
    /// Families by name (module doc, "Family grouping").
    pub families: BTreeMap<String, Family>,
}

impl Page {
    /// The family named `name`; failing that, when `name` is a sample name such as
    /// `x_total` or `x_sum`, the family `x` if its type has that suffix. `None` when the
    /// page lacks it (agents differ by version: a missing family is normal).
    pub fn family(&self, name: &str) -> Option<&Family> {
        if let Some(f) = self.families.get(name) {
            return Some(f);
        }
        let (base, part) = split_suffix(name);
        if part == Part::Base {
            return None;
        }
        self.families.get(base).filter(|f| f.kind.allows(part))
    }

    /// Σ value of the samples named `name` whose labels match `label_filter`
    /// ([`Sample::matches`]); for an OpenMetrics counter family `name` (samples
    /// `name_total`), the `_total` samples. `None` when no sample matched, and for a
    /// summary's quantile samples unless the filter names one `quantile` (a sum of
    /// quantiles means nothing: use [`Family::quantiles`] or [`Family::sum_count`]).
    /// Unit: the metric's.
    pub fn scalar(&self, name: &str, label_filter: &[(&str, &str)]) -> Option<f64> {
        let fam = self.family(name)?;
        if fam.kind == MetricType::Summary
            && fam.name == name
            && !label_filter.iter().any(|(k, _)| *k == "quantile")
        {
            return None;
        }
        let sum_named = |n: &str| -> Option<f64> {
            let mut acc = None::<f64>;
            for s in &fam.samples {
                if &*s.name == n && s.matches(label_filter) {
                    *acc.get_or_insert(0.0) += s.value;
                }
            }
            acc
        };
        sum_named(name).or_else(|| {
            if fam.kind == MetricType::Counter && fam.name == name {
                sum_named(&format!("{name}_total"))
            } else {
                None
            }
        })
    }

    /// Number of samples on the page.
    pub fn sample_count(&self) -> usize {
        self.families.values().map(|f| f.samples.len()).sum()
    }
}

/// A page that is not valid exposition text: where and what.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("metrics page line {line}: {kind}")]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What was wrong.
    pub kind: ParseErrorKind,
}

/// What was wrong with a line (see [`ParseError`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParseErrorKind {
    /// A metric name is missing or has a character outside `[a-zA-Z0-9_:]`.
    #[error("invalid metric name {0:?}")]
    BadMetricName(String),
    /// A label name is missing or has a character outside `[a-zA-Z0-9_]`.
    #[error("invalid label name {0:?}")]
    BadLabelName(String),
    /// Label set syntax: `expected` was needed where `found` (None: end of line) was.
    #[error("label set: expected {expected}, found {found:?}")]
    BadLabelSyntax {
        /// What the grammar needed, e.g. `'='`.
        expected: &'static str,
        /// The character seen instead; `None` at end of line.
        found: Option<char>,
    },
    /// A label value's closing `"` is missing.
    #[error("unterminated label value")]
    UnterminatedLabelValue,
    /// The same label name twice in one sample.
    #[error("duplicate label {0:?}")]
    DuplicateLabel(String),
    /// A sample line without a value.
    #[error("missing value")]
    MissingValue,
    /// A value that is not a float.
    #[error("invalid value {0:?}")]
    BadValue(String),
    /// A timestamp that is not an integer (milliseconds).
    #[error("invalid timestamp {0:?} (want integer milliseconds)")]
    BadTimestamp(String),
    /// Something after the timestamp.
    #[error("unexpected text after the timestamp: {0:?}")]
    TrailingText(String),
    /// `# TYPE` with a type that is not counter/gauge/summary/histogram/untyped.
    #[error("unknown metric type {0:?}")]
    BadType(String),
    /// A second `# TYPE` for a family with a different type.
    #[error("family {family:?} typed {first} and then {second}")]
    ConflictingType {
        /// Family name.
        family: String,
        /// Type from the first `# TYPE`.
        first: MetricType,
        /// Type from this line.
        second: MetricType,
    },
    /// `# TYPE` for a family that already has samples.
    #[error("TYPE line for {0:?} after its samples")]
    TypeAfterSamples(String),
    /// A sample name that the family's type does not allow (a histogram sample with
    /// the bare family name, say).
    #[error("sample {sample:?} does not fit {kind} family {family:?}")]
    SampleNotInType {
        /// Sample name.
        sample: String,
        /// Family name.
        family: String,
        /// Family type.
        kind: MetricType,
    },
    /// A summary sample without a float `quantile` label.
    #[error("summary sample without a valid quantile label")]
    BadQuantile,
    /// A histogram bucket without a float `le` label.
    #[error("histogram bucket without a valid le label")]
    BadLe,
    /// Non-blank text after `# EOF`.
    #[error("content after # EOF")]
    ContentAfterEof,
    /// A line longer than [`MAX_LINE_BYTES`].
    #[error("line of {bytes} bytes, over the {limit}-byte cap")]
    LineTooLong {
        /// The line's length, bytes.
        bytes: usize,
        /// The cap, bytes.
        limit: usize,
    },
    /// More than [`MAX_SAMPLES`] samples on the page.
    #[error("more than {0} samples on the page")]
    TooManySamples(usize),
    /// More than [`MAX_FAMILIES`] families on the page.
    #[error("more than {0} metric families on the page")]
    TooManyFamilies(usize),
    /// A sample with more than [`MAX_LABELS_PER_SAMPLE`] labels.
    #[error("sample with more than {0} labels")]
    TooManyLabels(usize),
    /// More than [`MAX_LABEL_PAIRS`] label pairs on the page.
    #[error("more than {0} label pairs on the page")]
    TooManyLabelPairs(usize),
}

impl ParseErrorKind {
    /// A short static name for metric labels and logs (`bad_value`, …).
    pub fn reason(&self) -> &'static str {
        match self {
            ParseErrorKind::BadMetricName(_) => "bad_metric_name",
            ParseErrorKind::BadLabelName(_) => "bad_label_name",
            ParseErrorKind::BadLabelSyntax { .. } => "bad_label_syntax",
            ParseErrorKind::UnterminatedLabelValue => "unterminated_label_value",
            ParseErrorKind::DuplicateLabel(_) => "duplicate_label",
            ParseErrorKind::MissingValue => "missing_value",
            ParseErrorKind::BadValue(_) => "bad_value",
            ParseErrorKind::BadTimestamp(_) => "bad_timestamp",
            ParseErrorKind::TrailingText(_) => "trailing_text",
            ParseErrorKind::BadType(_) => "bad_type",
            ParseErrorKind::ConflictingType { .. } => "conflicting_type",
            ParseErrorKind::TypeAfterSamples(_) => "type_after_samples",
            ParseErrorKind::SampleNotInType { .. } => "sample_not_in_type",
            ParseErrorKind::BadQuantile => "bad_quantile",
            ParseErrorKind::BadLe => "bad_le",
            ParseErrorKind::ContentAfterEof => "content_after_eof",
            ParseErrorKind::LineTooLong { .. } => "line_too_long",
            ParseErrorKind::TooManySamples(_) => "too_many_samples",
            ParseErrorKind::TooManyFamilies(_) => "too_many_families",
            ParseErrorKind::TooManyLabels(_) => "too_many_labels",
            ParseErrorKind::TooManyLabelPairs(_) => "too_many_label_pairs",
        }
    }
}

/// Reads a float as Go's `strconv.ParseFloat` does for exposition values: decimal and
/// exponent forms, `NaN`, `+Inf`, `-Inf` (case-insensitive, also `Infinity`).
fn parse_float(s: &str) -> Option<f64> {
    s.parse::<f64>().ok()
}

/// Parses one exposition page.
///
/// Input: the response body as text (the caller bounds its size). Output: every family
/// on the page (module doc for grouping and the decisions taken). Errors: the first
/// invalid line, with its 1-based number and what was wrong ([`ParseError`]), including
/// the first line that breaks one of the caps (module doc, "Caps"); never a panic,
/// whatever the input. Time is linear in `text.len()`.
pub fn parse(text: &str) -> Result<Page, ParseError> {
    let mut p = Parser::default();
    let mut eof = false;
    for (i, raw) in text.split('\n').enumerate() {
        let at = |kind| ParseError { line: i + 1, kind };
        if raw.len() > MAX_LINE_BYTES {
            return Err(at(ParseErrorKind::LineTooLong {
                bytes: raw.len(),
                limit: MAX_LINE_BYTES,
            }));
        }
        let line = raw.trim_end_matches('\r');
        let b = line.as_bytes();
        let start = skip_blanks(b, 0);
        if start == b.len() {
            continue;
        }
        if eof {
            return Err(at(ParseErrorKind::ContentAfterEof));
        }
        if b[start] == b'#' {
            match p.comment(line, start + 1) {
                Ok(Comment::Eof) => eof = true,
                Ok(Comment::Other) => {}
                Err(k) => return Err(at(k)),
            }
        } else {
            p.sample(line, start).map_err(at)?;
        }
    }
    Ok(p.finish())
}

#[derive(Default)]
struct Parser {
    families: Vec<Builder>,
    index: HashMap<String, usize>,
    current: Option<usize>,
    samples: usize,
    label_pairs: usize,
}

struct Builder {
    family: Family,
    /// A `# TYPE` line was seen.
    typed: bool,
}

enum Comment {
    Eof,
    Other,
}

#[inline]
fn is_blank(c: u8) -> bool {
    c == b' ' || c == b'\t'
}

#[inline]
fn skip_blanks(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && is_blank(b[i]) {
        i += 1;
    }
    i
}

#[inline]
fn is_name_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c == b':'
}

#[inline]
fn is_name_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b':'
}

#[inline]
fn is_label_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// End of the token starting at `i` (first blank or end of line).
#[inline]
fn token_end(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && !is_blank(b[i]) {
        i += 1;
    }
    i
}

/// Reads a metric name at `i`; returns its end. Error when it does not start right or
/// runs into a character that is neither a name character, a blank nor one of `stops`.
fn metric_name(line: &str, i: usize, stops: &[u8]) -> Result<usize, ParseErrorKind> {
    let b = line.as_bytes();
    let bad = |end: usize| ParseErrorKind::BadMetricName(line[i..end].to_owned());
    if i >= b.len() || !is_name_start(b[i]) {
        return Err(bad(token_end(b, i)));
    }
    let mut j = i + 1;
    while j < b.len() && is_name_char(b[j]) {
        j += 1;
    }
    if j < b.len() && !is_blank(b[j]) && !stops.contains(&b[j]) {
        return Err(bad(token_end(b, j)));
    }
    Ok(j)
}

/// Unescapes HELP text: `\\` → `\`, `\n` → newline; other escapes stay verbatim.
fn unescape_help(s: &str) -> String {
    if !s.contains('\\') {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find('\\') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        match after.as_bytes().first() {
            Some(b'\\') => {
                out.push('\\');
                rest = &after[1..];
            }
            Some(b'n') => {
                out.push('\n');
                rest = &after[1..];
            }
            _ => {
                out.push('\\');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Reads a quoted label value whose opening `"` is at `i - 1`; returns (value, index
/// after the closing `"`). Escapes `\\`, `\"`, `\n`; others stay verbatim.
fn label_value(line: &str, i: usize) -> Result<(Cow<'_, str>, usize), ParseErrorKind> {
    let b = line.as_bytes();
    let mut j = i;
    let mut escaped = false;
    while j < b.len() {
        match b[j] {
            b'"' => break,
            b'\\' => {
                escaped = true;
                j += 2;
            }
            _ => j += 1,
        }
    }
    if j >= b.len() {
        return Err(ParseErrorKind::UnterminatedLabelValue);
    }
    let raw = &line[i..j];
    if !escaped {
        return Ok((Cow::Borrowed(raw), j + 1));
    }
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(pos) = rest.find('\\') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        match after.as_bytes().first() {
            Some(b'\\') => {
                out.push('\\');
                rest = &after[1..];
            }
            Some(b'"') => {
                out.push('"');
                rest = &after[1..];
            }
            Some(b'n') => {
                out.push('\n');
                rest = &after[1..];
            }
            _ => {
                out.push('\\');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    Ok((Cow::Owned(out), j + 1))
}

/// `text` as an `Arc<str>`, sharing `prev`'s allocation when equal.
#[inline]
fn share(text: &str, prev: Option<&Arc<str>>) -> Arc<str> {
    match prev {
        Some(p) if **p == *text => Arc::clone(p),
        _ => Arc::from(text),
    }
}

/// Parses `{…}` starting at the `{` at `i`; returns (labels, index after `}`). Label
/// names and values equal to `prev`'s at the same position share its strings.
fn label_set(
    line: &str,
    i: usize,
    prev: &[(Arc<str>, Arc<str>)],
) -> Result<(Labels, usize), ParseErrorKind> {
    let b = line.as_bytes();
    let found = |j: usize| line.get(j..).and_then(|s| s.chars().next());
    let mut labels: Labels = Vec::with_capacity(prev.len().max(2));
    let mut j = i + 1;
    loop {
        j = skip_blanks(b, j);
        if j < b.len() && b[j] == b'}' {
            j += 1;
            break;
        }
        // Label name.
        let start = j;
        if j >= b.len() || !(b[j].is_ascii_alphabetic() || b[j] == b'_') {
            let end = (start..b.len())
                .find(|&k| matches!(b[k], b'=' | b',' | b'}' | b' ' | b'\t'))
                .unwrap_or(b.len());
            return Err(ParseErrorKind::BadLabelName(line[start..end].to_owned()));
        }
        while j < b.len() && is_label_char(b[j]) {
            j += 1;
        }
        if j < b.len() && !is_blank(b[j]) && b[j] != b'=' {
            // A character not allowed in a label name, e.g. `a-b="x"` or `a.b="x"`.
            let end = (j..b.len())
                .find(|&k| matches!(b[k], b'=' | b',' | b'}' | b' ' | b'\t'))
                .unwrap_or(b.len());
            return Err(ParseErrorKind::BadLabelName(line[start..end].to_owned()));
        }
        let name = &line[start..j];
        j = skip_blanks(b, j);
        if j >= b.len() || b[j] != b'=' {
            return Err(ParseErrorKind::BadLabelSyntax {
                expected: "'='",
                found: found(j),
            });
        }
        j = skip_blanks(b, j + 1);
        if j >= b.len() || b[j] != b'"' {
            return Err(ParseErrorKind::BadLabelSyntax {
                expected: "'\"'",
                found: found(j),
            });
        }
        let (value, next) = label_value(line, j + 1)?;
        if labels.len() >= MAX_LABELS_PER_SAMPLE {
            return Err(ParseErrorKind::TooManyLabels(MAX_LABELS_PER_SAMPLE));
        }
        let p = prev.get(labels.len());
        labels.push((share(name, p.map(|p| &p.0)), share(&value, p.map(|p| &p.1))));
        j = skip_blanks(b, next);
        match b.get(j) {
            Some(b',') => j += 1,
            Some(b'}') => {
                j += 1;
                break;
            }
            _ => {
                return Err(ParseErrorKind::BadLabelSyntax {
                    expected: "',' or '}'",
                    found: found(j),
                })
            }
        }
    }
    check_duplicate_labels(&labels)?;
    Ok((labels, j))
}

fn check_duplicate_labels(labels: &[(Arc<str>, Arc<str>)]) -> Result<(), ParseErrorKind> {
    if labels.len() <= 16 {
        for (n, (a, _)) in labels.iter().enumerate() {
            if labels[..n].iter().any(|(b, _)| a == b) {
                return Err(ParseErrorKind::DuplicateLabel(a.to_string()));
            }
        }
    } else {
        let mut seen = std::collections::HashSet::with_capacity(labels.len());
        for (a, _) in labels {
            if !seen.insert(&**a) {
                return Err(ParseErrorKind::DuplicateLabel(a.to_string()));
            }
        }
    }
    Ok(())
}

impl Parser {
    fn family_index(&mut self, name: &str) -> Result<usize, ParseErrorKind> {
        if let Some(&i) = self.index.get(name) {
            return Ok(i);
        }
        let i = self.families.len();
        if i >= MAX_FAMILIES {
            return Err(ParseErrorKind::TooManyFamilies(MAX_FAMILIES));
        }
        self.families.push(Builder {
            family: Family::new(name),
            typed: false,
        });
        self.index.insert(name.to_owned(), i);
        Ok(i)
    }

    /// A `#` line; `i` is just after the `#`.
    fn comment(&mut self, line: &str, i: usize) -> Result<Comment, ParseErrorKind> {
        let b = line.as_bytes();
        let i = skip_blanks(b, i);
        let kw_end = token_end(b, i);
        let keyword = &line[i..kw_end];
        match keyword {
            "HELP" | "TYPE" => {}
            "EOF" if skip_blanks(b, kw_end) == b.len() => return Ok(Comment::Eof),
            _ => return Ok(Comment::Other),
        }
        let name_start = skip_blanks(b, kw_end);
        let name_end = metric_name(line, name_start, &[])?;
        let name = &line[name_start..name_end];
        let rest_start = skip_blanks(b, name_end);
        let rest = &line[rest_start..];
        let idx = self.family_index(name)?;
        self.current = Some(idx);
        let builder = &mut self.families[idx];
        if keyword == "HELP" {
            if builder.family.help.is_none() {
                builder.family.help = Some(unescape_help(rest));
            }
            return Ok(Comment::Other);
        }
        let word = rest.trim_end_matches([' ', '\t']);
        let kind = MetricType::from_keyword(word)
            .ok_or_else(|| ParseErrorKind::BadType(word.to_owned()))?;
        if builder.typed {
            if builder.family.kind != kind {
                return Err(ParseErrorKind::ConflictingType {
                    family: name.to_owned(),
                    first: builder.family.kind,
                    second: kind,
                });
            }
        } else if !builder.family.samples.is_empty() {
            return Err(ParseErrorKind::TypeAfterSamples(name.to_owned()));
        } else {
            builder.family.kind = kind;
            builder.typed = true;
        }
        Ok(Comment::Other)
    }

    /// Finds (or creates) the family of sample `name` (module doc, "Family grouping").
    fn resolve(&mut self, name: &str) -> Result<(usize, Part), ParseErrorKind> {
        // 1. The current family (the common case: contiguous samples after # TYPE).
        if let Some(c) = self.current {
            let fam = &self.families[c].family;
            if let Some(part) = part_of(&fam.name, name) {
                if fam.kind.allows(part) {
                    return Ok((c, part));
                }
            }
        }
        // 2. A family of exactly this name.
        if let Some(&f) = self.index.get(name) {
            let fam = &self.families[f].family;
            if !fam.kind.allows(Part::Base) {
                return Err(ParseErrorKind::SampleNotInType {
                    sample: name.to_owned(),
                    family: fam.name.clone(),
                    kind: fam.kind,
                });
            }
            return Ok((f, Part::Base));
        }
        // 3. A family named by the base, whose type has this suffix.
        let (base, part) = split_suffix(name);
        let base_family = if part == Part::Base {
            None
        } else {
            self.index.get(base).copied()
        };
        if let Some(f) = base_family {
            if self.families[f].family.kind.allows(part) {
                return Ok((f, part));
            }
        }
        // 4. A new untyped family, grouped by suffix when the base is free.
        let by_suffix = matches!(part, Part::Bucket | Part::Sum | Part::Count | Part::Created);
        if by_suffix && base_family.is_none() {
            Ok((self.family_index(base)?, part))
        } else {
            Ok((self.family_index(name)?, Part::Base))
        }
    }

    /// A sample line; `i` is the start of the metric name.
    fn sample(&mut self, line: &str, i: usize) -> Result<(), ParseErrorKind> {
        if self.samples >= MAX_SAMPLES {
            return Err(ParseErrorKind::TooManySamples(MAX_SAMPLES));
        }
        let b = line.as_bytes();
        let name_end = metric_name(line, i, b"{")?;
        let name = &line[i..name_end];
        // The family first, so that this sample can share strings with the previous one.
        let (idx, part) = self.resolve(name)?;
        self.current = Some(idx);
        let fam = &mut self.families[idx].family;
        let prev = fam.samples.last();
        let mut j = skip_blanks(b, name_end);
        let mut labels = Vec::new();
        if j < b.len() && b[j] == b'{' {
            let (l, next) = label_set(line, j, prev.map_or(&[][..], |p| &p.labels[..]))?;
            labels = l;
            j = skip_blanks(b, next);
        }
        let name = share(name, prev.map(|p| &p.name));
        let value_end = token_end(b, j);
        if value_end == j {
            return Err(ParseErrorKind::MissingValue);
        }
        let value_text = &line[j..value_end];
        let value = parse_float(value_text)
            .ok_or_else(|| ParseErrorKind::BadValue(value_text.to_owned()))?;
        j = skip_blanks(b, value_end);
        let mut timestamp_ms = None;
        if j < b.len() && b[j] != b'#' {
            let ts_end = token_end(b, j);
            let ts_text = &line[j..ts_end];
            timestamp_ms = Some(
                ts_text
                    .parse::<i64>()
                    .map_err(|_| ParseErrorKind::BadTimestamp(ts_text.to_owned()))?,
            );
            j = skip_blanks(b, ts_end);
            if j < b.len() && b[j] != b'#' {
                return Err(ParseErrorKind::TrailingText(line[j..].to_owned()));
            }
        }
        // Anything left starts with '#': an OpenMetrics exemplar, ignored.

        let check = |label: &str| {
            labels
                .iter()
                .find(|(k, _)| &**k == label)
                .and_then(|(_, v)| parse_float(v))
                .is_some()
        };
        match (fam.kind, part) {
            (MetricType::Summary, Part::Base) if !check("quantile") => {
                return Err(ParseErrorKind::BadQuantile)
            }
            (MetricType::Histogram, Part::Bucket) if !check("le") => {
                return Err(ParseErrorKind::BadLe)
            }
            _ => {}
        }
        self.label_pairs += labels.len();
        if self.label_pairs > MAX_LABEL_PAIRS {
            return Err(ParseErrorKind::TooManyLabelPairs(MAX_LABEL_PAIRS));
        }
        self.samples += 1;
        fam.samples.push(Sample {
            name,
            labels,
            value,
            timestamp_ms,
        });
        Ok(())
    }

    fn finish(self) -> Page {
        Page {
            families: self
                .families
                .into_iter()
                .map(|b| (b.family.name.clone(), b.family))
                .collect(),
        }
    }
}

/// Writes a float as the exposition format spells it: `NaN`, `+Inf`, `-Inf`, else the
/// shortest text that reads back to the same `f64`.
pub fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else if v == f64::INFINITY {
        "+Inf".to_owned()
    } else if v == f64::NEG_INFINITY {
        "-Inf".to_owned()
    } else if v != 0.0 && (v.abs() >= 1e16 || v.abs() < 1e-5) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

fn escape_label_value(v: &str, out: &mut String) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn escape_help(v: &str, out: &mut String) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Renders the page as 0.0.4 exposition text: per family (by name) `# HELP` (if any),
/// `# TYPE` (always), then its samples in order; every line ends in `\n`. [`parse`]
/// reads it back to an equal page (tested by property tests), so the testbed and tests
/// can serve what they built.
impl fmt::Display for Page {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut line = String::new();
        for fam in self.families.values() {
            if let Some(help) = &fam.help {
                line.clear();
                line.push_str("# HELP ");
                line.push_str(&fam.name);
                line.push(' ');
                escape_help(help, &mut line);
                writeln!(f, "{line}")?;
            }
            writeln!(f, "# TYPE {} {}", fam.name, fam.kind)?;
            for s in &fam.samples {
                line.clear();
                line.push_str(&s.name);
                if !s.labels.is_empty() {
                    line.push('{');
                    for (n, (k, v)) in s.labels.iter().enumerate() {
                        if n > 0 {
                            line.push(',');
                        }
                        line.push_str(k);
                        line.push_str("=\"");
                        escape_label_value(v, &mut line);
                        line.push('"');
                    }
                    line.push('}');
                }
                line.push(' ');
                line.push_str(&format_value(s.value));
                if let Some(ts) = s.timestamp_ms {
                    line.push(' ');
                    line.push_str(&ts.to_string());
                }
                writeln!(f, "{line}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_quantiles_sum_and_count_group_under_the_type_name() {
        let page = parse(
            "# TYPE a summary\na{quantile=\"0.5\"} 1\na{quantile=\"0.9\"} 2\na_sum 10\na_count 4\n",
        )
        .expect("valid page");
        let fam = page.family("a").expect("family a");
        assert_eq!(fam.kind, MetricType::Summary);
        assert_eq!(fam.samples.len(), 4);
        assert_eq!(fam.quantiles(), vec![(0.5, 1.0), (0.9, 2.0)]);
        assert_eq!(fam.sum_count(&[]), Some((10.0, 4.0)));
    }

    #[test]
    fn untyped_samples_group_by_suffix() {
        let page = parse("x_sum 3\nx_count 2\ny_total 5\n").expect("valid page");
        assert_eq!(page.families.len(), 2);
        assert_eq!(
            page.family("x").and_then(|f| f.sum_count(&[])),
            Some((3.0, 2.0))
        );
        assert_eq!(page.scalar("y_total", &[]), Some(5.0));
        assert_eq!(page.scalar("x_sum", &[]), Some(3.0));
    }

    #[test]
    fn label_value_escapes_are_undone() {
        let page = parse(r#"m{a="x\\y\"z\nw",b="\t"} 1"#).expect("valid page");
        let s = &page.families["m"].samples[0];
        assert_eq!(s.label("a"), Some("x\\y\"z\nw"));
        assert_eq!(s.label("b"), Some("\\t"));
    }

    #[test]
    fn format_value_reads_back() {
        for v in [
            0.0,
            -0.0,
            1.0,
            1e-300,
            1.5e300,
            0.1,
            123456789.125,
            f64::MIN_POSITIVE,
        ] {
            let text = format_value(v);
            assert_eq!(parse_float(&text), Some(v), "{text}");
        }
    }
}

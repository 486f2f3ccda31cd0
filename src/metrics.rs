//! The counters and histograms, one registry.
//!
//! Two sources make one scrape. The gateway's own families live in a prometheus-client
//! [`Registry`] that request handlers update directly. The mutex keeps plain atomics
//! (`mutex::stats`) so that it depends on no metrics library and a scrape never waits on
//! its owner thread; those are copied into a throwaway registry at each render, so both
//! halves go through the same encoder and the output is one valid Prometheus text
//! exposition (version 0.0.4).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::mutex::Shared;
use crate::mutex::stats::Histogram as AtomicHistogram;

/// The `Content-Type` of what [`Metrics::render`] returns.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Seconds, for a whole request or an executor call: from 0.5 ms to 30 s, because an
/// upstream may take its full timeout.
const DURATION_BOUNDS: [f64; 15] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Every reason a trade is refused with 503: the mutex's `Unavailable::reason()` labels,
/// the operator's kill switch, an order that could outlast the drain at SIGTERM, and
/// `server.max_connections` orders at the executor already.
pub const REFUSED_REASONS: [&str; 9] = [
    "not_open",
    "commit_failed",
    "timeout",
    "busy",
    "capacity",
    "stopped",
    "kill_switch",
    "stopping",
    crate::gateway::problem::ORDERS_IN_FLIGHT,
];

/// Every executor outcome label.
pub const EXECUTOR_OUTCOMES: [&str; 5] = ["success", "soft_fail", "failed", "not_sent", "unknown"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    status: u16,
    /// The problem `code`, empty for a success.
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

/// The gateway's metrics. Share it in an `Arc`; every method takes `&self`.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    request_duration: Histogram,
    refused: Family<ReasonLabels, Counter>,
    executor_outcomes: Family<OutcomeLabels, Counter>,
    executor_duration: Histogram,
    duplicates: Counter,
    rate_limited: Counter,
    connections_refused: Counter,
    tls_not_after: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        // Names carry no `_total`: the encoder appends it to counters.
        let mut registry = Registry::with_prefix("hoox");
        let requests = Family::<RequestLabels, Counter>::default();
        let request_duration = Histogram::new(DURATION_BOUNDS);
        let refused = Family::<ReasonLabels, Counter>::default();
        let executor_outcomes = Family::<OutcomeLabels, Counter>::default();
        let executor_duration = Histogram::new(DURATION_BOUNDS);
        let duplicates = Counter::default();
        let rate_limited = Counter::default();
        let connections_refused = Counter::default();
        let tls_not_after = Gauge::default();
        registry.register(
            "tls_certificate_expiry_timestamp_seconds",
            "When the served TLS certificate expires, unix seconds (0: unknown)",
            tls_not_after.clone(),
        );
        registry.register(
            "requests",
            "Webhook requests answered, by status and problem code",
            requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time from request head to answer",
            request_duration.clone(),
        );
        registry.register(
            "refused",
            "Trades refused with 503, by reason (mutex unavailable, kill_switch, or stopping)",
            refused.clone(),
        );
        registry.register(
            "executor_outcomes",
            "Executor calls, by outcome",
            executor_outcomes.clone(),
        );
        registry.register(
            "executor_duration_seconds",
            "Time the executor took to answer, or to fail to be reached",
            executor_duration.clone(),
        );
        registry.register(
            "duplicates",
            "Deliveries refused as duplicates of a live key",
            duplicates.clone(),
        );
        registry.register(
            "rate_limited",
            "Requests refused by the rate limit",
            rate_limited.clone(),
        );
        registry.register(
            "connections_refused",
            "Connections closed at once, over their address's share: server.max_connections_per_ip, or for an address outside limits.allow_ips one, and 16 for all such; and at server.max_connections, those closed in a TLS handshake that had taken over a second, to take one waiting",
            connections_refused.clone(),
        );
        // Families whose labels are known are created at zero, so that a rate() or an alert
        // has a series to watch before the first event.
        for reason in REFUSED_REASONS {
            drop(refused.get_or_create(&ReasonLabels { reason }));
        }
        for outcome in EXECUTOR_OUTCOMES {
            drop(executor_outcomes.get_or_create(&OutcomeLabels { outcome }));
        }
        Metrics {
            registry,
            requests,
            request_duration,
            refused,
            executor_outcomes,
            executor_duration,
            duplicates,
            rate_limited,
            connections_refused,
            tls_not_after,
        }
    }

    /// One answered webhook. `code` is the problem code of an error answer.
    pub fn request(&self, status: u16, code: Option<&'static str>, elapsed: Duration) {
        self.requests
            .get_or_create(&RequestLabels {
                status,
                code: code.unwrap_or(""),
            })
            .inc();
        self.request_duration.observe(elapsed.as_secs_f64());
    }

    /// A 503: one of [`REFUSED_REASONS`].
    pub fn refused(&self, reason: &'static str) {
        self.refused.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// One executor call: `success`, `soft_fail`, `failed`, `not_sent` or `unknown`.
    pub fn executor(&self, outcome: &'static str, elapsed: Duration) {
        self.executor_outcomes
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
        self.executor_duration.observe(elapsed.as_secs_f64());
    }

    pub fn duplicate(&self) {
        self.duplicates.inc();
    }

    pub fn rate_limited(&self) {
        self.rate_limited.inc();
    }

    pub fn connection_refused(&self) {
        self.connections_refused.inc();
    }

    /// The served certificate's end, for an alert ahead of it.
    pub fn tls_served(&self, validity: Option<crate::gateway::tls::Validity>) {
        self.tls_not_after.set(validity.map_or(0, |v| v.not_after));
    }

    /// The whole scrape: the gateway's families, then the mutex's.
    pub fn render(&self, shared: &Shared) -> String {
        let mut out = String::with_capacity(8 * 1024);
        // Writing into a String cannot fail, and every metric here encodes infallibly.
        let _ = prometheus_text::encode(&mut out, &self.registry);
        let _ = prometheus_text::encode(&mut out, &mutex_registry(shared));
        out
    }
}

/// A registry holding a copy of the mutex's atomics, made for one scrape.
fn mutex_registry(shared: &Shared) -> Registry {
    let s = &shared.stats;
    let mut r = Registry::with_prefix("hoox_mutex");
    let counters: [(&str, &str, &AtomicU64); 11] = [
        ("reserves", "Reserve requests decided", &s.reserves),
        ("proceeds", "Reserves answered Proceed", &s.proceeds),
        ("duplicates", "Reserves answered Duplicate", &s.duplicates),
        ("mismatches", "Reserves answered Mismatch", &s.mismatches),
        (
            "unavailable",
            "Reserves refused: failing closed, busy, timed out, at capacity, stopping or halted",
            &s.unavailable,
        ),
        ("commits", "Keys committed", &s.commits),
        (
            "releases",
            "Keys the gateway released (its order failed or was not sent)",
            &s.releases,
        ),
        (
            "operator_releases",
            "Keys an operator released (keys release)",
            &s.operator_releases,
        ),
        (
            "release_failures",
            "Releases refused while failing closed (made at the reopen, or the key lives until its TTL)",
            &s.release_failures,
        ),
        (
            "expired",
            "Entries ended by their TTL: reaped, or replaced by a reserve of their key",
            &s.expired,
        ),
        (
            "reopen_attempts",
            "Attempts to reopen a failed database",
            &s.reopen_attempts,
        ),
    ];
    for (name, help, c) in counters {
        r.register(name, help, ConstCounter::new(c.load(Ordering::Relaxed)));
    }
    let flag =
        |b: &std::sync::atomic::AtomicBool| ConstGauge::new(b.load(Ordering::Relaxed) as i64);
    r.register(
        "live_keys",
        "Live keys held (while failing closed: those held when it failed)",
        ConstGauge::new(shared.live_keys.load(Ordering::Relaxed) as i64),
    );
    r.register(
        "halted",
        "1 while the kill switch is on",
        flag(&shared.halted),
    );
    // What `/readyz` and `status` call serving: a full index refuses every new trade as a
    // closed database does, and an alert on this gauge must fire for both.
    let full = shared.at_capacity.load(Ordering::Relaxed);
    r.register(
        "serving",
        "1 while the mutex takes new trades: its database open, and not full (hoox_mutex_at_capacity)",
        ConstGauge::new(i64::from(shared.serving.load(Ordering::Relaxed) && !full)),
    );
    r.register(
        "at_capacity",
        "1 while fewer than two places are left under limits.capacity (too few for a signed trade): new trades are refused (503) until keys expire",
        ConstGauge::new(i64::from(full)),
    );
    r.register(
        "fsync_seconds",
        "Time one group commit took to become durable",
        HistogramCopy::of(&s.fsync_seconds),
    );
    r.register(
        "checkpoint_seconds",
        "Time one checkpoint of the journal into the database took; the mutex answers nobody meanwhile",
        HistogramCopy::of(&s.checkpoint_seconds),
    );
    r.register(
        "batch_size",
        "Commands the owner took in one turn; a turn that grants a key is one group commit, reads and carried commits take turns too",
        HistogramCopy::of(&s.batch_size),
    );
    r
}

/// A histogram read once from the mutex's atomics.
#[derive(Debug)]
struct HistogramCopy {
    /// `(upper bound, count in that bucket alone)`; the encoder makes them cumulative.
    buckets: Vec<(f64, u64)>,
    sum: f64,
}

impl HistogramCopy {
    fn of(h: &AtomicHistogram) -> Self {
        let (buckets, sum, _) = h.snapshot();
        HistogramCopy { buckets, sum }
    }
}

impl EncodeMetric for HistogramCopy {
    fn encode(&self, mut encoder: MetricEncoder) -> fmt::Result {
        // The count is taken from the buckets rather than the separate atomic, so that
        // `_count` always equals the `+Inf` bucket even if an observation raced the read.
        let count = self.buckets.iter().map(|(_, c)| c).sum();
        encoder.encode_histogram::<NoLabelSet>(self.sum, count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mutex::stats::inc;
    use std::collections::{BTreeMap, HashMap, HashSet};

    /// One sample line: name, labels, value.
    type Sample = (String, BTreeMap<String, String>, f64);

    /// A strict reader of the Prometheus text format, enough to hold our output to it: one
    /// HELP and one TYPE per family, before its samples; every sample belongs to the family
    /// declared last; well-formed labels; numeric values; cumulative histogram buckets
    /// ending in `+Inf` equal to `_count`.
    fn parse(text: &str) -> Result<(HashMap<String, String>, Vec<Sample>), String> {
        let mut types = HashMap::new();
        let mut helps = HashSet::new();
        let mut current: Option<(String, String)> = None;
        let mut samples = Vec::new();
        let valid_name = |n: &str| {
            !n.is_empty()
                && !n.starts_with(|c: char| c.is_ascii_digit())
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        };
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap_or("");
                if !helps.insert(name.to_string()) {
                    return Err(format!("second HELP for {name}"));
                }
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut it = rest.split(' ');
                let (name, ty) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
                if !["counter", "gauge", "histogram", "untyped"].contains(&ty) {
                    return Err(format!("bad type {line}"));
                }
                if !helps.contains(name) || types.insert(name.to_string(), ty.to_string()).is_some()
                {
                    return Err(format!("TYPE without HELP, or repeated: {line}"));
                }
                current = Some((name.to_string(), ty.to_string()));
            } else if line.starts_with('#') || line.is_empty() {
                return Err(format!("unexpected line {line:?}"));
            } else {
                let (series, value) = line.rsplit_once(' ').ok_or(line)?;
                let value = match value {
                    "+Inf" => f64::INFINITY,
                    v => v.parse::<f64>().map_err(|_| format!("bad value {line}"))?,
                };
                let (name, labels) = match series.split_once('{') {
                    None => (series, BTreeMap::new()),
                    Some((name, rest)) => {
                        let body = rest.strip_suffix('}').ok_or(line)?;
                        let mut labels = BTreeMap::<String, String>::new();
                        for pair in body.split(',') {
                            let (k, v) = pair.split_once('=').ok_or(line)?;
                            let v = v.strip_prefix('"').and_then(|v| v.strip_suffix('"'));
                            if !valid_name(k)
                                || labels.insert(k.into(), v.ok_or(line)?.into()).is_some()
                            {
                                return Err(format!("bad labels {line}"));
                            }
                        }
                        (name, labels)
                    }
                };
                let (family, ty) = current.as_ref().ok_or("sample before TYPE")?;
                let suffix = name.strip_prefix(family.as_str()).ok_or(line)?;
                let ok = match ty.as_str() {
                    "histogram" => ["_bucket", "_sum", "_count"].contains(&suffix),
                    _ => suffix.is_empty(),
                };
                if !valid_name(name) || !ok {
                    return Err(format!("sample outside its family: {line}"));
                }
                samples.push((name.to_string(), labels, value));
            }
        }
        // Histograms: cumulative, ending in +Inf, equal to _count.
        for (family, ty) in &types {
            if ty != "histogram" {
                continue;
            }
            let bucket = format!("{family}_bucket");
            let les: Vec<(f64, f64)> = samples
                .iter()
                .filter(|(n, _, _)| *n == bucket)
                .map(|(_, l, v)| {
                    let le = match l["le"].as_str() {
                        "+Inf" => f64::INFINITY,
                        s => s.parse().unwrap_or(f64::NAN),
                    };
                    (le, *v)
                })
                .collect();
            let count = samples
                .iter()
                .find(|(n, _, _)| *n == format!("{family}_count"))
                .map(|s| s.2);
            if les
                .windows(2)
                .any(|w| !(w[0].0 < w[1].0 && w[0].1 <= w[1].1))
                || les.last().map(|l| l.0) != Some(f64::INFINITY)
                || les.last().map(|l| l.1) != count
            {
                return Err(format!("histogram {family} malformed: {les:?}"));
            }
        }
        Ok((types, samples))
    }

    fn value(samples: &[Sample], name: &str, label: Option<(&str, &str)>) -> Option<f64> {
        samples
            .iter()
            .find(|(n, l, _)| {
                n == name && label.is_none_or(|(k, v)| l.get(k).map(String::as_str) == Some(v))
            })
            .map(|s| s.2)
    }

    #[test]
    fn render_is_valid_prometheus_text_and_counts_move() {
        let m = Metrics::new();
        let shared = Shared::default();
        let (types, before) = parse(&m.render(&shared)).unwrap();
        // Every mutex family is there even before anything happened.
        for (family, ty) in [
            ("hoox_mutex_reserves_total", "counter"),
            ("hoox_mutex_operator_releases_total", "counter"),
            ("hoox_mutex_release_failures_total", "counter"),
            ("hoox_mutex_reopen_attempts_total", "counter"),
            ("hoox_mutex_live_keys", "gauge"),
            ("hoox_mutex_halted", "gauge"),
            ("hoox_mutex_serving", "gauge"),
            ("hoox_mutex_at_capacity", "gauge"),
            ("hoox_mutex_fsync_seconds", "histogram"),
            ("hoox_mutex_batch_size", "histogram"),
            ("hoox_mutex_checkpoint_seconds", "histogram"),
            ("hoox_request_duration_seconds", "histogram"),
            ("hoox_duplicates_total", "counter"),
            ("hoox_rate_limited_total", "counter"),
            ("hoox_connections_refused_total", "counter"),
            ("hoox_refused_total", "counter"),
            ("hoox_executor_outcomes_total", "counter"),
        ] {
            assert_eq!(types.get(family).map(String::as_str), Some(ty), "{family}");
        }
        assert_eq!(value(&before, "hoox_mutex_reserves_total", None), Some(0.0));
        for reason in REFUSED_REASONS {
            let r = Some(("reason", reason));
            assert_eq!(
                value(&before, "hoox_refused_total", r),
                Some(0.0),
                "{reason}"
            );
        }

        m.request(200, None, Duration::from_millis(3));
        m.request(503, Some("KILL_SWITCH"), Duration::from_millis(1));
        m.request(503, Some("KILL_SWITCH"), Duration::from_millis(1));
        m.refused("kill_switch");
        m.refused("not_open");
        m.executor("success", Duration::from_millis(20));
        m.duplicate();
        m.rate_limited();
        m.connection_refused();
        inc(&shared.stats.reserves);
        inc(&shared.stats.reserves);
        inc(&shared.stats.release_failures);
        shared.live_keys.store(7, Ordering::Relaxed);
        shared.halted.store(true, Ordering::Relaxed);
        shared.stats.fsync_seconds.observe(0.0003);
        shared.stats.fsync_seconds.observe(0.002);
        shared.stats.fsync_seconds.observe(3.0); // beyond the last bound: +Inf only
        shared.stats.batch_size.observe(5.0);

        let (_, s) = parse(&m.render(&shared)).unwrap();
        let code = |c| Some(("code", c));
        assert_eq!(
            value(&s, "hoox_requests_total", code("KILL_SWITCH")),
            Some(2.0)
        );
        assert_eq!(value(&s, "hoox_requests_total", code("")), Some(1.0));
        assert_eq!(
            value(&s, "hoox_request_duration_seconds_count", None),
            Some(3.0)
        );
        let reason = |r| Some(("reason", r));
        assert_eq!(
            value(&s, "hoox_refused_total", reason("kill_switch")),
            Some(1.0)
        );
        assert_eq!(
            value(&s, "hoox_refused_total", reason("not_open")),
            Some(1.0)
        );
        let outcome = Some(("outcome", "success"));
        assert_eq!(
            value(&s, "hoox_executor_outcomes_total", outcome),
            Some(1.0)
        );
        assert_eq!(value(&s, "hoox_duplicates_total", None), Some(1.0));
        assert_eq!(value(&s, "hoox_rate_limited_total", None), Some(1.0));
        assert_eq!(value(&s, "hoox_connections_refused_total", None), Some(1.0));
        assert_eq!(value(&s, "hoox_mutex_reserves_total", None), Some(2.0));
        assert_eq!(
            value(&s, "hoox_mutex_release_failures_total", None),
            Some(1.0)
        );
        assert_eq!(value(&s, "hoox_mutex_live_keys", None), Some(7.0));
        assert_eq!(value(&s, "hoox_mutex_halted", None), Some(1.0));
        assert_eq!(value(&s, "hoox_mutex_serving", None), Some(0.0));
        let fsync = "hoox_mutex_fsync_seconds_bucket";
        assert_eq!(value(&s, fsync, Some(("le", "0.00025"))), Some(0.0));
        assert_eq!(value(&s, fsync, Some(("le", "0.0005"))), Some(1.0));
        assert_eq!(value(&s, fsync, Some(("le", "1"))), Some(2.0));
        assert_eq!(value(&s, fsync, Some(("le", "+Inf"))), Some(3.0));
        assert_eq!(value(&s, "hoox_mutex_fsync_seconds_count", None), Some(3.0));
        let sum = value(&s, "hoox_mutex_fsync_seconds_sum", None).unwrap();
        assert!((sum - 3.0023).abs() < 1e-6, "{sum}");
        let batch = "hoox_mutex_batch_size_bucket";
        assert_eq!(value(&s, batch, Some(("le", "4"))), Some(0.0));
        assert_eq!(value(&s, batch, Some(("le", "8"))), Some(1.0));
    }

    #[test]
    fn the_reader_rejects_what_prometheus_would() {
        // The test parser must be able to fail, or the test above proves nothing.
        let good = "# HELP a_total x\n# TYPE a_total counter\na_total 1\n";
        assert!(parse(good).is_ok());
        assert!(parse(&format!("{good}{good}")).is_err(), "repeated family");
        assert!(parse("a_total 1\n").is_err(), "no TYPE");
        assert!(
            parse("# HELP a x\n# TYPE a gauge\nb 1\n").is_err(),
            "foreign sample"
        );
        assert!(
            parse("# HELP a x\n# TYPE a gauge\na one\n").is_err(),
            "bad value"
        );
        let hist = "# HELP h x\n# TYPE h histogram\n";
        let bad = format!("{hist}h_bucket{{le=\"1\"}} 2\nh_bucket{{le=\"+Inf\"}} 1\nh_count 1\n");
        assert!(parse(&bad).is_err(), "not cumulative");
    }
}

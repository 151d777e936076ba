//! Encoding of [`Family`]s: OpenMetrics 1.0 text through the official `prometheus-client`
//! registry, and the Prometheus text format 0.0.4 derived from it (for scrapers that ask
//! only for `text/plain; version=0.0.4`).

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family as PFamily;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::{Family, Histogram, Kind};

type Labels = Vec<(String, String)>;

/// A histogram already observed elsewhere, encoded as it is (classic buckets).
#[derive(Debug)]
struct Observed(Histogram);

impl EncodeMetric for Observed {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<NoLabelSet>(self.0.sum, self.0.count, &self.0.buckets(), None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// The OpenMetrics text of `families`, ending in `# EOF`.
pub fn openmetrics(families: &[Family]) -> String {
    openmetrics_with(families, &[])
}

/// The same, every sample carrying the constant labels `labels` too (the exporter's
/// `node` when `NODE_NAME` is set).
pub fn openmetrics_with(families: &[Family], labels: &[(String, String)]) -> String {
    let mut registry = Registry::with_labels(
        labels
            .iter()
            .map(|(k, v)| (k.clone().into(), v.clone().into())),
    );
    for f in families
        .iter()
        .filter(|f| !f.samples.is_empty() || f.histogram.is_some())
    {
        match f.kind {
            Kind::Histogram => {
                if let Some(h) = &f.histogram {
                    registry.register(f.name, f.help, Observed(h.clone()));
                }
            }
            Kind::Gauge => {
                let fam = PFamily::<Labels, Gauge<f64, AtomicU64>>::default();
                for s in &f.samples {
                    fam.get_or_create(&s.labels).set(s.value);
                }
                registry.register(f.name, f.help, fam);
            }
            // Whole counts as integers; a counter of seconds (CPU time) as a float.
            Kind::Counter if f.samples.iter().all(|s| s.value.fract() == 0.0) => {
                let fam = PFamily::<Labels, Counter<u64>>::default();
                for s in &f.samples {
                    fam.get_or_create(&s.labels).inc_by(s.value.max(0.0) as u64);
                }
                registry.register(f.name, f.help, fam);
            }
            Kind::Counter => {
                let fam = PFamily::<Labels, Counter<f64, AtomicU64>>::default();
                for s in &f.samples {
                    fam.get_or_create(&s.labels).inc_by(s.value.max(0.0));
                }
                registry.register(f.name, f.help, fam);
            }
        }
    }
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut out, &registry);
    out
}

/// The Prometheus text format 0.0.4 of an OpenMetrics text this module wrote: no `# EOF`
/// nor `# UNIT`, and counters' HELP and TYPE name the `_total` series.
pub fn prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<&str> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if line.starts_with("# HELP ") {
            if let Some(h) = help.replace(line) {
                out.push_str(h);
                out.push('\n');
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let (name, kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "gauge" => (name.to_string(), "gauge"),
                "histogram" => (name.to_string(), "histogram"),
                _ => (name.to_string(), "untyped"),
            };
            if let Some(h) = help.take() {
                let text = h
                    .strip_prefix("# HELP ")
                    .and_then(|r| r.split_once(' '))
                    .map_or("", |(_, t)| t);
                out.push_str(&format!("# HELP {name} {text}\n"));
            }
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            continue;
        }
        if let Some(h) = help.take() {
            out.push_str(h);
            out.push('\n');
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

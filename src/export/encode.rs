//! Encoding of [`Family`]s: OpenMetrics 1.0 text through the official `prometheus-client`
//! text encoder, and the Prometheus text format 0.0.4 derived from it (for scrapers that
//! ask only for `text/plain; version=0.0.4`).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::{Family, Kind};

/// The families of one collection as a [`Collector`]: the crate encodes each sample from
/// its labels as they are, in their order, with no per-sample `Family` hash map nor label
/// clone. (A collector must be `'static`, hence the families moved in.)
#[derive(Debug)]
struct Families(Vec<Family>);

impl Collector for Families {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut help = String::new();
        for f in &self.0 {
            let metric_type = match f.kind {
                Kind::Histogram if f.histogram.is_some() => MetricType::Histogram,
                Kind::Histogram => continue,
                _ if f.samples.is_empty() => continue,
                Kind::Gauge => MetricType::Gauge,
                Kind::Counter => MetricType::Counter,
            };
            // The full stop `Registry::register` adds to a help text.
            help.clear();
            help.push_str(f.help);
            help.push('.');
            let mut metric = encoder.encode_descriptor(f.name, &help, None, metric_type)?;
            if let (Kind::Histogram, Some(h)) = (f.kind, &f.histogram) {
                metric.encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets(), None)?;
                continue;
            }
            // Whole counts as integers; a counter of seconds (CPU time) as a float.
            let whole = f.samples.iter().all(|s| s.value.fract() == 0.0);
            for s in &f.samples {
                let mut sample = metric.encode_family(&s.labels)?;
                match f.kind {
                    Kind::Counter if whole => {
                        let v = s.value.max(0.0) as u64;
                        sample.encode_counter::<NoLabelSet, _, u64>(&v, None)?
                    }
                    Kind::Counter => {
                        // Not below 0 (nor NaN, nor -0.0): what a counter from 0 holds.
                        let v = if s.value > 0.0 { s.value } else { 0.0 };
                        sample.encode_counter::<NoLabelSet, _, f64>(&v, None)?
                    }
                    _ => sample.encode_gauge(&s.value)?,
                }
            }
        }
        Ok(())
    }
}

/// The OpenMetrics text of `families`, ending in `# EOF`.
pub fn openmetrics(families: Vec<Family>) -> String {
    openmetrics_with(families, &[])
}

/// The same, every sample carrying the constant labels `labels` too (the exporter's
/// `node` when `NODE_NAME` is set). Families with no sample (nor histogram) are left out.
pub fn openmetrics_with(families: Vec<Family>, labels: &[(String, String)]) -> String {
    let mut registry = Registry::with_labels(
        labels
            .iter()
            .map(|(k, v)| (k.clone().into(), v.clone().into())),
    );
    registry.register_collector(Box::new(Families(families)));
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family as PFamily;
    use prometheus_client::metrics::gauge::Gauge;

    use super::super::selfm::DURATION_BUCKETS;
    use super::super::{Histogram, Options, Sample, SelfStats};
    use super::*;

    type Labels = Vec<(String, String)>;

    /// A histogram already observed elsewhere, encoded as it is (classic buckets).
    #[derive(Debug)]
    struct Observed(Histogram);

    impl EncodeMetric for Observed {
        fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
            let h = &self.0;
            encoder.encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets(), None)
        }

        fn metric_type(&self) -> MetricType {
            MetricType::Histogram
        }
    }

    /// The encoding before the collector: a `Registry` of `prometheus-client` families,
    /// every sample looked up (hashed, its labels cloned) in a map of its family.
    fn openmetrics_registry(families: &[Family], labels: &[(String, String)]) -> String {
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
        let _ = encode(&mut out, &registry);
        out
    }

    /// The lines of an exposition, each family's sample lines sorted (the registry's
    /// order came from a hash map): the same result means the same multiset of samples
    /// in every family, the families and their HELP and TYPE lines in the same order.
    fn sorted_within_families(om: &str) -> Vec<&str> {
        let mut out = Vec::new();
        let mut samples: Vec<&str> = Vec::new();
        for line in om.lines() {
            if line.starts_with('#') {
                samples.sort_unstable();
                out.append(&mut samples);
                out.push(line);
            } else {
                samples.push(line);
            }
        }
        samples.sort_unstable();
        out.append(&mut samples);
        out
    }

    fn family(name: &'static str, kind: Kind, samples: &[(&[(&str, &str)], f64)]) -> Family {
        Family {
            name,
            help: "What the test says",
            kind,
            samples: samples
                .iter()
                .map(|(labels, value)| Sample {
                    labels: labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                    value: *value,
                })
                .collect(),
            histogram: None,
        }
    }

    fn assert_same_encoding(families: &[Family], labels: &[(String, String)]) {
        let old = openmetrics_registry(families, labels);
        let new = openmetrics_with(families.to_vec(), labels);
        assert_eq!(
            sorted_within_families(&new),
            sorted_within_families(&old),
            "new:\n{new}\nold:\n{old}"
        );
        assert!(new.ends_with("# EOF\n"), "{new}");
        let (new, old) = (prometheus_text(&new), prometheus_text(&old));
        assert_eq!(sorted_within_families(&new), sorted_within_families(&old));
    }

    #[test]
    fn the_collector_encodes_what_the_registry_did() {
        let odd = "a \"quoted\" \\ back\\slash\nand a new line, λ";
        let file = |id, kind| [("file_id", id), ("kind", kind)];
        let mut histogram = Histogram::new(&DURATION_BUCKETS);
        for v in [0.003, 0.2, 0.2, 4.0, 100.0] {
            histogram.observe(v);
        }
        let mut durations = family("twofold_test_duration_seconds", Kind::Histogram, &[]);
        durations.histogram = Some(histogram);
        let families = vec![
            family(
                "twofold_test_held_bytes",
                Kind::Gauge,
                &[
                    (&file("8:1:100", "page_cache"), 4096.0),
                    (&file("8:1:100", "anon"), 0.0),
                    (&file("8:1:101", "page_cache"), 1.5e12),
                    (&file(odd, "page_cache"), 0.25),
                    (&[("path", odd), ("file_id", "8:1:102"), ("x", "")], -3.5),
                    (&file("other", "page_cache"), f64::NAN),
                    (&file("other", "anon"), f64::INFINITY),
                ],
            ),
            family("twofold_test_empty", Kind::Gauge, &[]),
            family("twofold_test_build_info", Kind::Gauge, &[(&[], 1.0)]),
            family(
                "twofold_test_errors",
                Kind::Counter,
                &[
                    (&[("kind", "collection")], 3.0),
                    (&[("kind", "residency")], 0.0),
                    (&[("kind", odd)], 12_345_678_901.0),
                    (&[("kind", "negative")], -2.0),
                ],
            ),
            family("twofold_test_no_errors", Kind::Counter, &[]),
            durations,
            family("twofold_test_no_histogram", Kind::Histogram, &[]),
            family(
                "twofold_test_cpu_seconds",
                Kind::Counter,
                &[
                    (&[("cgroup", "/a")], 1.25),
                    (&[("cgroup", "/b")], 7.0),
                    (&[("cgroup", odd)], -2.0),
                    (&[("cgroup", "/d")], 0.1),
                ],
            ),
        ];
        let node = vec![("node".to_string(), "node-1 \"x\"".to_string())];
        assert_same_encoding(&families, &node);
        assert_same_encoding(&families, &[]);
        // Samples come in the input's order now, after the constant labels; empty
        // families stay out.
        let om = openmetrics_with(families, &node);
        let n = r#"node="node-1 \"x\"""#;
        let held = format!(
            "\ntwofold_test_held_bytes{{{n},file_id=\"8:1:100\",kind=\"page_cache\"}} 4096.0\n"
        );
        let anon =
            format!("twofold_test_held_bytes{{{n},file_id=\"8:1:100\",kind=\"anon\"}} 0.0\n");
        assert!(om.contains(&format!("{held}{anon}")), "{om}");
        assert!(!om.contains("empty") && !om.contains("no_"), "{om}");
        for line in [
            format!("twofold_test_errors_total{{{n},kind=\"collection\"}} 3\n"),
            format!("twofold_test_errors_total{{{n},kind=\"negative\"}} 0\n"),
            format!("twofold_test_cpu_seconds_total{{{n},cgroup=\"/b\"}} 7.0\n"),
        ] {
            assert!(om.contains(&line), "{line} in {om}");
        }
    }

    #[test]
    fn the_collector_encodes_a_report_as_the_registry_did() {
        let key = |inode| crate::sample::FileKey {
            major: 8,
            minor: 1,
            inode,
        };
        let sample = crate::sample::Sample {
            files: (0..4)
                .map(|i| {
                    let path = format!("/models/m{i}.safetensors");
                    crate::collect::test_file_sample(key(100 + i), &path, 1 << 20, None)
                })
                .collect(),
            ..Default::default()
        };
        let report = crate::model::from_sample(&sample);
        let mut stats = SelfStats::default();
        stats.error("collection", 2);
        stats.collect_durations.observe(0.3);
        stats.last_success_unix_seconds = Some(1.7e9);
        let opts = Options {
            max_files: 2,
            ..Options::default()
        };
        let mut families = super::super::families(&report, opts, &stats).families;
        let own = crate::collect::own::OwnProcess {
            cpu_seconds: 1.25,
            resident_bytes: 4096,
            start_time_seconds: Some(1e9),
        };
        families.extend(super::super::scrape_time(Some(2.5), Some(own)));
        assert!(families.iter().map(|f| f.samples.len()).sum::<usize>() > 20);
        assert_same_encoding(&families, &[("node".to_string(), "n1".to_string())]);
    }
}

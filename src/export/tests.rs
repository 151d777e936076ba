#![allow(clippy::unwrap_used)]

use super::*;
use crate::model::{CopyHow, ProvenCopy, Report};

fn report_with(files: usize) -> Report {
    let sample = crate::sample::Sample {
        files: vec![crate::collect::test_file_sample(
            crate::sample::FileKey {
                major: 8,
                minor: 1,
                inode: 100,
            },
            "/models/m.safetensors",
            1 << 20,
            None,
        )],
        ..Default::default()
    };
    let mut r: Report = crate::model::from_sample(&sample);
    let base = r.files[0].clone();
    r.files.clear();
    for i in 0..files {
        let mut f = base.clone();
        f.key.inode = 100 + i as u64;
        f.path = format!("/models/m{i}.safetensors");
        f.resident_bytes = Some(1000 * (i as u64 + 1));
        r.files.push(f);
    }
    r
}

fn value(e: &Exposition, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let fam = e.families.iter().find(|f| f.name == name)?;
    fam.samples
        .iter()
        .find(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.iter().any(|(a, b)| a == k && b == v))
        })
        .map(|s| s.value)
}

#[test]
fn file_series_follow_the_report() {
    let mut r = report_with(1);
    r.files[0].proven_copies.push(ProvenCopy {
        pid: 42,
        comm: "copier".into(),
        identical_bytes: 4096,
        converted_bytes: 0,
        conversions: Vec::new(),
        memory_bytes: 4096,
        copies: 1,
        fraction: 1.0,
        share: 1.0,
        shared: None,
        how: CopyHow::Read,
        traced_read_bytes: None,
        mapped: false,
        huge_pages: false,
        attribution: None,
    });
    r.files[0].representations.proven = Some(2.0);
    r.files[0].size_bytes = Some(4096);
    let e = families(&r, Options::default(), &SelfStats::default());
    let id = "8:1:100";
    assert_eq!(
        value(&e, "twofold_file_copies", &[("file_id", id)]),
        Some(2.0)
    );
    assert_eq!(
        value(&e, "twofold_file_excess_bytes", &[("file_id", id)]),
        Some(4096.0)
    );
    assert_eq!(
        value(
            &e,
            "twofold_file_held_bytes",
            &[("file_id", id), ("kind", "private_copy_proven")]
        ),
        Some(4096.0)
    );
    assert_eq!(
        value(
            &e,
            "twofold_workload_file_held_bytes",
            &[("workload", "copier"), ("kind", "private_copy_proven")]
        ),
        Some(4096.0)
    );
    let info = e
        .families
        .iter()
        .find(|f| f.name == "twofold_file_info")
        .unwrap();
    assert!(info.samples[0]
        .labels
        .contains(&("format".into(), "safetensors".into())));
    // No pid label unless asked.
    assert!(e
        .families
        .iter()
        .flat_map(|f| &f.samples)
        .all(|s| s.labels.iter().all(|(k, _)| k != "pid")));
    let per_pid = families(
        &r,
        Options {
            per_pid: true,
            ..Options::default()
        },
        &SelfStats::default(),
    );
    assert_eq!(
        value(
            &per_pid,
            "twofold_workload_file_held_bytes",
            &[("pid", "42")]
        ),
        Some(4096.0)
    );
}

#[test]
fn files_past_max_files_fold_into_other() {
    let r = report_with(5);
    let e = families(
        &r,
        Options {
            max_files: 2,
            per_pid: false,
        },
        &SelfStats::default(),
    );
    let info = e
        .families
        .iter()
        .find(|f| f.name == "twofold_file_info")
        .unwrap();
    assert_eq!(info.samples.len(), 3);
    // The two largest holders are kept; the other three add up under `other`.
    assert!(value(
        &e,
        "twofold_file_info",
        &[("path", "/models/m4.safetensors")]
    )
    .is_some());
    assert!(value(
        &e,
        "twofold_file_info",
        &[("path", "/models/m0.safetensors")]
    )
    .is_none());
    assert_eq!(
        value(
            &e,
            "twofold_file_held_bytes",
            &[("file_id", OTHER), ("kind", "page_cache")]
        ),
        Some(6000.0)
    );
    assert!(e.dropped_series > 0);
    let dropped = e
        .families
        .iter()
        .find(|f| f.name == "twofold_series_dropped")
        .unwrap();
    assert_eq!(dropped.samples[0].value, e.dropped_series as f64);
}

#[test]
fn encodings_are_openmetrics_and_text_0_0_4() {
    let r = report_with(1);
    let mut stats = SelfStats::default();
    stats.error("collection", 3);
    stats.collect_durations.observe(0.3);
    let om = openmetrics(families(&r, Options::default(), &stats).families);
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert!(om.contains("# TYPE twofold_collect_errors counter\n"));
    assert!(om.contains("twofold_collect_errors_total{kind=\"collection\"} 3\n"));
    assert!(om.contains("twofold_collect_errors_total{kind=\"residency\"} 0\n"));
    assert!(om.contains("# TYPE twofold_collect_duration_seconds histogram\n"));
    assert!(om.contains("twofold_collect_duration_seconds_bucket{le=\"0.25\"} 0\n"));
    assert!(om.contains("twofold_collect_duration_seconds_bucket{le=\"0.5\"} 1\n"));
    assert!(om.contains("twofold_collect_duration_seconds_bucket{le=\"+Inf\"} 1\n"));
    assert!(om.contains("twofold_collect_duration_seconds_count 1\n"));
    let text = prometheus_text(&om);
    assert!(!text.contains("# EOF"));
    assert!(text.contains("# TYPE twofold_collect_errors_total counter\n"));
    assert!(text.contains("# HELP twofold_collect_errors_total Errors"));
    assert!(text.contains("# TYPE twofold_collect_duration_seconds histogram\n"));
    assert!(text.contains("twofold_file_info{"));
}

#[test]
fn scrape_time_series_are_the_client_libraries_names() {
    let own = crate::collect::own::OwnProcess {
        cpu_seconds: 1.25,
        resident_bytes: 4096,
        start_time_seconds: Some(1e9),
    };
    let om = openmetrics(scrape_time(Some(2.5), Some(own)));
    assert!(
        om.contains("twofold_collect_last_success_age_seconds 2.5\n"),
        "{om}"
    );
    assert!(om.contains("# TYPE process_cpu_seconds counter\n"), "{om}");
    assert!(om.contains("process_cpu_seconds_total 1.25\n"), "{om}");
    assert!(om.contains("process_resident_memory_bytes 4096"), "{om}");
    let text = prometheus_text(&om);
    assert!(
        text.contains("# TYPE process_cpu_seconds_total counter\n"),
        "{text}"
    );
    // Before the first good collection there is no age (not 0).
    assert!(!openmetrics(scrape_time(None, None)).contains("age"));
}

#[test]
fn help_texts_need_no_escaping_in_either_format() {
    // OpenMetrics' HELP admits `"` and `\` only escaped (`\"`, `\\`); the 0.0.4 text
    // format has no `\"` escape. So no help text may hold them, nor a newline.
    let r = report_with(5);
    let stats = SelfStats {
        last_success_unix_seconds: Some(1.0),
        ..SelfStats::default()
    };
    let opts = Options {
        max_files: 2,
        per_pid: true,
    };
    let e = families(&r, opts, &stats);
    assert!(
        e.families.len() >= 8,
        "{:?}",
        e.families.iter().map(|f| f.name).collect::<Vec<_>>()
    );
    for f in &e.families {
        assert!(
            !f.help.contains(['"', '\\', '\n']),
            "{}: {}",
            f.name,
            f.help
        );
    }
}

/// The uploaded-bytes counter keeps what exited processes uploaded (on the GPU each was
/// last seen on): a process that exits never makes it go down.
#[test]
fn uploaded_bytes_keep_what_exited_processes_uploaded() {
    use crate::model::device::UploadModel;
    use crate::sample::uploads::RetiredUpload;
    let mut r = report_with(1);
    let key = r.files[0].key;
    r.files[0].uploads.push(UploadModel {
        pid: 7,
        comm: "python3".into(),
        gpu: Some(0),
        widened: false,
        conversion: None,
        cloned: false,
        attribution: None,
        ranges: vec![(0, 100)],
        file_bytes: 100,
        device_bytes: 100,
        copies: 1,
        first_unix_ns: 0,
        last_unix_ns: 0,
        entry: "cuMemcpyHtoDAsync_v2".into(),
        proven: true,
        not_proven: None,
    });
    let e = families(&r, Options::default(), &SelfStats::default());
    let name = "twofold_file_device_uploaded_bytes";
    assert_eq!(value(&e, name, &[("gpu", "0")]), Some(100.0));
    // The process exits: its 100 bytes move to the retired list, and others had gone.
    r.files[0].uploads.clear();
    for (gpu, device_bytes) in [(Some(0), 100), (Some(0), 50), (None, 7)] {
        r.files[0].uploads_retired.push(RetiredUpload {
            file: key,
            gpu,
            device_bytes,
        });
    }
    let e = families(&r, Options::default(), &SelfStats::default());
    assert_eq!(value(&e, name, &[("gpu", "0")]), Some(150.0));
    assert_eq!(value(&e, name, &[("gpu", "unknown")]), Some(7.0));
}

/// Memory that is no known form of a file is its own gauge (0 without it), never in the
/// count.
#[test]
fn unexplained_memory_is_a_gauge_beside_the_count() {
    let mut r = report_with(1);
    let e = families(&r, Options::default(), &SelfStats::default());
    let id = "8:1:100";
    assert_eq!(
        value(&e, "twofold_file_unexplained_bytes", &[("file_id", id)]),
        Some(0.0)
    );
    let count = value(&e, "twofold_file_copies", &[("file_id", id)]);
    r.files[0]
        .unexplained
        .push(crate::model::unexplained::UnexplainedMemory {
            pid: 42,
            comm: "ort".into(),
            estimated_bytes: 1 << 19,
            fraction_of_file: 0.5,
            sampled_pages: 8,
            stride_pages: 16,
            why: crate::sample::CandidateWhy::Read,
        });
    let e = families(&r, Options::default(), &SelfStats::default());
    assert_eq!(
        value(&e, "twofold_file_unexplained_bytes", &[("file_id", id)]),
        Some(f64::from(1 << 19))
    );
    assert_eq!(value(&e, "twofold_file_copies", &[("file_id", id)]), count);
}

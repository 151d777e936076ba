//! What a campaign's `--out DIR` holds: the timeline (JSON Lines, one `{"type", "data"}`
//! object a line), the summary (JSON and Markdown) and the plots (SVG and PNG). One writer
//! for `run`, `compare` and `pressure`, so each writes what its help lists.

use std::io::Write;
use std::path::Path;

use anyhow::Context;

use super::plot::{line_chart, Limit, Series};
use super::sampler::TimelinePoint;

const MIB: f64 = 1048576.0;

/// `--out DIR` can take files: created if missing, and a file written and removed in it
/// (a read-only or full file system fails here, naming the directory), before the
/// campaign starts rather than after it.
pub fn check(dir: &Path) -> anyhow::Result<()> {
    if let Ok(meta) = std::fs::metadata(dir) {
        if !meta.is_dir() {
            anyhow::bail!("--out '{}' exists and is not a directory", dir.display());
        }
    }
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create --out '{}'", dir.display()))?;
    let probe = tempfile::Builder::new()
        .prefix(".twofold-out-check")
        .tempfile_in(dir)
        .with_context(|| format!("cannot write in --out '{}'", dir.display()))?;
    probe
        .as_file()
        .write_all(&[0u8; 4096])
        .and_then(|()| probe.as_file().sync_all())
        .with_context(|| format!("cannot write in --out '{}'", dir.display()))?;
    Ok(())
}

/// Writes `bytes` as `dir/name`, naming the path on failure.
pub fn write(dir: &Path, name: &str, bytes: &[u8]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create '{}'", dir.display()))?;
    let path = dir.join(name);
    std::fs::write(&path, bytes).with_context(|| format!("cannot write '{}'", path.display()))
}

/// Writes `dir/name` as JSON Lines: one `{"type": kind, "data": value}` object a line.
pub fn write_jsonl(
    dir: &Path,
    name: &str,
    lines: impl IntoIterator<Item = (&'static str, serde_json::Value)>,
) -> anyhow::Result<()> {
    let mut buf = Vec::new();
    for (kind, data) in lines {
        serde_json::to_writer(&mut buf, &serde_json::json!({"type": kind, "data": data}))?;
        buf.push(b'\n');
    }
    write(dir, name, &buf)
}

/// A timeline sample as a JSON object, with `extra` fields (round, arm) merged in.
pub fn sample(p: &TimelinePoint, extra: serde_json::Value) -> serde_json::Value {
    let mut v = serde_json::to_value(p).unwrap_or(serde_json::Value::Null);
    if let (Some(v), serde_json::Value::Object(extra)) = (v.as_object_mut(), extra) {
        v.extend(extra);
    }
    v
}

/// Writes `<stem>.jsonl` (one `sample` line per point) and the memory plot
/// `<stem>.{svg,png}` of a run's samples, with the cgroup's limit drawn as a line.
pub fn write_timeline(
    dir: &Path,
    stem: &str,
    points: &[TimelinePoint],
    title: &str,
    memory_max: Option<u64>,
) -> anyhow::Result<()> {
    write_jsonl(
        dir,
        &format!("{stem}.jsonl"),
        points
            .iter()
            .map(|p| ("sample", sample(p, serde_json::json!({})))),
    )?;
    let series = |name: &str, get: &dyn Fn(&TimelinePoint) -> Option<u64>| Series {
        name: name.to_string(),
        // A sample not measured is NaN: a gap in the line, not a ramp across it.
        points: points
            .iter()
            .map(|p| (p.t_seconds, get(p).map_or(f64::NAN, |v| v as f64 / MIB)))
            .collect(),
        markers: false,
    };
    let mut lines = vec![
        series("cgroup usage", &|p| p.usage_bytes),
        series("anon", &|p| p.anon_bytes),
        series("file (page cache)", &|p| p.file_bytes),
    ];
    if points
        .iter()
        .any(|p| p.files_resident_bytes.first().copied().flatten().is_some())
    {
        lines.push(series("model resident", &|p| {
            p.files_resident_bytes.first().copied().flatten()
        }));
    }
    let limit = memory_max.map(|m| Limit {
        name: format!("memory limit ({})", crate::units::iec(m)),
        y: m as f64 / MIB,
    });
    line_chart(dir, stem, title, "seconds", "MiB", &lines, limit.as_ref())
}

/// Markdown of a command's text summary: its first line a heading, the others a list.
/// (The text is what the terminal shows, already made safe by the caller.)
pub fn markdown(text: &str) -> String {
    let mut lines = text.lines();
    let mut md = format!("# {}\n\n", lines.next().unwrap_or("").trim());
    for l in lines.filter(|l| !l.trim().is_empty()) {
        md.push_str(&format!("- {}\n", l.trim()));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_heads_the_first_line_and_lists_the_rest() {
        assert_eq!(
            markdown("twofold run: 'x'\n  exit code 0\n\n  peak 1 MiB\n"),
            "# twofold run: 'x'\n\n- exit code 0\n- peak 1 MiB\n"
        );
    }

    #[test]
    fn a_sample_keeps_its_fields_and_gains_the_extra_ones() {
        let p = TimelinePoint {
            t_seconds: 0.5,
            usage_bytes: Some(7),
            anon_bytes: None,
            file_bytes: None,
            shmem_bytes: None,
            file_mapped_bytes: None,
            oom_kills: None,
            refaults_file: None,
            processes: 1,
            rss_anon_bytes: 0,
            rss_file_bytes: 0,
            files_resident_bytes: vec![],
        };
        let v = sample(&p, serde_json::json!({"round": 2, "arm": "B"}));
        assert_eq!(v["usage_bytes"], 7);
        assert_eq!(v["t_seconds"], 0.5);
        assert_eq!(
            (v["round"].as_u64(), v["arm"].as_str()),
            (Some(2), Some("B"))
        );
    }

    #[test]
    fn check_refuses_a_file_and_creates_a_directory() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        let e = check(&f).unwrap_err().to_string();
        assert!(e.contains("not a directory"), "{e}");
        let new = d.path().join("a/b");
        check(&new).unwrap();
        assert!(new.is_dir());
        assert_eq!(
            std::fs::read_dir(&new).unwrap().count(),
            0,
            "the probe is removed"
        );
    }
}

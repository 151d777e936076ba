//! Model tests over hand-built samples: no I/O.

use super::*;
use crate::sample::*;

const MIB: u64 = 1 << 20;

fn key(inode: u64) -> FileKey {
    FileKey {
        major: 8,
        minor: 1,
        inode,
    }
}

fn file(inode: u64, size: u64, cached: Option<u64>) -> FileSample {
    FileSample {
        path_bytes: None,
        key: key(inode),
        path: format!("/m/f{inode}.gguf"),
        size_bytes: Some(size),
        residency: cached.map(|c| ResidencySample {
            cached_bytes: c,
            ..ResidencySample::default()
        }),
        residency_error: cached.is_none().then(|| "denied".to_string()),
        unopened: None,
        explicit: false,
        store: false,
        deleted: false,
        now_at_path: None,
        seen_as: Vec::new(),
        same_bytes: Vec::new(),
    }
}

fn proc_(pid: i32, anon: u64) -> ProcessSample {
    ProcessSample {
        pid,
        comm: format!("p{pid}"),
        status: StatusSample {
            rss_anon_bytes: Some(anon),
            ..StatusSample::default()
        },
        ..ProcessSample::default()
    }
}

fn map(inode: u64, len: u64, shared: bool, write: bool, rss: u64, cow: u64) -> MappingSample {
    MappingSample {
        start: 0x7f00_0000_0000,
        end: 0x7f00_0000_0000 + len,
        perms: Perms {
            read: true,
            write,
            exec: false,
            shared,
        },
        major: 8,
        minor: 1,
        inode,
        path: format!("/m/f{inode}.gguf"),
        rss_bytes: Some(rss),
        pss_bytes: Some(rss),
        anonymous_bytes: Some(cow),
        file_pmd_mapped_bytes: Some(0),
        ..MappingSample::default()
    }
}

fn open(inode: u64) -> OpenFileSample {
    OpenFileSample {
        fd: 3,
        key: key(inode),
        path: format!("/m/f{inode}.gguf"),
    }
}

fn sample(files: Vec<FileSample>, processes: Vec<ProcessSample>) -> Sample {
    Sample {
        system: SystemSample {
            page_size: 4096,
            ..SystemSample::default()
        },
        files,
        processes,
        ..Sample::default()
    }
}

fn candidate(pid: i32, inode: u64, anon: u64, why: CandidateWhy) -> CandidateSample {
    CandidateSample {
        pid,
        file: key(inode),
        why,
        private_anon_bytes: anon,
    }
}

fn found(pid: i32, inode: u64, identical: u64) -> ProofSample {
    ProofSample {
        pid,
        file: key(inode),
        identical_file_bytes: identical,
        copy_memory_bytes: identical,
        copies: u64::from(identical > 0),
        searchable_fraction: 1.0,
        stride_pages: 1,
        ..ProofSample::default()
    }
}

#[test]
fn unsearched_copy_is_suspected_beside_the_count_never_in_it() {
    let mut copier = proc_(10, 260 * MIB);
    copier.open_files.push(open(1));
    let mut mapper = proc_(11, MIB);
    mapper
        .mappings
        .push(map(1, 256 * MIB, true, false, 256 * MIB, 0));
    let mut s = sample(
        vec![file(1, 256 * MIB, Some(256 * MIB))],
        vec![copier, mapper],
    );
    s.candidates = vec![candidate(10, 1, 260 * MIB, CandidateWhy::Holder)];
    let r = from_sample(&s);
    let f = &r.files[0];
    assert_eq!(f.suspected_copies.len(), 1);
    assert_eq!(f.suspected_copies[0].pid, 10);
    assert!(!f.suspected_copies[0].mapped);
    assert_eq!(f.suspected_copies[0].attributed_bytes, 256 * MIB);
    let reps = &f.representations;
    assert_eq!(reps.proven, Some(1.0));
    assert_eq!(reps.suspected, 1.0);
    assert!(reps.lower_bound);
    assert_eq!(reps.unsearched, 1);
    assert_eq!(f.mappers.len(), 1);
    assert_eq!(f.mappers[0].kind, MapKind::Shared);
    let codes: Vec<_> = r.findings.iter().map(|x| x.code.as_str()).collect();
    assert_eq!(codes, ["suspected-private-copy", "count-is-lower-bound"]);
    // And the JSON has no bare total.
    let json = serde_json::to_value(&r).unwrap();
    let reps = &json["files"][0]["representations"];
    assert!(reps.get("total_estimate").is_none());
    assert_eq!(reps["lower_bound"], true);
}

#[test]
fn proven_copy_counts_and_closed_file_copier_is_listed() {
    // pid 10 read the file and closed it: no fd, no mapping; the proof found it.
    let copier = proc_(10, 260 * MIB);
    let mut s = sample(vec![file(1, 256 * MIB, Some(256 * MIB))], vec![copier]);
    s.candidates = vec![candidate(10, 1, 260 * MIB, CandidateWhy::Read)];
    s.proofs = vec![found(10, 1, 256 * MIB)];
    let r = from_sample(&s);
    let f = &r.files[0];
    assert_eq!(f.representations.proven, Some(2.0));
    assert!(!f.representations.lower_bound);
    assert_eq!(f.proven_copies.len(), 1);
    assert!(f.suspected_copies.is_empty());
    assert_eq!(f.candidates.searched, 1);
    assert_eq!(r.processes[0].holds_files, Some(1));
    let codes: Vec<_> = r.findings.iter().map(|x| x.code.as_str()).collect();
    assert_eq!(codes, ["proven-private-copy", "multiple-representations"]);
}

#[test]
fn searched_and_nothing_found_is_one_exactly() {
    // A zero-copy loader with a big heap: searched, nothing found: 1.00, not a bound.
    let mut p = proc_(10, 400 * MIB);
    p.mappings
        .push(map(1, 256 * MIB, false, false, 256 * MIB, 0));
    let mut s = sample(vec![file(1, 256 * MIB, Some(256 * MIB))], vec![p]);
    s.candidates = vec![candidate(10, 1, 400 * MIB, CandidateWhy::Holder)];
    s.proofs = vec![found(10, 1, 0)];
    let r = from_sample(&s);
    let f = &r.files[0];
    assert_eq!(f.representations.proven, Some(1.0));
    assert!(!f.representations.lower_bound);
    assert!(f.suspected_copies.is_empty() && f.proven_copies.is_empty());
    assert!(r.findings.is_empty(), "{:?}", r.findings);
}

#[test]
fn one_heap_is_not_suspected_of_two_files() {
    // 300 MiB of private memory, unsearched, for a 256 MiB and a 200 MiB file: only the
    // larger is suspected.
    let mut p = proc_(10, 300 * MIB);
    p.open_files.push(open(1));
    p.open_files.push(open(2));
    let mut s = sample(
        vec![file(1, 256 * MIB, Some(0)), file(2, 200 * MIB, Some(0))],
        vec![p],
    );
    s.candidates = vec![
        candidate(10, 1, 300 * MIB, CandidateWhy::Holder),
        candidate(10, 2, 300 * MIB, CandidateWhy::Holder),
    ];
    let r = from_sample(&s);
    let suspected: Vec<_> = r
        .files
        .iter()
        .filter(|f| !f.suspected_copies.is_empty())
        .map(|f| f.path.as_str())
        .collect();
    assert_eq!(suspected, ["/m/f1.gguf"]);
    assert!(r.files.iter().all(|f| f.representations.lower_bound));
    // Both bounds name the process not searched, the second too though none of its memory
    // is left to suspect.
    for f in &r.files {
        let named: Vec<i32> = f.candidates.unsearched.iter().map(|u| u.pid).collect();
        assert_eq!(named, [10], "{}", f.path);
        assert_eq!(f.candidates.not_searched, 1);
    }
}

#[test]
fn cow_is_counted_once_and_not_as_a_copy() {
    // 88 MiB written into a private writable mapping; the proof found those pages in the
    // mapping itself (cow_file_bytes), which is the CoW part, not another copy.
    let mut p = proc_(10, 90 * MIB);
    p.mappings
        .push(map(1, 100 * MIB, false, true, 100 * MIB, 88 * MIB));
    let mut s = sample(vec![file(1, 100 * MIB, Some(100 * MIB))], vec![p]);
    s.proofs = vec![ProofSample {
        cow_file_bytes: 88 * MIB,
        ..found(10, 1, 0)
    }];
    let r = from_sample(&s);
    let f = &r.files[0];
    assert!(f.suspected_copies.is_empty() && f.proven_copies.is_empty());
    assert!((f.representations.cow.unwrap() - 0.88).abs() < 1e-9);
    assert!((f.representations.proven.unwrap() - 1.88).abs() < 1e-9);
    assert!(r.findings.iter().any(|x| x.code == "cow-in-private-mapping"
        && x.message().contains("88.0 MiB")
        && x.message().contains("written in place")));
}

#[test]
fn shared_low_residency_and_beyond_eof() {
    let mut a = proc_(1, 0);
    let mut b = proc_(2, 0);
    let mut c = proc_(3, 0);
    a.mappings.push(map(1, 64 * MIB, true, false, 10 * MIB, 0));
    b.mappings.push(map(1, 64 * MIB, true, false, 10 * MIB, 0));
    // The file is 32 MiB now: c maps 64 MiB of it.
    c.mappings.push(map(1, 64 * MIB, false, false, 0, 0));
    let r = from_sample(&sample(
        vec![file(1, 32 * MIB, Some(14 * MIB))],
        vec![a, b, c],
    ));
    let by_code = |code: &str| r.findings.iter().filter(|x| x.code == code).count();
    assert_eq!(by_code("shared-mapping"), 1);
    assert_eq!(by_code("low-residency"), 1);
    assert_eq!(by_code("mapping-beyond-eof"), 3);
    assert_eq!(r.files[0].mappers[2].beyond_eof_bytes, 32 * MIB);
    assert!(r
        .findings
        .iter()
        .any(|x| x.message().contains("44% resident")));
}

/// Files of the same bytes are linked by name both ways; each keeps its own count, and
/// one finding says the bytes are cached twice (the page cache beyond the larger one).
#[test]
fn twins_are_linked_each_counted_alone_and_said_once() {
    let mut a = file(1, 64 * MIB, Some(64 * MIB));
    let mut b = file(2, 64 * MIB, Some(48 * MIB));
    let c = file(3, 64 * MIB, Some(64 * MIB));
    a.same_bytes = vec![key(2)];
    b.same_bytes = vec![key(1)];
    let r = from_sample(&sample(vec![a, b, c], vec![]));
    let f = |inode: u64| r.files.iter().find(|f| f.key == key(inode)).unwrap();
    let names = |inode: u64| -> Vec<String> {
        f(inode).same_bytes.iter().map(|t| t.path.clone()).collect()
    };
    assert_eq!(names(1), ["/m/f2.gguf"]);
    assert_eq!(names(2), ["/m/f1.gguf"]);
    assert!(f(3).same_bytes.is_empty());
    assert_eq!(f(1).representations.page_cache, Some(1.0));
    assert_eq!(f(2).representations.page_cache, Some(0.75));
    let same: Vec<_> = r
        .findings
        .iter()
        .filter(|x| x.code == "same-bytes-cached")
        .collect();
    assert_eq!(same.len(), 1, "{:?}", r.findings);
    assert!(same[0].message().starts_with(
        "the same bytes are cached 2 times: '/m/f1.gguf', '/m/f2.gguf' (up to 48.0 MiB"
    ));
}

#[test]
fn unknown_residency_is_unknown_not_zero() {
    let mut p = proc_(10, 300 * MIB);
    p.open_files.push(open(1));
    let r = from_sample(&sample(vec![file(1, 256 * MIB, None)], vec![p]));
    let f = &r.files[0];
    assert_eq!(f.resident_bytes, None);
    assert_eq!(f.representations.page_cache, None);
    assert_eq!(f.representations.proven, None);
    assert!(f.representations.lower_bound);
    assert!(r.findings.iter().any(|x| x.code == "residency-unknown"));
    // And the JSON says null.
    let json = serde_json::to_value(&r).unwrap();
    assert!(json["files"][0]["resident_bytes"].is_null());
}

#[test]
fn cgroup_near_limit_and_oom() {
    let mut stat = std::collections::BTreeMap::new();
    stat.insert("total_rss".to_string(), 900 * MIB);
    stat.insert("rss".to_string(), 1);
    let mut events = std::collections::BTreeMap::new();
    events.insert("oom_kill".to_string(), 3);
    let cg = CgroupSample {
        version: Some(CgroupVersion::V1),
        path: "/x".into(),
        usage_bytes: Some(950 * MIB),
        limit_bytes: Some(Some(1000 * MIB)),
        stat,
        events,
        ..CgroupSample::default()
    };
    let mut s = sample(vec![], vec![]);
    s.cgroups.push(cg);
    let r = from_sample(&s);
    assert_eq!(r.cgroups[0].anon_bytes, Some(900 * MIB));
    let codes: Vec<_> = r.findings.iter().map(|x| x.code.as_str()).collect();
    assert_eq!(codes, ["cgroup-oom-kills", "cgroup-near-limit"]);
}

#[test]
fn report_round_trips_through_json() {
    let mut p = proc_(10, 260 * MIB);
    p.open_files.push(open(1));
    let r = from_sample(&sample(vec![file(1, 256 * MIB, Some(MIB))], vec![p]));
    let text = serde_json::to_string(&r).unwrap();
    let back: Report = serde_json::from_str(&text).unwrap();
    assert_eq!(back, r);
}

fn gpu(index: u32, integrated: Option<bool>, procs: &[(i32, u64)]) -> GpuDeviceSample {
    GpuDeviceSample {
        info: GpuInfo {
            index,
            name: Some("Test GPU".into()),
            uuid: Some(format!("GPU-{index}")),
            memory_total_bytes: Some(80 << 30),
            integrated,
            ..Default::default()
        },
        processes: procs
            .iter()
            .map(|&(pid, b)| GpuProcessSample {
                pid,
                kind: GpuProcessKind::Compute,
                used_bytes: Some(b),
            })
            .collect(),
        ..GpuDeviceSample::default()
    }
}

/// A mapper (11) with 300 MiB on GPU 0 and a bystander (12) with 1 GiB that never
/// touched the file, over a 256 MiB file fully cached.
fn gpu_scene(integrated: Option<bool>) -> Sample {
    let mut mapper = proc_(11, MIB);
    mapper
        .mappings
        .push(map(1, 256 * MIB, true, false, 256 * MIB, 0));
    let bystander = proc_(12, MIB);
    let mut s = sample(
        vec![file(1, 256 * MIB, Some(256 * MIB))],
        vec![mapper, bystander],
    );
    s.gpu.not_available = None;
    s.gpu.devices = vec![gpu(0, integrated, &[(11, 300 * MIB), (12, 1024 * MIB)])];
    s
}

#[test]
fn device_memory_of_a_mapper_is_a_suspected_device_copy_beside_the_count() {
    let r = from_sample(&gpu_scene(Some(false)));
    let f = &r.files[0];
    assert_eq!(f.device_copies.len(), 1, "{:?}", f.device_copies);
    let d = &f.device_copies[0];
    assert_eq!((d.pid, d.gpu, d.proven), (11, Some(0), false));
    assert_eq!(d.attributed_bytes, 256 * MIB);
    assert_eq!(d.device_bytes, 300 * MIB);
    assert_eq!(d.via, "mapped");
    let rep = &f.representations;
    assert_eq!(
        rep.device,
        Some(0.0),
        "NVML answered: no proven device copy is 0, known"
    );
    assert_eq!(
        rep.proven,
        Some(1.0),
        "the suspicion is not summed into the count"
    );
    assert_eq!(rep.suspected_device, 1.0);
    let p = r.processes.iter().find(|p| p.pid == 11).unwrap();
    assert_eq!(p.gpu_memory_bytes, Some(300 * MIB));
    let bystander = r.processes.iter().find(|p| p.pid == 12).unwrap();
    assert_eq!(bystander.gpu_memory_bytes, Some(1024 * MIB));
    let found = r
        .findings
        .iter()
        .find(|f| f.code == "suspected-device-copy")
        .expect("finding");
    assert!(
        found
            .message()
            .contains("discrete GPU the device copy is the right one"),
        "{}",
        found.message()
    );
}

#[test]
fn on_an_integrated_gpu_the_finding_says_the_page_cache_could_be_read_in_place() {
    let r = from_sample(&gpu_scene(Some(true)));
    let found = r
        .findings
        .iter()
        .find(|f| f.code == "suspected-device-copy")
        .expect("finding");
    assert!(
        found
            .message()
            .contains("could read the page cache in place"),
        "{}",
        found.message()
    );
    assert!(found.remedy().unwrap().contains("twofold probe"));
}

#[test]
fn too_little_device_memory_is_no_suspicion() {
    let mut s = gpu_scene(Some(false));
    s.gpu.devices[0].processes[0].used_bytes = Some(100 * MIB);
    let r = from_sample(&s);
    assert!(r.files[0].device_copies.is_empty());
    assert_eq!(r.files[0].representations.suspected_device, 0.0);
}

#[test]
fn without_nvml_every_gpu_value_is_unknown_not_zero() {
    let mut s = gpu_scene(Some(false));
    s.gpu.devices.clear();
    s.gpu.not_available = Some("libnvidia-ml.so.1 not found (no NVIDIA driver)".into());
    let r = from_sample(&s);
    assert_eq!(r.files[0].representations.device, None);
    assert!(r.processes.iter().all(|p| p.gpu_memory_bytes.is_none()));
    assert_eq!(
        r.gpus.not_available.as_deref(),
        s.gpu.not_available.as_deref()
    );
}

#[test]
fn a_proven_device_copy_is_in_the_count_and_not_suspected_again() {
    let mut s = gpu_scene(Some(false));
    s.gpu.device_proofs = vec![DeviceProofSample {
        pid: 11,
        file: key(1),
        gpu_uuid: Some("GPU-0".into()),
        file_bytes: 256 * MIB,
        device_bytes: 256 * MIB,
        file_xxh3: "1".into(),
        device_xxh3: "1".into(),
    }];
    let r = from_sample(&s);
    let f = &r.files[0];
    assert_eq!(f.device_copies.len(), 1, "{:?}", f.device_copies);
    assert!(f.device_copies[0].proven);
    assert_eq!(f.representations.device, Some(1.0));
    assert_eq!(f.representations.proven, Some(2.0));
    assert_eq!(f.representations.suspected_device, 0.0);
}

/// arm64 with 64 KiB pages (Grace Hopper): the page size comes from the sample (sysconf on
/// the machine that collected it), and every page count follows it: the page-cache
/// fraction counts whole 64 KiB pages (the last, partial one cached whole), a mapping past
/// the end of the file is measured from the end of its last page, and the residency
/// record counts 64 KiB pages.
#[test]
fn page_counts_follow_a_64k_page_size() {
    const K: u64 = 1024;
    let size = 100 * K; // two 64 KiB pages, the second partial
    let mut mapper = proc_(11, MIB);
    // Mapped 192 KiB from offset 0: 64 KiB past the end of the last page (128 KiB).
    mapper
        .mappings
        .push(map(1, 192 * K, true, false, 64 * K, 0));
    let mut s = sample(vec![file(1, size, Some(64 * K))], vec![mapper]);
    let at = |s: &Sample| {
        let r = from_sample(s);
        let f = r.files.iter().find(|f| f.key == key(1)).unwrap().clone();
        (f.resident_fraction.unwrap(), f.mappers[0].beyond_eof_bytes)
    };
    s.system.page_size = 64 * K;
    assert_eq!(
        at(&s),
        (0.5, 64 * K),
        "64 KiB pages: 1 of 2 pages, 64 KiB past EOF"
    );
    s.system.page_size = 16 * K;
    assert_eq!(at(&s), (4.0 / 7.0, 80 * K), "16 KiB pages: 4 of 7 pages");
    s.system.page_size = 4 * K;
    assert_eq!(at(&s), (16.0 / 25.0, 92 * K), "4 KiB pages: 16 of 25 pages");
    assert_eq!(from_sample(&s).system.page_size_bytes, 4 * K);

    // `twofold residency`'s record: 64 KiB pages counted as such.
    let cached = ResidencySample {
        cached_bytes: 64 * K,
        ..ResidencySample::default()
    };
    let r = residency::build("/m/f1.gguf", Some(size), 64 * K, Ok(&cached), None);
    assert_eq!((r.pages, r.resident_pages), (Some(2), Some(1)));
    assert_eq!(r.resident_bytes, Some(64 * K));
    assert_eq!(r.resident_fraction, Some(0.5));
}

/// The eBPF counters count the system's pages: the trace context takes the page size from
/// the sample (4 KiB where a stored sample has none), and a refault finding says bytes in it.
#[test]
fn trace_pages_follow_the_sample_page_size() {
    let mut s = sample(vec![file(1, MIB, Some(0))], vec![]);
    let t = crate::sample::trace::TraceSample::default();
    s.system.page_size = 0;
    assert_eq!(
        trace_context(&s, &[], &t).page_bytes,
        crate::sample::PAGE_BYTES
    );
    s.system.page_size = 64 << 10;
    let ctx = trace_context(&s, &[], &t);
    assert_eq!(ctx.page_bytes, 64 << 10);
    let f = Finding {
        severity: Severity::Notice,
        code: Code::Refaults {
            file: key(1),
            path: Some("/m/f1.gguf".into()),
            pages: 16,
            page_bytes: ctx.page_bytes,
            secs: 1.0,
        },
    };
    assert!(
        f.message().contains("had 1.0 MiB evicted"),
        "{}",
        f.message()
    );
}

#[test]
fn the_gate_names_each_condition_a_file_meets() {
    use super::gate::{check, Condition};
    let all = [
        Condition::Copies,
        Condition::Suspected,
        Condition::LowerBound,
    ];
    // A suspected, unsearched copy: suspected and lower-bound, not copies.
    let mut copier = proc_(10, 260 * MIB);
    copier.open_files.push(open(1));
    let mut s = sample(vec![file(1, 256 * MIB, Some(256 * MIB))], vec![copier]);
    s.candidates = vec![candidate(10, 1, 260 * MIB, CandidateWhy::Holder)];
    let met = check(&from_sample(&s), &all);
    let names: Vec<_> = met.iter().map(|m| m.condition.name()).collect();
    assert_eq!(names, ["suspected", "lower-bound"]);
    assert_eq!(met[1].why, "the count is a lower bound (1 unsearched)");
    // The same copy proven: copies only.
    s.proofs = vec![found(10, 1, 256 * MIB)];
    let met = check(&from_sample(&s), &all);
    assert_eq!(met.len(), 1, "{met:?}");
    assert_eq!(met[0].condition, Condition::Copies);
    assert_eq!(met[0].why, "proven 1.00 private copies");
    // Only the conditions asked for.
    assert!(check(&from_sample(&s), &[Condition::Suspected]).is_empty());
    // A file only in the page cache meets none.
    let s = sample(vec![file(1, 256 * MIB, Some(256 * MIB))], vec![]);
    assert!(check(&from_sample(&s), &all).is_empty());
}

/// Memory like the file that no copy covers is shown from 25% of the file, for processes
/// tied to it only (not one that only maps shared memory, nor one that read() much of
/// anything and holds nothing of it proven), once per process, and it is never in the
/// count; its finding names the estimate and says it is not counted.
#[test]
fn unexplained_memory_is_beside_the_count_never_in_it() {
    let mut s = sample(
        vec![file(1, 256 * MIB, Some(256 * MIB))],
        vec![
            proc_(10, 600 * MIB),
            proc_(11, 600 * MIB),
            proc_(12, 600 * MIB),
            proc_(13, 600 * MIB),
        ],
    );
    for (pid, why, bytes) in [
        (10, CandidateWhy::Holder, 64 * MIB),
        (11, CandidateWhy::Holder, 63 * MIB),
        (12, CandidateWhy::SharedMemory, 256 * MIB),
        (13, CandidateWhy::Read, 300 * MIB),
        (14, CandidateWhy::Read, 300 * MIB),
    ] {
        s.candidates.push(candidate(pid, 1, 512 * MIB, why));
        // 13 read() the file and holds some of it proven; 14 read() as much of anything.
        s.proofs.push(ProofSample {
            unexplained_bytes: bytes,
            unexplained_samples: bytes / 4096 / 9,
            stride_pages: 9,
            ..found(pid, 1, if pid == 13 { 16 * MIB } else { 0 })
        });
    }
    let r = from_sample(&s);
    let f = &r.files[0];
    let got: Vec<(i32, u64)> = f
        .unexplained
        .iter()
        .map(|u| (u.pid, u.estimated_bytes))
        .collect();
    assert_eq!(got, vec![(10, 64 * MIB), (13, 300 * MIB)]);
    assert!((f.unexplained[1].fraction_of_file - 300.0 / 256.0).abs() < 1e-9);
    // The page cache and pid 13's proven 16 MiB; the unexplained memory is not in it.
    assert_eq!(f.representations.proven, Some(1.0 + 16.0 / 256.0));
    assert!(!f.representations.lower_bound);
    let texts: Vec<String> = r
        .findings
        .iter()
        .filter(|x| x.code.as_str() == "unexplained-memory")
        .map(|x| x.message())
        .collect();
    assert_eq!(texts.len(), 2, "{texts:?}");
    assert!(
        texts[0].starts_with("pid 10 (p10) holds 64.0 MiB of private memory that is no known form of 'f1.gguf' (not counted)"),
        "{texts:?}"
    );
}

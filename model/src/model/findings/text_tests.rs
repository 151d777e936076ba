//! Every finding's words, pinned; the advice for each reader; the JSON of a finding.

use super::*;
use crate::model::CopyHow;
use crate::sample::unsearched::Unsearched;
use crate::sample::Privilege;

const MIB: u64 = 1 << 20;

fn k() -> FileKey {
    FileKey {
        major: 8,
        minor: 1,
        inode: 7,
    }
}

fn p() -> String {
    "/m/model.gguf".into()
}

/// Every code's sentence, subject and remedy, as the model wrote them when it held
/// the prose (the JSON of scan and replay is unchanged by the move).
#[test]
fn every_code_reads_as_before() {
    let cases: Vec<(Code, &str, &str, Option<&str>)> = vec![
        (
            Code::ProvenPrivateCopy { file: k(), path: p(), size_bytes: Some(1 << 30), pid: 7, comm: "py".into(), how: CopyHow::Read, fraction: 1.5, file_bytes: 1 << 30, converted_bytes: 512 * MIB, conversion: Some(twofold_formats::convert::Conversion::F16ToF32), traced_read_bytes: Some(1 << 30), huge_pages: false },
            "/m/model.gguf",
            "pid 7 (py) holds a private copy of 'model.gguf' copied with read(): 100% of the file found byte by byte in its private memory (512.0 MiB of it converted F16→F32; the copy counts 1.50 of the file by the bytes it holds); it read() 100% of the file during the trace",
            Some("load it with mmap (llama.cpp's default, np.load(mmap_mode='r'), torch.load(mmap=True)) to share the page cache instead of copying it, and keep the stored dtype (or convert the file once on disk)"),
        ),
        (
            Code::ProvenPrivateCopy { file: k(), path: p(), size_bytes: Some(1 << 30), pid: 7, comm: "py".into(), how: CopyHow::Copied, fraction: 3.8, file_bytes: 3891 * MIB, converted_bytes: 0, conversion: None, traced_read_bytes: None, huge_pages: false },
            "/m/model.gguf",
            "pid 7 (py) holds 3.80 private copies of 'model.gguf' copied: 3.80 times the file's bytes found byte by byte in its private memory",
            Some("load it with mmap to share the page cache instead of copying it"),
        ),
        (
            Code::UnexplainedMemory { file: k(), path: p(), size_bytes: Some(1 << 30), pid: 7, comm: "py".into(), estimated_bytes: 768 * MIB, sampled_pages: 1548 },
            "/m/model.gguf",
            "pid 7 (py) holds 768.0 MiB of private memory that is no known form of 'model.gguf' (not counted): an estimate from 1548 sampled pages whose bytes are distributed like the model's (1.0 GiB file), in no copy twofold proved",
            Some("a runtime may keep a transformed copy (repacked or converted) twofold does not know; compare RssAnon with the runtime's own buffer sizes"),
        ),
        (
            Code::ProvenPrivateCopy { file: k(), path: p(), size_bytes: None, pid: 7, comm: "py".into(), how: CopyHow::CopiedFromMapping, fraction: 0.5, file_bytes: 0, converted_bytes: 0, conversion: None, traced_read_bytes: Some(1), huge_pages: false },
            "/m/model.gguf",
            "pid 7 (py) holds a private copy of 'model.gguf' copied out of its mapping of the file: 50% of the file found byte by byte in its private memory",
            Some("use the mapped tensors in place instead of copying them (no .clone()/.copy() of weights at load)"),
        ),
        (
            Code::ProvenPrivateCopy { file: k(), path: p(), size_bytes: Some(1 << 30), pid: 7, comm: "py".into(), how: CopyHow::Converted, fraction: 0.25, file_bytes: 512 * MIB, converted_bytes: 512 * MIB, conversion: Some(twofold_formats::convert::Conversion::F32ToF16), traced_read_bytes: None, huge_pages: false },
            "/m/model.gguf",
            "pid 7 (py) holds a private copy of 'model.gguf' converted F32→F16 out of its mapping of the file (a dtype conversion, such as .float(), .half() or .astype(np.float16), not a read): 50% of the file found byte by byte in its private memory (512.0 MiB of it converted F32→F16; the copy counts 0.25 of the file by the bytes it holds)",
            Some("store the dtype it runs in: keep the stored dtype (use the mapped tensors as they are), or convert the file once on disk to the dtype it runs in and load that"),
        ),
        (
            Code::ProvenPrivateCopy { file: k(), path: p(), size_bytes: Some(1 << 30), pid: 7, comm: "py".into(), how: CopyHow::Read, fraction: 1.0, file_bytes: 1 << 30, converted_bytes: 0, conversion: None, traced_read_bytes: None, huge_pages: true },
            "/m/model.gguf",
            "pid 7 (py) holds a private copy of 'model.gguf' copied with read(): 100% of the file found byte by byte in its huge pages (hugetlbfs)",
            Some("load it with mmap (llama.cpp's default, np.load(mmap_mode='r'), torch.load(mmap=True)) to share the page cache instead of copying it"),
        ),
        (
            Code::ProvenPrivateCopy { file: k(), path: p(), size_bytes: Some(1 << 30), pid: 7, comm: "py".into(), how: CopyHow::Pinned, fraction: 1.0, file_bytes: 1 << 30, converted_bytes: 0, conversion: None, traced_read_bytes: None, huge_pages: false },
            "/m/model.gguf",
            "pid 7 (py) holds a pinned host copy of 'model.gguf' copied into pinned (page-locked) host memory, a staging copy for the GPU (cudaHostAlloc, pin_memory()): 100% of the file found byte by byte in its host memory the NVIDIA driver maps",
            Some("free the pinned copy once it is uploaded, or register the file's own mapping for device access in place (cudaHostRegister with cudaHostRegisterReadOnly) instead of staging a copy"),
        ),
        (
            Code::SharedPrivateCopy { file: k(), path: p(), pids: vec![7, 8], shmem: false, ksm: true, fraction: 1.0, estimated: false },
            "/m/model.gguf",
            "2 processes (pids 7, 8) share one private copy of 'model.gguf' (100% of the file), merged by KSM (same-page merging of copies each made on its own): it is counted once",
            Some("KSM merged the copies (MADV_MERGEABLE, PR_SET_MEMORY_MERGE, systemd MemoryKSM=): load the file with mmap to share its page cache instead; merging costs ksmd CPU time, and a write unmerges a page"),
        ),
        (
            Code::SharedPrivateCopy { file: k(), path: p(), pids: vec![7, 8], shmem: false, ksm: false, fraction: 1.0, estimated: false },
            "/m/model.gguf",
            "2 processes (pids 7, 8) share one private copy of 'model.gguf' (100% of the file), shared copy-on-write after fork(): it is counted once",
            Some("load it with mmap before forking, so that the workers share the page cache; a worker that writes to the copy unshares its pages"),
        ),
        (
            Code::SuspectedPrivateCopy { file: k(), path: p(), size_bytes: Some(256 * MIB), pid: 8, comm: "vllm".into(), anon_bytes: 260 * MIB, unsearched: "over the budget".into(), reader: None },
            "/m/model.gguf",
            "pid 8 (vllm) could hold a copy of 'model.gguf' (private memory 260.0 MiB, 256.0 MiB file) but was not searched: over the budget",
            Some("raise --prove-budget to prove or rule it out"),
        ),
        (
            Code::CowInPrivateMapping { file: k(), path: p(), pid: 9, comm: "w".into(), cow_bytes: 88 * MIB },
            "/m/model.gguf",
            "'model.gguf' is mapped MAP_PRIVATE writable by pid 9 (w), then written in place: 88.0 MiB of it are copy-on-write private pages, a second copy of those bytes",
            Some("map it read-only, or do not write tensors in place: each written page becomes a private copy"),
        ),
        (
            Code::MappingBeyondEof { file: k(), path: p(), pid: 9, comm: "w".into(), beyond_eof_bytes: 64 << 10 },
            "/m/model.gguf",
            "pid 9 (w) maps 64.0 KiB of 'model.gguf' past its end: the file shrank while mapped, touching those pages raises SIGBUS",
            Some("never truncate or rewrite a model file in place while it is mapped; write a new file and rename it"),
        ),
        (
            Code::FileThp { file: k(), path: p(), pid: 9, comm: "w".into(), thp_bytes: 2 * MIB },
            "/m/model.gguf",
            "pid 9 (w) maps 2.0 MiB of 'model.gguf' with 2 MiB huge pages (FilePmdMapped)",
            None,
        ),
        (
            Code::SharedMapping { file: k(), path: p(), size_bytes: Some(1 << 30), sharers: 3 },
            "/m/model.gguf",
            "3 processes share one mapped copy of 'model.gguf' (1.0 GiB): PSS splits it between them",
            None,
        ),
        (
            Code::LowResidency { file: k(), path: p(), resident_fraction: 0.44 },
            "/m/model.gguf",
            "'model.gguf' is 44% resident in the page cache: reads will hit storage",
            Some("leave room for the page cache (memory limit, competing processes) or prefetch it (vmtouch -t)"),
        ),
        (
            Code::ReplacedFileHeld { file: k(), path: "/m/model.gguf (deleted)".into(), resident_bytes: Some(64 * MIB), holders: vec![(9, "llama".into())], now_at_path: Some(FileKey { major: 8, minor: 1, inode: 8 }) },
            "/m/model.gguf",
            "the old 'model.gguf' (8:1 inode 7) was replaced or deleted on disk, but pid 9 (llama) still maps or holds it: it still costs 64.0 MiB of page cache until pid 9 restarts; 'model.gguf' now names another file (8:1 inode 8)",
            Some("restart pid 9 (or have it reopen the model) to free the old one"),
        ),
        (
            Code::ReplacedFileHeld { file: k(), path: p(), resident_bytes: None, holders: vec![(9, "a".into()), (10, "b".into())], now_at_path: None },
            "/m/model.gguf",
            "the old 'model.gguf' (8:1 inode 7) was replaced or deleted on disk, but pid 9 (a), 10 (b) still map or hold it: it still costs page cache of an unknown size until pids 9, 10 restart; nothing is at that path now",
            Some("restart pid 9, 10 (or have them reopen the model) to free the old one"),
        ),
        (
            Code::ResidencyUnknown { file: k(), path: p(), reason: "denied".into(), reader: None },
            "/m/model.gguf",
            "page-cache residency of 'model.gguf' is unknown: denied",
            Some("run as root, or as the file's owner"),
        ),
        (
            Code::MultipleRepresentations { file: k(), path: p(), total: 2.0, page_cache: 1.0, cow: Some(0.0), private_copies: 1, private_fraction: 1.0, lower_bound: true },
            "/m/model.gguf",
            "'model.gguf' is in memory at least 2.00 times, proven: page cache 100% + private copies 1.00 (in 1 process)",
            Some("on unified memory the GPU can read the page cache in place: the copies are waste; on a discrete GPU only the device copy is needed"),
        ),
        (
            Code::MultipleRepresentations { file: k(), path: p(), total: 3.5, page_cache: 0.5, cow: Some(0.25), private_copies: 2, private_fraction: 2.0, lower_bound: false },
            "/m/model.gguf",
            "'model.gguf' is in memory 3.50 times, proven: page cache 50% + CoW 25% + private copies 2.00 (in 2 processes)",
            Some("on unified memory the GPU can read the page cache in place: the copies are waste; on a discrete GPU only the device copy is needed"),
        ),
        (
            Code::CountIsLowerBound { file: k(), path: p(), unsearched: 1, could_hold: 5 },
            "/m/model.gguf",
            "the count of 'model.gguf' is a lower bound: 1 of 5 processes that could hold a copy was not searched",
            None,
        ),
        (
            Code::CgroupOomKills { cgroup: "/a".into(), kills: 2 },
            "/a",
            "cgroup '/a' has had 2 OOM kill(s)",
            Some("a private model copy counts against the limit twice with its page cache; map the model instead, or raise the limit"),
        ),
        (
            Code::CgroupNearLimit { cgroup: "/a".into(), usage_bytes: 950 * MIB, limit_bytes: 1 << 30 },
            "/a",
            "cgroup '/a' uses 950.0 MiB of its 1.0 GiB limit (93%)",
            Some("page cache of mapped weights is reclaimable, anonymous copies are not: prefer mapping"),
        ),
        (
            Code::ReadCopy { file: k(), path: p(), pid: 42, comm: None, read_bytes: 900 * MIB, secs: 10.0 },
            "/m/model.gguf",
            "pid 42 (?) read 900.0 MiB of 'model.gguf' with read() in 10.0 s: a copying loader",
            Some("map the file instead (mmap, np.load(mmap_mode='r'), torch.load(mmap=True)): read() copies it into anonymous memory beside the page cache"),
        ),
        (
            Code::DirectReclaim { pid: 42, comm: Some("loader".into()), reclaim_ns: 200_000_000, reclaims: 10, longest_ns: 25_000_000, secs: 10.0 },
            "pid 42",
            "pid 42 (loader) stalled 200 ms in direct reclaim (10 reclaims, longest 25.0 ms) in 10.0 s",
            Some("memory (or its cgroup's limit) is short: a private copy of a model counts twice; map it, or raise the limit"),
        ),
        (
            Code::Refaults { file: k(), path: None, pages: 256, page_bytes: 4096, secs: 2.0 },
            "[8:1 inode 7]",
            "'[8:1 inode 7]' had 1.0 MiB evicted and read back in 2.0 s: the page cache cannot hold it",
            Some("leave room for the page cache (memory limit, competing copies) or keep it mapped and locked"),
        ),
        (
            Code::OomKill { pid: 99, comm: "hog".into(), anon_rss_bytes: 512 * MIB, file_rss_bytes: 0 },
            "pid 99",
            "pid 99 (hog) was OOM-killed (anonymous 512.0 MiB, file 0 B)",
            Some("a private copy of a model counts against memory twice with its page cache; map it instead"),
        ),
    ];
    for (code, subject, message, remedy) in cases {
        let t = render(&code);
        assert_eq!(t.subject, subject, "{code}");
        assert_eq!(t.message, message, "{code}");
        assert_eq!(t.remedy.as_deref(), remedy, "{code}");
    }
}

const ROOT: Privilege = Privilege {
    euid: 0,
    cap_sys_ptrace: true,
};
const CAPLESS_ROOT: Privilege = Privilege {
    euid: 0,
    cap_sys_ptrace: false,
};
const USER: Privilege = Privilege {
    euid: 1000,
    cap_sys_ptrace: false,
};

/// The advice fits who is running: root is never told to run as root, and a reason
/// that no privilege fixes gets no privilege advice.
#[test]
fn advice_fits_the_reader() {
    let ptrace = "failed to read '/proc/9/pagemap': reading the page map of pid 9 needs ptrace rights (root or CAP_SYS_PTRACE, or the same user with kernel.yama.ptrace_scope=0): Permission denied (os error 13)";
    let policy = format!(
        "failed to read '/proc/1/pagemap': reading the page map of pid 1 was {}: Permission denied (os error 13)",
        crate::sample::unsearched::POLICY
    );
    for reader in [Some(ROOT), Some(CAPLESS_ROOT), Some(USER), None] {
        let root = reader.is_some_and(|r| r.is_root());
        for why in [
            ptrace,
            policy.as_str(),
            "the process exited while it was searched",
            "not searched: over the proof budget (5.0 s; raise --prove-budget)",
        ] {
            let r = suspect_remedy(&Unsearched::parse(why), reader);
            assert_eq!(
                r.contains("run as root"),
                !root && why == ptrace,
                "{reader:?} {why}: {r}"
            );
            if why == policy {
                assert!(r.contains("security policy"), "{r}");
            }
            if why.contains("budget") {
                assert_eq!(r, "raise --prove-budget to prove or rule it out");
            }
            if why.contains("exited") {
                assert!(!r.contains("root") && !r.contains("CAP_"), "{r}");
            }
        }
        let r = suspect_remedy(&Unsearched::parse(ptrace), reader);
        if reader == Some(CAPLESS_ROOT) {
            assert!(r.contains("CAP_SYS_PTRACE (this root lacks it)"), "{r}");
        }
        let denied = "cannot open '/m/x' read-only: Permission denied (os error 13)";
        let gone = "cannot open '/m/x' read-only: No such file or directory (os error 2)";
        let d = residency_remedy(denied, reader);
        let g = residency_remedy(gone, reader);
        if root {
            assert!(d.unwrap().starts_with("refused even to root"));
            assert_eq!(g, None, "nothing to advise root about a file that is gone");
        } else {
            assert_eq!(d, Some("run as root, or as the file's owner"));
            assert_eq!(g, d);
        }
    }
}

/// The JSON of a finding: the same keys, in the same order, as when the model held
/// strings; read back, it writes the same bytes.
#[test]
fn json_is_written_from_the_code_and_reads_back_as_text() {
    let f = Finding {
        severity: Severity::Notice,
        code: Code::ResidencyUnknown {
            file: k(),
            path: p(),
            reason: "denied".into(),
            reader: None,
        },
    };
    let json = serde_json::to_string(&f).unwrap();
    assert_eq!(
        json,
        r#"{"severity":"notice","code":"residency-unknown","subject":"/m/model.gguf","message":"page-cache residency of 'model.gguf' is unknown: denied","remedy":"run as root, or as the file's owner"}"#
    );
    let back: Finding = serde_json::from_str(&json).unwrap();
    assert_eq!(back.code, "residency-unknown");
    assert_eq!(back.message(), f.message());
    assert_eq!(serde_json::to_string(&back).unwrap(), json);
}

/// Files of the same bytes, both cached: their paths in full (twins often share a base
/// name), and what one file would save.
#[test]
fn same_bytes_cached_names_every_file_and_the_saving() {
    let k2 = FileKey { inode: 9, ..k() };
    let code = Code::SameBytesCached {
        files: vec![
            (k(), "/cache/a/model.safetensors".into(), 64 * MIB),
            (k2, "/cache/b/model.safetensors".into(), 48 * MIB),
        ],
        extra_bytes: 48 * MIB,
    };
    let t = Finding {
        severity: Severity::Notice,
        code,
    }
    .text();
    assert_eq!(t.subject, "/cache/a/model.safetensors");
    assert_eq!(
        t.message,
        "the same bytes are cached 2 times: '/cache/a/model.safetensors', '/cache/b/model.safetensors' (up to 48.0 MiB that one copy would not need)"
    );
    assert_eq!(
        t.remedy.as_deref(),
        Some("keep one file: hard-link the others to it (ln -f, on one file system) or delete the duplicates and point their users at the one left; a reflink (cp --reflink) saves the disk space but not the memory, as each file keeps its own page cache")
    );
}

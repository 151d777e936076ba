//! Device copies II (#44) without a GPU, with real uprobes on the stand-in `libcuda.so.1`
//! (tests/trace/cuda/): which file an upload is counted under when two files hold its
//! bytes, clones made on the device, uploads narrowed to BF16, and a plain `scan` that
//! reads what a resident `record --trace-uploads` traced.
//!
//! Ground truth is what the stand-in did: it keeps each allocation's bytes, and the
//! uploader dumps them (`dump`); the device bytes that hold the file's bytes (or their
//! BF16 narrowing) are found in that dump by this test, independently of twofold.

use std::path::Path;

use crate::serial;
use crate::uploads::{file, fixture, standin, traced, traced_with, Standin, Uploader};
use twofold::model::{FileModel, Report};

/// A safetensors file of `dtype` (`F16` or `F32`) tensors of random finite values, seeded
/// by its path (no other test's file has its bytes); its tensors' (offset, len).
pub(crate) fn model(path: &Path, dtype: &str) -> Vec<(u64, u64)> {
    let lens: [u64; 4] = [1 << 20, 3 << 19, 300_000, 2 << 20];
    let elem = if dtype == "F32" { 4 } else { 2 };
    let mut header = String::from("{");
    let mut at = 0u64;
    for (i, n) in lens.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"w{i}\":{{\"dtype\":\"{dtype}\",\"shape\":[{}],\"data_offsets\":[{at},{}]}}",
            n / elem,
            at + n
        ));
        at += n;
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let base = 8 + header.len() as u64;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for b in path.as_os_str().as_encoded_bytes() {
        x = (x ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3) | 1;
    }
    for _ in 0..at / elem {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if elem == 4 {
            // Finite F32 (exponent below 255).
            bytes.extend_from_slice(&((x as u32) & 0xbfff_ffff).to_le_bytes());
        } else {
            bytes.extend_from_slice(&((x as u16) & 0xbbff).to_le_bytes());
        }
    }
    std::fs::write(path, bytes).unwrap();
    let mut out = Vec::new();
    let mut off = base;
    for n in lens {
        out.push((off, n));
        off += n;
    }
    out
}

/// The BF16 narrowing (round to nearest even) of every 4-byte group of `bytes`.
fn bf16_image(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() / 2);
    for g in bytes.chunks_exact(4) {
        let u = u32::from_le_bytes(g.try_into().unwrap());
        let h = ((u + 0x7fff + ((u >> 16) & 1)) >> 16) as u16;
        out.extend_from_slice(&h.to_le_bytes());
    }
    out
}

/// An uploader whose device memory can be dumped (`UPLOADER_DUMP`).
pub(crate) fn uploader(
    s: &Standin,
    tag: &str,
    mode: &str,
    f: &Path,
    ranges: &[(u64, u64)],
    env: &[(&str, &str)],
) -> Uploader {
    let dump = s.dir.path().join(format!("dump-{tag}"));
    let mut vars: Vec<(&str, &std::ffi::OsStr)> = vec![("UPLOADER_DUMP", dump.as_os_str())];
    vars.extend(env.iter().map(|(k, v)| (*k, std::ffi::OsStr::new(*v))));
    let mut u = Uploader::start_with(s, mode, f, ranges, &vars);
    u.dump_to = Some(dump);
    u
}

/// The stand-in's live allocations in `u`: (address, bytes).
pub(crate) fn device_memory(u: &mut Uploader) -> Vec<(u64, Vec<u8>)> {
    assert_eq!(u.say("dump"), "dumped");
    let raw = std::fs::read(u.dump_to.as_ref().unwrap()).unwrap();
    let mut out = Vec::new();
    let mut at = 0;
    while at + 16 <= raw.len() {
        let addr = u64::from_le_bytes(raw[at..at + 8].try_into().unwrap());
        let n = u64::from_le_bytes(raw[at + 8..at + 16].try_into().unwrap()) as usize;
        out.push((addr, raw[at + 16..at + 16 + n].to_vec()));
        at += 16 + n;
    }
    out
}

/// Device bytes of `mem` that hold a range of `image` (each allocation whose bytes are
/// one run of it).
pub(crate) fn held_bytes(mem: &[(u64, Vec<u8>)], image: &[u8]) -> u64 {
    let mut total = 0;
    for (_, b) in mem.iter().filter(|(_, b)| b.len() >= 64) {
        let head = u64::from_le_bytes(b[..8].try_into().unwrap());
        let found = (0..=image.len().saturating_sub(b.len())).any(|o| {
            u64::from_le_bytes(image[o..o + 8].try_into().unwrap()) == head
                && image[o..o + b.len()] == b[..]
        });
        if found {
            total += b.len() as u64;
        }
    }
    total
}

/// Proven device copies of `pid` in `f`: their device bytes, and their `via`s.
pub(crate) fn proven(f: &FileModel, pid: i32) -> (u64, Vec<String>) {
    let d: Vec<_> = f
        .device_copies
        .iter()
        .filter(|d| d.proven && d.pid == pid)
        .collect();
    (
        d.iter().map(|d| d.device_bytes).sum(),
        d.iter().map(|d| d.via.clone()).collect(),
    )
}

fn scan_json(s: &Standin, args: &[&std::ffi::OsStr], gpu: &Path, during: impl FnOnce()) -> Report {
    let (out, err) = traced(s, args, Some(gpu), during);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {err}"))
}

/// `scan M --trace-uploads 4s --json` while `during` runs.
fn traced_scan(s: &Standin, m: &Path, gpu: &Path, during: impl FnOnce()) -> Report {
    let args = [
        "scan".as_ref(),
        m.as_os_str(),
        "--trace-uploads".as_ref(),
        "4s".as_ref(),
        "--json".as_ref(),
    ];
    scan_json(s, &args, gpu, during)
}

/// The tensors of the safetensors file `a`, written as another file `p` with another header
/// (metadata first: every tensor at another file offset), as a `.pt` holds a
/// `.safetensors`' tensors: the same tensor bytes, not the same file.
fn same_tensors_other_header(a: &Path, p: &Path) {
    let bytes = std::fs::read(a).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap().trim_end();
    let mut h = format!(
        "{{\"__metadata__\":{{\"format\":\"pt\",\"note\":\"the same tensors\"}},{}",
        &header[1..]
    );
    while h.len() % 8 != 0 {
        h.push(' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(p, out).unwrap();
}

/// Two files of the same bytes, A and B, and P, another file of the same tensors: the
/// upload (and the private copy) of a process that read A is A's, whichever order they
/// are named in: it holds A open; or it closed A before it uploaded, and the read ledger
/// (`--trace`) or its command line says A. One that read P is P's the same ways. One that
/// read a third file of A's bytes (related to none of them) is counted under the same one
/// in both orders, "matched by content; also identical to" the others.
#[test]
fn the_upload_is_the_file_the_process_read_in_either_order() {
    let _serial = serial();
    let Some(s) = standin() else { return };
    let d = s.dir.path();
    let [a, b, c, p] = ["a", "b", "c", "p"].map(|n| d.join(format!("{n}.safetensors")));
    let ranges = model(&a, "F16");
    std::fs::copy(&a, &b).unwrap();
    std::fs::copy(&a, &c).unwrap();
    same_tensors_other_header(&a, &p);
    let shift = std::fs::metadata(&p).unwrap().len() - std::fs::metadata(&a).unwrap().len();
    let p_ranges: Vec<(u64, u64)> = ranges.iter().map(|(o, n)| (o + shift, *n)).collect();
    let image = std::fs::read(&a).unwrap();
    let size = image.len() as f64;
    let mut content_choice: Vec<(String, String)> = Vec::new();
    for flag in ["--trace", "--trace-uploads"] {
        for order in [[&b, &a, &p], [&p, &a, &b]] {
            let close = [("UPLOADER_CLOSE", "1")];
            let mut open = uploader(&s, "open", "heap", &a, &ranges, &[]);
            let mut closed = uploader(&s, "closed", "heap", &a, &ranges, &close);
            let mut of_p = uploader(&s, "of-p", "heap", &p, &p_ranges, &close);
            let mut other = uploader(&s, "other", "heap", &c, &ranges, &[]);
            let ctx = 64 << 20;
            let pids = [open.pid(), closed.pid(), of_p.pid(), other.pid()];
            let gpu = fixture(d, &pids.map(|p| (p, (8 << 20) + ctx)));
            let mut args: Vec<&std::ffi::OsStr> = vec!["scan".as_ref()];
            args.extend(order.iter().map(|f| f.as_os_str()));
            args.extend([flag, "4s", "--json"].map(std::ffi::OsStr::new));
            let r = scan_json(&s, &args, &gpu, || {
                for u in [&mut open, &mut closed, &mut of_p, &mut other] {
                    u.go();
                }
            });
            let [fa, fb, fp] = [&a, &b, &p].map(|x| file(&r, x));
            let truth =
                |u: &mut Uploader| held_bytes(&device_memory(u), &image[ranges[0].0 as usize..]);
            let what = format!("{flag} {:?}", order);
            let only = |pid, f: &FileModel, t: u64, why: &str| {
                for o in [fa, fb, fp] {
                    let want = if o.key == f.key { t } else { 0 };
                    assert_eq!(proven(o, pid).0, want, "{what}: pid {pid} in {}", o.path);
                }
                assert_eq!(proven(f, pid).1, ["upload"], "{what}");
                let note = f
                    .device_copies
                    .iter()
                    .find(|d| d.pid == pid)
                    .unwrap()
                    .note
                    .clone();
                assert!(
                    note.as_deref().unwrap_or("").starts_with(why),
                    "{what}: {note:?}"
                );
            };
            // It holds A open (and read it: the read ledger with --trace).
            let t = truth(&mut open);
            assert!(t > 0, "{what}: nothing of A on the device");
            let held = if flag == "--trace" {
                "the file it read"
            } else {
                "the file it holds open"
            };
            only(open.pid(), fa, t, held);
            // Its private copy: never under B (A's twin, to which it has no relation); where
            // a file of other bytes holds the same tensors (P), the proof credits them by
            // content to one of the two, the same in either order.
            let copy_of = |f: &FileModel, pid| f.proven_copies.iter().any(|c| c.pid == pid);
            assert!(!copy_of(fb, open.pid()), "{what}");
            let under: Vec<&str> = [fa, fp]
                .iter()
                .filter(|f| copy_of(f, open.pid()))
                .map(|f| f.path.as_str())
                .collect();
            assert_eq!(under.len(), 1, "{what}: {under:?}");
            content_choice.push((format!("{flag} copy"), under[0].to_string()));
            // It read A (or P) and closed it: with --trace the read ledger says which;
            // without, its command line names it.
            let closed_why = if flag == "--trace" {
                "the file it read"
            } else {
                "the file its command line names"
            };
            only(closed.pid(), fa, truth(&mut closed), closed_why);
            only(of_p.pid(), fp, truth(&mut of_p), closed_why);
            // Related to none: by content, the same file either way, and said so.
            let t = truth(&mut other);
            let counted: Vec<&FileModel> = [fa, fb, fp]
                .into_iter()
                .filter(|f| proven(f, other.pid()).0 > 0)
                .collect();
            assert_eq!(counted.len(), 1, "{what}: one file counts it");
            let f = counted[0];
            assert_eq!(proven(f, other.pid()).0, t);
            let note = f
                .device_copies
                .iter()
                .find(|d| d.pid == other.pid())
                .unwrap()
                .note
                .clone()
                .unwrap_or_default();
            assert!(
                note.starts_with("matched by content; also identical to "),
                "{what}: {note}"
            );
            for o in [fa, fb, fp].into_iter().filter(|o| o.key != f.key) {
                assert!(note.contains(&o.path), "{what}: {note}");
            }
            content_choice.push((format!("{flag} other"), f.path.clone()));
            // The device part of A's count: what is counted under A, nothing else.
            let on_a: u64 = fa
                .device_copies
                .iter()
                .filter(|d| d.proven)
                .map(|d| d.device_bytes)
                .sum();
            assert_eq!(fa.representations.device, Some(on_a as f64 / size));
        }
    }
    // Each content choice is the same in both orders.
    for flag in ["--trace", "--trace-uploads"] {
        for what in ["copy", "other"] {
            let k = format!("{flag} {what}");
            let v: Vec<&String> = content_choice
                .iter()
                .filter(|c| c.0 == k)
                .map(|c| &c.1)
                .collect();
            assert_eq!(v.len(), 2, "{k}");
            assert_eq!(v[0], v[1], "{k}");
        }
    }
}

/// An upload later overwritten in part (a copy of other bytes into the first half of each
/// range) counts only the half the device still holds; an upload whose allocations were
/// freed (`cuMemFree_v2`) counts nothing and says why; one left alone counts whole. Truth:
/// the stand-in's device memory.
#[test]
fn an_upload_overwritten_or_freed_on_the_device_counts_only_what_stays() {
    let _serial = serial();
    let Some(s) = standin() else { return };
    let d = s.dir.path();
    let m = d.join("m.safetensors");
    let ranges = model(&m, "F16");
    let image = std::fs::read(&m).unwrap();
    let mut over = uploader(&s, "over", "heap", &m, &ranges, &[]);
    let mut gone = uploader(&s, "gone", "heap", &m, &ranges, &[]);
    let mut kept = uploader(&s, "kept", "staging", &m, &ranges, &[]);
    let all = [over.pid(), gone.pid(), kept.pid()];
    let gpu = fixture(d, &all.map(|p| (p, 64 << 20)));
    let r = traced_scan(&s, &m, &gpu, || {
        for u in [&mut over, &mut gone, &mut kept] {
            u.go();
        }
        assert_eq!(over.say("overwrite"), "overwritten");
        assert_eq!(gone.say("unload"), "unloaded");
    });
    let f = file(&r, &m);
    let total: u64 = ranges.iter().map(|r| r.1).sum();
    // Overwritten: no allocation is a run of the file any more; each one's second half is.
    let mem = device_memory(&mut over);
    assert_eq!(held_bytes(&mem, &image), 0);
    let halves: Vec<(u64, Vec<u8>)> = mem
        .iter()
        .map(|(a, b)| (*a, b[b.len() / 2..].to_vec()))
        .collect();
    let over_truth = held_bytes(&halves, &image);
    assert_eq!(
        over_truth,
        ranges.iter().map(|r| r.1 - r.1 / 2).sum::<u64>()
    );
    assert_eq!(proven(f, over.pid()).0, over_truth, "{:?}", f.uploads);
    // Freed: nothing of the file on the device; the upload is listed, not proven.
    assert_eq!(held_bytes(&device_memory(&mut gone), &image), 0);
    assert_eq!(proven(f, gone.pid()).0, 0);
    let u = f.uploads.iter().find(|u| u.pid == gone.pid()).unwrap();
    assert!(!u.proven, "{u:?}");
    assert!(
        u.not_proven
            .as_deref()
            .unwrap_or("")
            .starts_with("overwritten or freed on the device since"),
        "{u:?}"
    );
    // Left alone: all of it.
    assert_eq!(held_bytes(&device_memory(&mut kept), &image), total);
    assert_eq!(proven(f, kept.pid()).0, total);
    let size = f.size_bytes.unwrap() as f64;
    let want = (over_truth + total) as f64 / size;
    assert!((f.representations.device.unwrap() - want).abs() < 1e-9);
}

/// Clones on the device (cuMemcpyDtoDAsync_v2, cuMemcpyPeer of part of each tensor, a
/// unified cuMemcpyAsync from device to device): each another device copy of the bytes
/// it holds; a freed clone is no copy any more.
#[test]
fn a_clone_on_the_device_is_another_device_copy_until_it_is_freed() {
    let _serial = serial();
    let Some(s) = standin() else { return };
    let d = s.dir.path();
    let m = d.join("m.safetensors");
    let ranges = model(&m, "F16");
    let image = std::fs::read(&m).unwrap();
    let mut dtod = uploader(
        &s,
        "dtod",
        "heap",
        &m,
        &ranges,
        &[("UPLOADER_CLONE", "dtoda")],
    );
    let mut peer = uploader(
        &s,
        "peer",
        "heap",
        &m,
        &ranges,
        &[
            ("UPLOADER_CLONE", "peer"),
            ("UPLOADER_CLONE_BYTES", "65536"),
        ],
    );
    let mut unified = uploader(
        &s,
        "unified",
        "staging",
        &m,
        &ranges,
        &[("UPLOADER_CLONE", "copya")],
    );
    let mut freed = uploader(
        &s,
        "freed",
        "heap",
        &m,
        &ranges,
        &[("UPLOADER_CLONE", "dtod")],
    );
    let all = [dtod.pid(), peer.pid(), unified.pid(), freed.pid()];
    let gpu = fixture(d, &all.map(|p| (p, (24 << 20) + (64 << 20))));
    let r = traced_scan(&s, &m, &gpu, || {
        for u in [&mut dtod, &mut peer, &mut unified, &mut freed] {
            u.go();
        }
        assert_eq!(freed.say("free"), "freed");
    });
    let f = file(&r, &m);
    let mut total = 0;
    for (u, clones) in [
        (&mut dtod, true),
        (&mut peer, true),
        (&mut unified, true),
        (&mut freed, false),
    ] {
        let truth = held_bytes(&device_memory(u), &image);
        total += truth;
        let (bytes, mut via) = proven(f, u.pid());
        via.sort();
        assert_eq!(bytes, truth, "pid {}: {:?}", u.pid(), f.device_copies);
        let want: Vec<String> = if clones {
            vec!["clone".into(), "upload".into()]
        } else {
            vec!["upload".into()]
        };
        assert_eq!(via, want, "pid {}", u.pid());
    }
    let c = f.device_copies.iter().find(|c| c.via == "clone").unwrap();
    assert!(
        c.note
            .as_deref()
            .unwrap_or("")
            .contains("cloned on the device"),
        "{c:?}"
    );
    assert!(f
        .uploads
        .iter()
        .any(|u| u.cloned && u.pid == peer.pid() && u.copies == 4));
    let size = f.size_bytes.unwrap() as f64;
    assert!((f.representations.device.unwrap() - total as f64 / size).abs() < 1e-9);
    // The process rows count the device-to-device copies.
    let p = |pid| {
        r.gpus
            .uploads
            .as_ref()
            .unwrap()
            .processes
            .iter()
            .find(|p| p.seen.pid == pid)
            .unwrap()
    };
    assert_eq!(p(dtod.pid()).seen.device_copies, 4);
    assert_eq!(p(freed.pid()).seen.device_copies, 4);
    // The text says it.
    let mut again = uploader(
        &s,
        "again",
        "heap",
        &m,
        &ranges,
        &[("UPLOADER_CLONE", "dtod")],
    );
    let gpu = fixture(d, &[(again.pid(), 80 << 20)]);
    let (text, _) = traced(
        &s,
        &[
            "scan".as_ref(),
            m.as_os_str(),
            "--trace-uploads".as_ref(),
            "2s".as_ref(),
        ],
        Some(&gpu),
        || again.go(),
    );
    assert!(
        text.lines()
            .any(|l| l.contains("proven device copy") && l.contains("cloned on the device")),
        "{text}"
    );
}

/// An F32 file uploaded narrowed to BF16 (`.to("cuda", torch.bfloat16)`): a device copy of
/// half the file's tensor bytes, counted by its bytes and named; a clone of it too.
#[test]
fn a_narrowed_upload_counts_by_its_bytes() {
    let _serial = serial();
    let Some(s) = standin() else { return };
    let d = s.dir.path();
    let m = d.join("f32.safetensors");
    let ranges = model(&m, "F32");
    let image = bf16_image(&std::fs::read(&m).unwrap());
    let mut narrow = uploader(&s, "narrow", "narrow", &m, &ranges, &[]);
    let mut cloned = uploader(
        &s,
        "cloned",
        "narrow",
        &m,
        &ranges[..2],
        &[("UPLOADER_CLONE", "dtoda")],
    );
    let gpu = fixture(d, &[narrow.pid(), cloned.pid()].map(|p| (p, 80 << 20)));
    let r = traced_scan(&s, &m, &gpu, || {
        narrow.go();
        cloned.go();
    });
    let f = file(&r, &m);
    let size = f.size_bytes.unwrap() as f64;
    let t_narrow = held_bytes(&device_memory(&mut narrow), &image);
    let t_cloned = held_bytes(&device_memory(&mut cloned), &image);
    let tensors: u64 = ranges.iter().map(|r| r.1).sum();
    // What the stand-in holds: every tensor, at half its bytes.
    assert_eq!(t_narrow, tensors / 2);
    assert_eq!(proven(f, narrow.pid()).0, t_narrow, "{:?}", f.device_copies);
    assert_eq!(proven(f, cloned.pid()).0, t_cloned);
    let dc = f
        .device_copies
        .iter()
        .find(|c| c.pid == narrow.pid())
        .unwrap();
    assert!((dc.fraction - t_narrow as f64 / size).abs() < 1e-9);
    assert!(dc.fraction < 0.51 && dc.fraction > 0.49, "{dc:?}");
    assert!(
        dc.note
            .as_deref()
            .unwrap_or("")
            .contains("converted F32→BF16"),
        "{dc:?}"
    );
    let up = f
        .uploads
        .iter()
        .find(|u| u.pid == narrow.pid() && !u.cloned)
        .unwrap();
    assert_eq!(
        (
            up.conversion.map(|c| c.name()),
            up.file_bytes,
            up.device_bytes
        ),
        (Some("F32→BF16".to_string()), tensors, tensors / 2)
    );
    let want = (t_narrow + t_cloned) as f64 / size;
    assert!((f.representations.device.unwrap() - want).abs() < 1e-9);
    // No libcufile here: GPUDirect Storage reads are said not to be traced (never 0).
    let gds = r.gpus.uploads.as_ref().and_then(|u| u.gds.clone()).unwrap();
    assert!(gds.libraries.is_empty());
    assert!(
        gds.unavailable
            .as_deref()
            .unwrap_or("")
            .contains("no libcufile"),
        "{gds:?}"
    );
}

/// GPUDirect Storage: a loader that reads a file straight into device memory with
/// `cuFileRead` (the stand-in libcufile.so.0: no host copy, no cuMemcpyHtoD) holds a
/// device copy of the bytes it read, proven by the read, and the text names libcufile.
#[test]
fn a_gds_read_into_device_memory_is_a_device_copy() {
    let _serial = serial();
    let Some(s) = standin() else { return };
    let d = s.dir.path();
    let m = d.join("gds.safetensors");
    let ranges = model(&m, "F16");
    let image = std::fs::read(&m).unwrap();
    let mut gds = uploader(&s, "gds", "gds", &m, &ranges[1..], &[]);
    let gpu = fixture(d, &[(gds.pid(), 80 << 20)]);
    let cufile = d.join("libcufile.so.0");
    let env = [("TWOFOLD_LIBCUFILE", cufile.as_os_str())];
    let args: [&std::ffi::OsStr; 5] = [
        "scan".as_ref(),
        m.as_os_str(),
        "--trace-uploads".as_ref(),
        "3s".as_ref(),
        "--json".as_ref(),
    ];
    let (out, err) = traced_with(&s, &args, Some(&gpu), &env, || gds.go());
    let r: Report = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {err}"));
    let f = file(&r, &m);
    let truth = held_bytes(&device_memory(&mut gds), &image);
    assert_eq!(truth, ranges[1..].iter().map(|r| r.1).sum::<u64>());
    assert_eq!(
        proven(f, gds.pid()),
        (truth, vec!["upload".into()]),
        "{:?}",
        f.uploads
    );
    let u = f.uploads.iter().find(|u| u.pid == gds.pid()).unwrap();
    assert_eq!(
        (u.entry.as_str(), u.copies, u.file_bytes),
        ("cuFileRead", 3, truth)
    );
    let want: Vec<(u64, u64)> = vec![(ranges[1].0, ranges[3].0 + ranges[3].1)];
    assert_eq!(u.ranges, want);
    let g = r.gpus.uploads.as_ref().and_then(|u| u.gds.clone()).unwrap();
    assert_eq!(g.libraries, [cufile.display().to_string()]);
    assert!(g.unavailable.is_none());
}

//! Real runtimes: NumPy and safetensors load files the test wrote; the loaders report where
//! each array's bytes live, `/proc/PID/maps` says whether that is anonymous memory (a copy)
//! or the file mapping, and `twofold dupes` must find exactly the copies that exist.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::*;

fn python_ready() -> bool {
    Command::new("python3")
        .args(["-c", "import numpy, safetensors"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A `.npy` (format 1.0) of `n` little-endian f32 values, header padded to 64 bytes.
fn npy(dir: &Path, n: usize) -> PathBuf {
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({n},), }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    let mut s = 0x9e37_79b9u32;
    for _ in 0..n {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        bytes.extend_from_slice(&((s % 100_000) as f32 / 7.0).to_le_bytes());
    }
    let path = dir.join("weights.npy");
    std::fs::write(&path, bytes).unwrap();
    path
}

struct Loaded {
    reader: twofold::spawn::Reader,
    /// Array name → data address.
    arrays: BTreeMap<String, u64>,
}

fn load(mode: &str, file: &Path) -> Loaded {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/runtimes/load.py");
    let mut cmd = Command::new("python3");
    cmd.arg(script).arg(mode).arg(file);
    let (reader, line) = twofold::spawn::Reader::spawn(cmd, Duration::from_secs(120)).unwrap();
    let arrays: BTreeMap<String, u64> = serde_json::from_str(&line).unwrap();
    Loaded { reader, arrays }
}

/// Addresses that lie in anonymous memory of `pid`, by the kernel's own maps.
fn in_anon(pid: i32, addrs: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let anon: Vec<(u64, u64)> = maps
        .lines()
        .filter_map(twofold::collect::maps::parse_header)
        .filter(|m| m.inode == 0)
        .map(|m| (m.start, m.end))
        .collect();
    addrs
        .iter()
        .filter(|(_, a)| anon.iter().any(|(s, e)| s <= *a && *a < e))
        .map(|(k, a)| (k.clone(), *a))
        .collect()
}

fn found(pid: i32, file: &Path) -> BTreeMap<String, u64> {
    dupes_report(pid, file, &[]).processes[0].files[0]
        .copies
        .iter()
        .map(|c| (c.tensor.clone(), c.address))
        .collect()
}

#[test]
fn numpy_load_copies_and_mmap_mode_does_not() {
    let _group = crate::common::group(module_path!());
    if !require(python_ready(), "python3 with numpy and safetensors") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = npy(dir.path(), 1 << 20);
    let copy = load("np-copy", &file);
    let truth = in_anon(copy.reader.pid(), &copy.arrays);
    assert_eq!(truth.len(), 1, "np.load must copy: {:?}", copy.arrays);
    assert_eq!(found(copy.reader.pid(), &file), truth);
    let mapped = load("np-mmap", &file);
    assert!(in_anon(mapped.reader.pid(), &mapped.arrays).is_empty());
    assert!(found(mapped.reader.pid(), &file).is_empty());
}

#[test]
fn safetensors_load_file_copies_exactly_what_the_kernel_says() {
    let _group = crate::common::group(module_path!());
    if !require(python_ready(), "python3 with numpy and safetensors") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = safetensors(
        dir.path(),
        &[
            ("a", 1 << 20, Fill::Random(11)),
            ("b", 256 << 10, Fill::Random(12)),
            ("c", 64 << 10, Fill::Random(13)),
        ],
    );
    for mode in ["st-load", "st-load-write"] {
        let l = load(mode, &file);
        let mut truth = in_anon(l.reader.pid(), &l.arrays);
        if mode == "st-load-write" {
            // The array written in place holds other values: not a copy of the file.
            truth.remove("a");
        }
        assert_eq!(
            found(l.reader.pid(), &file),
            truth,
            "{mode}: arrays {:?}",
            l.arrays
        );
    }
}
/// The present pages of `pid`'s readable anonymous mappings (by its maps and pagemap),
/// read through `/proc/PID/mem` (never `process_vm_readv`, which can unshare what it
/// reads) into anonymous mappings of this process: `(start, bytes)`.
fn present_anon(pid: i32) -> Vec<(u64, memmap2::MmapMut)> {
    use std::os::unix::fs::FileExt;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let pagemap = std::fs::File::open(format!("/proc/{pid}/pagemap")).unwrap();
    let mut out = Vec::new();
    for line in maps.lines() {
        let m = twofold::collect::maps::parse_header(line).unwrap();
        if m.inode != 0 || !m.perms.read || m.path.starts_with("[v") {
            continue;
        }
        let pages = ((m.end - m.start) / 4096) as usize;
        let mut pm = vec![0u8; pages * 8];
        pagemap.read_exact_at(&mut pm, m.start / 4096 * 8).unwrap();
        let mut buf = memmap2::MmapMut::map_anon(pages * 4096).unwrap();
        for p in 0..pages {
            let e = u64::from_le_bytes(pm[p * 8..p * 8 + 8].try_into().unwrap());
            if e & (1 << 63) != 0 {
                let at = m.start + p as u64 * 4096;
                let _ = mem.read_exact_at(&mut buf[p * 4096..(p + 1) * 4096], at);
            }
        }
        out.push((m.start, buf));
    }
    out
}

/// Bytes of copies of `tensors` (file ranges of `file`) in `pid`'s present anonymous
/// memory, at any byte alignment: every occurrence of a tensor's whole bytes counts (a
/// heap may hold one tensor several times), none twice.
fn own_tensor_search(pid: i32, file: &[u8], tensors: &[(usize, usize)]) -> u64 {
    let mut by_head: std::collections::HashMap<[u8; 16], Vec<usize>> = Default::default();
    let mut first = vec![false; 1 << 16];
    for (i, &(o, _)) in tensors.iter().enumerate() {
        let head: [u8; 16] = file[o..o + 16].try_into().unwrap();
        first[usize::from(u16::from_le_bytes([head[0], head[1]]))] = true;
        by_head.entry(head).or_default().push(i);
    }
    let mut found = 0u64;
    for (_, buf) in present_anon(pid) {
        let mut pos = 0usize;
        while pos + 16 <= buf.len() {
            if !first[usize::from(u16::from_le_bytes([buf[pos], buf[pos + 1]]))] {
                pos += 1;
                continue;
            }
            let head: [u8; 16] = buf[pos..pos + 16].try_into().unwrap();
            let hit = by_head.get(&head).and_then(|ts| {
                ts.iter()
                    .map(|&i| tensors[i])
                    .find(|&(o, n)| pos + n <= buf.len() && buf[pos..pos + n] == file[o..o + n])
            });
            match hit {
                Some((_, n)) => {
                    found += n as u64;
                    pos += n;
                }
                None => pos += 1,
            }
        }
    }
    found
}

/// Bytes of `pid`'s present anonymous memory equal to the file's tensors, at 16-byte
/// granularity: every 16-byte window of memory (at any byte position) equal to a window of
/// a tensor at a 16-byte step of it. Fragments of freed buffers count, as twofold's partial
/// copies do (it credits whole pages of them only). Also the bytes of the whole pages that
/// lie inside one run of such windows: what a search by pages cannot miss.
fn own_window_search(pid: i32, file: &[u8], tensors: &[(usize, usize)]) -> (u64, u64) {
    let mut keys = std::collections::HashSet::new();
    let mut first = vec![0u64; 1 << 18];
    let bit = |w: &[u8]| (u32::from_le_bytes(w[..4].try_into().unwrap()) >> 8) as usize;
    for &(o, n) in tensors {
        for w in file[o..o + n].chunks_exact(16) {
            let b = bit(w);
            first[b / 64] |= 1 << (b % 64);
            keys.insert(u128::from_le_bytes(w.try_into().unwrap()));
        }
    }
    // Whole pages inside one run of equal windows: [start, end) of the run, in the buffer.
    let whole =
        |start: usize, end: usize| (end / 4096).saturating_sub(start.div_ceil(4096)) as u64 * 4096;
    let (mut found, mut pages) = (0u64, 0u64);
    for (_, buf) in present_anon(pid) {
        let mut pos = 0usize;
        let mut run = None;
        while pos + 16 <= buf.len() {
            let w = &buf[pos..pos + 16];
            let b = bit(w);
            if first[b / 64] & (1 << (b % 64)) != 0
                && keys.contains(&u128::from_le_bytes(w.try_into().unwrap()))
            {
                found += 16;
                run = Some(run.unwrap_or(pos));
                pos += 16;
            } else {
                if let Some(start) = run.take() {
                    pages += whole(start, pos);
                }
                pos += 1;
            }
        }
        if let Some(start) = run {
            pages += whole(start, pos);
        }
    }
    (found, pages)
}

/// onnxruntime parses the model into its heap and keeps each initializer in an
/// allocation of its own. With initializers of 256 B to 4 KiB (under the 4 KiB a tensor
/// once needed to be searched), twofold must still find at least 0.9 of the copies the
/// test's own search of the process finds.
#[test]
fn onnxruntime_small_initializers_are_found_in_its_heap() {
    let _group = crate::common::group(module_path!());
    if !require(is_root(), "root") || !python_has("numpy, onnx, onnxruntime") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("small.onnx");
    // y = concat(x * W_i): x is an input, so nothing is folded into a constant.
    let out = run_ok(Command::new("python3").args([
        "-c",
        r#"
import json, sys, numpy as np, onnx
from onnx import helper, numpy_helper, TensorProto
rng = np.random.default_rng(int(sys.argv[2]))
inits, nodes = [], []
for i in range(600):
    w = rng.standard_normal(int(rng.integers(64, 1000))).astype(np.float32)
    inits.append(numpy_helper.from_array(w, f"w{i}"))
    nodes.append(helper.make_node("Mul", ["x", f"w{i}"], [f"m{i}"]))
nodes.append(helper.make_node("Concat", [f"m{i}" for i in range(600)], ["y"], axis=0))
g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])], inits)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 8
onnx.save(m, sys.argv[1])
data = open(sys.argv[1], "rb").read()
ranges = []
for t in inits:
    raw = numpy_helper.to_array(t).tobytes()
    ranges.append([data.index(raw), len(raw)])
print(json.dumps(ranges))
"#,
        path.to_str().unwrap(),
        "21",
    ]));
    let tensors: Vec<(usize, usize)> = serde_json::from_slice(&out).unwrap();
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(tensors.iter().all(|t| t.1 < 4096) && tensors.len() == 600);
    let c = twofold::container::open(&path).unwrap();
    assert_eq!(c.format, twofold::container::Format::Onnx);
    assert_eq!(c.tensors.len(), 600);
    let ort = load("ort", &path);
    let f = std::fs::File::open(&path).unwrap();
    // SAFETY: a read-only mapping of the test's own file, never truncated meanwhile.
    let file = unsafe { memmap2::Mmap::map(&f) }.unwrap();
    let truth = own_tensor_search(ort.reader.pid(), &file, &tensors);
    let all: u64 = tensors.iter().map(|t| t.1 as u64).sum();
    assert!(
        truth >= all,
        "onnxruntime holds fewer copies than expected: {truth} of {all}"
    );
    let (r, m) = scan_file(&path);
    let copy = m
        .proven_copies
        .iter()
        .find(|c| c.pid == ort.reader.pid())
        .unwrap_or_else(|| panic!("no copy found in onnxruntime: {m:#?}"));
    let got = copy.identical_bytes + copy.converted_bytes;
    eprintln!(
        "onnxruntime: own search {truth} bytes ({:.3} of the file), twofold {got} ({:.3})",
        truth as f64 / size as f64,
        copy.fraction
    );
    assert!(
        got as f64 >= 0.9 * truth as f64,
        "twofold {got}, own search {truth}"
    );
    assert!(
        got <= truth,
        "twofold credits more than there is: {got} > {truth}"
    );
    assert!(
        !m.suspected_copies.iter().any(|s| s.pid == ort.reader.pid()),
        "{:#?}",
        m.suspected_copies
    );
    let cached = m.representations.page_cache.unwrap_or(0.0);
    assert!(m.representations.proven.unwrap() >= cached + 0.9 * truth as f64 / size as f64);
    // Nothing says the file cannot be searched.
    let json = serde_json::to_string(&r).unwrap();
    assert!(
        !json.contains("nothing in the file can be searched"),
        "{json}"
    );
}

/// A process maps an F16 file (np.memmap) and widens half of its tensors to F32
/// (`.astype(np.float32)`, as `.float()` does): the cause is a conversion out of its
/// mapping, never a read(), the fraction is the memory the converted tensors occupy
/// (twice their bytes in the file: a copy counts by the bytes it holds), and the remedy
/// does not tell a process that already maps the file to map it.
#[test]
fn widening_a_mapped_file_is_a_conversion_with_the_right_remedy() {
    let _group = crate::common::group(module_path!());
    if !require(is_root(), "root") || !python_has("numpy") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..16).map(|i| format!("t{i:02}")).collect();
    let specs: Vec<(&str, u64, Fill)> = (0..16u64)
        .map(|i| {
            let len = (16 + i * 37 % 96) * 4096;
            (names[i as usize].as_str(), len, Fill::Random(100 + i))
        })
        .collect();
    let (file, written) = safetensors(dir.path(), &specs);
    let size = std::fs::metadata(&file).unwrap().len();
    let mut cmd = Command::new("python3");
    cmd.args([
        "-c",
        r#"
import json, struct, sys, numpy as np
path = sys.argv[1]
with open(path, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
mm = np.memmap(path, dtype=np.uint8, mode="r")
kept, converted = {}, []
for i, k in enumerate(sorted(header)):
    a, b = header[k]["data_offsets"]
    t = mm[8 + n + a: 8 + n + b].view(np.float16)
    if i % 2 == 0:
        t = t.astype(np.float32)
        converted.append(k)
    kept[k] = t
    float(np.asarray(t, dtype=np.float64).sum())
print(json.dumps(converted), flush=True)
sys.stdin.read()
"#,
    ])
    .arg(&file);
    let (child, line) = twofold::spawn::Reader::spawn(cmd, Duration::from_secs(120)).unwrap();
    let converted: Vec<String> = serde_json::from_str(&line).unwrap();
    let truth: u64 = written
        .iter()
        .filter(|w| converted.contains(&w.name))
        .map(|w| w.len)
        .sum();
    // F32 in memory: two bytes per byte of the F16 file.
    let truth = 2.0 * truth as f64 / size as f64;
    let (r, m) = scan_file(&file);
    let copy = m
        .proven_copies
        .iter()
        .find(|c| c.pid == child.pid())
        .unwrap_or_else(|| panic!("no copy found: {m:#?}"));
    assert_eq!(copy.how, twofold::model::CopyHow::Converted, "{copy:?}");
    assert!(copy.mapped);
    assert!(
        (copy.fraction - truth).abs() <= 0.02,
        "fraction {}, truth {truth}",
        copy.fraction
    );
    let finding = r
        .findings
        .iter()
        .find(|x| {
            x.code.as_str() == "proven-private-copy"
                && x.message().contains(&format!("pid {}", child.pid()))
        })
        .unwrap_or_else(|| panic!("no finding: {:#?}", r.findings));
    let (message, remedy) = (finding.message(), finding.remedy().unwrap_or_default());
    assert!(
        message.contains("conversion") && !message.contains("read()"),
        "{message}"
    );
    assert!(
        !remedy.contains("mmap") && remedy.contains("dtype"),
        "{remedy}"
    );
    // The JSON names the cause; the table row too.
    let json = serde_json::to_value(&r).unwrap();
    let how = json["files"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|f| f["proven_copies"].as_array().unwrap())
        .find(|c| c["pid"] == child.pid())
        .map(|c| c["how"].clone());
    assert_eq!(how, Some(serde_json::json!("converted")));
    let human = run_ok(Command::new(exe()).arg("scan").arg(&file));
    let human = String::from_utf8_lossy(&human);
    let row = human
        .lines()
        .find(|l| l.trim_start().starts_with(&child.pid().to_string()))
        .unwrap_or_else(|| panic!("{human}"));
    assert!(row.contains("converted"), "{row}");
}

/// onnxruntime keeps a model's weights several times in its heap (the bytes it read, the
/// parsed protobuf, the initializers of each graph it builds). A model whose weights are
/// `Constant` nodes and `If`-branch initializers (as silero_vad is exported), 300 tensors
/// of 256 B to 64 KiB: twofold counts every whole copy the test's own search of the
/// process finds, and it may credit more (pages of freed buffers that still hold the
/// bytes), never more than the bytes equal to the tensors the test finds at 16-byte
/// granularity; and it words them as copies ("private copies 3.88"), never as "1 private
/// copy (388%)".
#[test]
fn onnxruntime_copies_repeated_in_its_heap_are_all_counted_and_worded_as_copies() {
    let _group = crate::common::group(module_path!());
    if !require(is_root(), "root") || !python_has("numpy, onnx, onnxruntime") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("branches.onnx");
    let out = run_ok(Command::new("python3").args([
        "-c",
        r#"
import json, sys, numpy as np, onnx
from onnx import helper, numpy_helper, TensorProto
rng = np.random.default_rng(4)
raws = []
def branch(tag):
    inits, nodes = [], []
    for i in range(150):
        w = rng.standard_normal(int(np.exp(rng.uniform(np.log(64), np.log(16384))))).astype(np.float32)
        raws.append(w.tobytes())
        if i % 2:
            inits.append(numpy_helper.from_array(w, f"{tag}w{i}"))
        else:
            nodes.append(helper.make_node("Constant", [], [f"{tag}w{i}"], value=numpy_helper.from_array(w)))
        nodes.append(helper.make_node("Mul", ["x", f"{tag}w{i}"], [f"{tag}m{i}"]))
    nodes.append(helper.make_node("Concat", [f"{tag}m{i}" for i in range(150)], [f"{tag}y"], axis=0))
    return helper.make_graph(nodes, tag, [], [helper.make_tensor_value_info(f"{tag}y", TensorProto.FLOAT, [None])], inits)
then, other = branch("a"), branch("b")
g = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
                       helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])], [])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 8
onnx.checker.check_model(m)
onnx.save(m, sys.argv[1])
data = open(sys.argv[1], "rb").read()
print(json.dumps([[data.index(r), len(r)] for r in raws]))
"#,
        path.to_str().unwrap(),
    ]));
    let tensors: Vec<(usize, usize)> = serde_json::from_slice(&out).unwrap();
    let size = std::fs::metadata(&path).unwrap().len();
    // Every weight is a tensor of the file (none in the main graph's initializers).
    let c = twofold::container::open(&path).unwrap();
    assert_eq!(c.tensors.len(), 300);
    let ort = load("ort", &path);
    let pid = ort.reader.pid();
    let f = std::fs::File::open(&path).unwrap();
    // SAFETY: a read-only mapping of the test's own file, never truncated meanwhile.
    let file = unsafe { memmap2::Mmap::map(&f) }.unwrap();
    let truth = own_tensor_search(pid, &file, &tensors) as f64 / size as f64;
    let (bytes, pages) = own_window_search(pid, &file, &tensors);
    let (bytes, pages) = (bytes as f64 / size as f64, pages as f64 / size as f64);
    let anon = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let anon: f64 = anon
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap()
        * 1024.0;
    let (r, m) = scan_file(&path);
    let got: f64 = m
        .proven_copies
        .iter()
        .filter(|c| c.pid == pid)
        .map(|c| c.fraction)
        .sum();
    eprintln!(
        "onnxruntime heap: whole copies found by the test {truth:.3} of the file, bytes equal to the tensors {bytes:.3} (in whole pages {pages:.3}), twofold {got:.3}, RssAnon {:.3}",
        anon / size as f64
    );
    // Never more than the bytes that are there; at least every page that lies whole inside
    // one run of them (less than all the bytes by fragments of freed buffers: twofold
    // credits the pages a partial copy fills, not every 16 bytes).
    assert!(got <= bytes + 0.005, "twofold {got}, bytes there {bytes}");
    assert!(
        got >= pages - 0.005,
        "twofold {got}, whole pages there {pages}"
    );
    assert!(
        truth >= 2.0,
        "onnxruntime holds fewer copies than expected: {truth}"
    );
    assert!(got >= truth - 0.02, "twofold {got}, whole copies {truth}");
    assert!(got <= anon / size as f64, "twofold {got} beyond RssAnon");
    // Its own parts known, and onnxruntime searched in full. A process of another test
    // (the runtimes tests run two at a time) may exit while the whole-host scan searches
    // it, and make the count a lower bound, as it should: named, never this one.
    let reps = &m.representations;
    assert!(reps.page_cache.is_some() && reps.cow.is_some(), "{reps:?}");
    assert!(
        m.candidates.unsearched.iter().all(|u| u.pid != pid),
        "onnxruntime not searched in full: {:?}",
        m.candidates.unsearched
    );
    if reps.lower_bound {
        eprintln!(
            "note: lower bound from processes this test did not start: {:?}",
            m.candidates.unsearched
        );
    }
    // A runtime's heap of copies, buffers and activations is no unknown form of it.
    assert!(m.unexplained.is_empty(), "{:#?}", m.unexplained);
    // Worded as copies.
    let text = |code: &str| {
        r.findings
            .iter()
            .filter(|x| x.code.as_str() == code && x.message().contains(".onnx"))
            .map(|x| x.message())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let all = text("multiple-representations");
    // (In 1 process, or 2 when a bit of the test's own truth reading is still in its heap.)
    assert!(
        all.contains(&format!("private copies {got:.2} (in ")),
        "{all}"
    );
    let proven = text("proven-private-copy");
    assert!(
        proven.contains(&format!(
            "pid {pid} (python3) holds {got:.2} private copies of 'branches.onnx'"
        )),
        "{proven}"
    );
    let human = run_ok(
        Command::new(exe())
            .args(["scan", "--prove-budget", "300s", "--pid", &pid.to_string()])
            .arg(&path),
    );
    let human = String::from_utf8_lossy(&human);
    assert!(
        human.contains(&format!("private copies: {got:.2} of the file")),
        "{human}"
    );
    assert!(!human.contains("1 private copy ("), "{human}");
}

//! The words of findings: from a typed [`Code`] and its numbers, the subject, the
//! sentence and the remedy people read (in `scan`, `replay`, `top`) and the JSON carries
//! (`{"severity", "code", "subject", "message", "remedy"}`). The model decides; this writes.

use serde::de::Deserializer;
use serde::ser::{SerializeStruct, Serializer};
use serde::{Deserialize, Serialize};

use super::remedy::{residency_remedy, suspect_remedy};
use crate::model::findings::{Code, Finding, Severity};
use crate::sample::FileKey;
use crate::units::{count, iec, iec_opt};

mod proven;

/// A finding as people read it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Text {
    /// The file path, cgroup or process it concerns.
    pub subject: String,
    pub message: String,
    pub remedy: Option<String>,
}

fn name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn text(subject: impl Into<String>, message: String, remedy: Option<&str>) -> Text {
    Text {
        subject: subject.into(),
        message,
        remedy: remedy.map(str::to_string),
    }
}

/// `[major:minor inode N]`: a file no process named.
fn unnamed(k: FileKey) -> String {
    format!("[{}:{} inode {}]", k.major, k.minor, k.inode)
}

/// "GPU 0 (NVIDIA H200, discrete)".
pub fn gpu_label(gpu: Option<u32>, name: Option<&str>, integrated: Option<bool>) -> String {
    let kind = match integrated {
        Some(true) => "integrated",
        Some(false) => "discrete",
        None => "type unknown",
    };
    let name = name.map(|n| format!("{n}, ")).unwrap_or_default();
    match gpu {
        Some(g) => format!("GPU {g} ({name}{kind})"),
        None => format!("a GPU NVML does not list ({name}{kind})"),
    }
}

/// How one physical copy came to be mapped by several processes.
fn shared_how(shmem: bool, ksm: bool) -> &'static str {
    if ksm {
        "merged by KSM (same-page merging of copies each made on its own)"
    } else if shmem {
        "mapped from shared memory"
    } else {
        "shared copy-on-write after fork()"
    }
}

/// The subject, sentence and remedy of a finding.
pub fn render(code: &Code) -> Text {
    match code {
        c @ Code::ProvenPrivateCopy { .. } => proven::render(c),
        Code::SharedPrivateCopy {
            path,
            pids,
            shmem,
            ksm,
            fraction,
            estimated,
            ..
        } => {
            let list: Vec<String> = pids.iter().map(i32::to_string).collect();
            text(
                path,
                format!(
                    "{} processes (pids {}) share one private copy of '{}' ({:.0}% of the file{}), {}: it is counted once",
                    pids.len(),
                    list.join(", "),
                    name(path),
                    fraction * 100.0,
                    if *estimated { ", estimated without page frame numbers" } else { "" },
                    shared_how(*shmem, *ksm)
                ),
                Some(if *ksm {
                    "KSM merged the copies (MADV_MERGEABLE, PR_SET_MEMORY_MERGE, systemd MemoryKSM=): load the file with mmap to share its page cache instead; merging costs ksmd CPU time, and a write unmerges a page"
                } else if *shmem {
                    "map the model file itself instead of a shared-memory copy of it: the page cache is already shared"
                } else {
                    "load it with mmap before forking, so that the workers share the page cache; a worker that writes to the copy unshares its pages"
                }),
            )
        }
        Code::SuspectedPrivateCopy {
            path,
            size_bytes,
            pid,
            comm,
            anon_bytes,
            unsearched,
            reader,
            ..
        } => text(
            path,
            format!(
                "pid {pid} ({comm}) could hold a copy of '{}' (private memory {}, {} file) but was not searched: {}",
                name(path),
                iec(*anon_bytes),
                iec_opt(*size_bytes),
                // Said once: a reason that begins with the same words does not repeat them.
                unsearched
                    .text()
                    .strip_prefix("not searched: ")
                    .unwrap_or(unsearched.text())
            ),
            Some(suspect_remedy(unsearched, *reader)),
        ),
        Code::UnexplainedMemory {
            path,
            size_bytes,
            pid,
            comm,
            estimated_bytes,
            sampled_pages,
            ..
        } => text(
            path,
            format!(
                "pid {pid} ({comm}) holds {} of private memory that is no known form of '{}' (not counted): an estimate from {sampled_pages} sampled pages whose bytes are distributed like the model's ({} file), in no copy twofold proved",
                iec(*estimated_bytes),
                name(path),
                iec_opt(*size_bytes)
            ),
            Some("a runtime may keep a transformed copy (repacked or converted) twofold does not know; compare RssAnon with the runtime's own buffer sizes"),
        ),
        Code::CowInPrivateMapping {
            path,
            pid,
            comm,
            cow_bytes,
            ..
        } => text(
            path,
            format!(
                "'{}' is mapped MAP_PRIVATE writable by pid {pid} ({comm}), then written in place: {} of it are copy-on-write private pages, a second copy of those bytes",
                name(path),
                iec(*cow_bytes)
            ),
            Some("map it read-only, or do not write tensors in place: each written page becomes a private copy"),
        ),
        Code::MappingBeyondEof {
            path,
            pid,
            comm,
            beyond_eof_bytes,
            ..
        } => text(
            path,
            format!(
                "pid {pid} ({comm}) maps {} of '{}' past its end: the file shrank while mapped, touching those pages raises SIGBUS",
                iec(*beyond_eof_bytes),
                name(path)
            ),
            Some("never truncate or rewrite a model file in place while it is mapped; write a new file and rename it"),
        ),
        Code::FileThp {
            path,
            pid,
            comm,
            thp_bytes,
            ..
        } => text(
            path,
            format!(
                "pid {pid} ({comm}) maps {} of '{}' with 2 MiB huge pages (FilePmdMapped)",
                iec(*thp_bytes),
                name(path)
            ),
            None,
        ),
        Code::SharedMapping {
            path,
            size_bytes,
            sharers,
            ..
        } => text(
            path,
            format!(
                "{} share one mapped copy of '{}' ({}): PSS splits it between them",
                count(*sharers as u64, "process", "processes"),
                name(path),
                iec_opt(*size_bytes)
            ),
            None,
        ),
        Code::SameBytesCached { files, extra_bytes } => {
            let names: Vec<String> = files.iter().map(|f| format!("'{}'", f.1)).collect();
            text(
                files.first().map_or("", |f| f.1.as_str()),
                format!(
                    "the same bytes are cached {} times: {} (up to {} that one copy would not need)",
                    files.len(),
                    names.join(", "),
                    iec(*extra_bytes)
                ),
                Some("keep one file: hard-link the others to it (ln -f, on one file system) or delete the duplicates and point their users at the one left; a reflink (cp --reflink) saves the disk space but not the memory, as each file keeps its own page cache"),
            )
        }
        Code::LowResidency {
            path,
            resident_fraction,
            ..
        } => text(
            path,
            format!(
                "'{}' is {:.0}% resident in the page cache: reads will hit storage",
                name(path),
                resident_fraction * 100.0
            ),
            Some("leave room for the page cache (memory limit, competing processes) or prefetch it (vmtouch -t)"),
        ),
        Code::ReplacedFileHeld {
            file,
            path,
            resident_bytes,
            holders,
            now_at_path,
        } => {
            let path = crate::sample::strip_deleted(path);
            let pids: Vec<String> = holders.iter().map(|(p, _)| p.to_string()).collect();
            let named: Vec<String> = holders
                .iter()
                .map(|(p, c)| format!("{p} ({c})"))
                .collect();
            let one = holders.len() == 1;
            let cost = match resident_bytes {
                Some(b) => format!("{} of page cache", iec(*b)),
                None => "page cache of an unknown size".to_string(),
            };
            let now = match now_at_path {
                Some(k) => format!(
                    "; '{}' now names another file ({}:{} inode {})",
                    name(path),
                    k.major,
                    k.minor,
                    k.inode
                ),
                None => "; nothing is at that path now".to_string(),
            };
            text(
                path,
                format!(
                    "the old '{}' ({}:{} inode {}) was replaced or deleted on disk, but pid {} still {} it: it still costs {cost} until {} restart{}{now}",
                    name(path),
                    file.major,
                    file.minor,
                    file.inode,
                    named.join(", "),
                    if one { "maps or holds" } else { "map or hold" },
                    if one {
                        format!("pid {}", pids[0])
                    } else {
                        format!("pids {}", pids.join(", "))
                    },
                    if one { "s" } else { "" },
                ),
                Some(&format!(
                    "restart pid {} (or have {} reopen the model) to free the old one",
                    pids.join(", "),
                    if one { "it" } else { "them" }
                )),
            )
        }
        Code::ResidencyUnknown {
            path,
            reason,
            reader,
            ..
        } => text(
            path,
            format!(
                "page-cache residency of '{}' is unknown: {reason}",
                name(path)
            ),
            residency_remedy(reason, *reader),
        ),
        Code::MultipleRepresentations {
            path,
            total,
            page_cache,
            cow,
            private_copies,
            private_fraction,
            lower_bound,
            ..
        } => {
            let mut parts = vec![format!("page cache {:.0}%", page_cache * 100.0)];
            if let Some(cow) = cow.filter(|c| *c > 0.0) {
                parts.push(format!("CoW {:.0}%", cow * 100.0));
            }
            if *private_copies > 0 {
                // By the bytes they hold ("private copies 3.80"), and how many processes
                // hold them: a heap can hold a file's tensors several times.
                parts.push(format!(
                    "private copies {private_fraction:.2} (in {})",
                    count(*private_copies as u64, "process", "processes")
                ));
            }
            let at_least = if *lower_bound { "at least " } else { "" };
            text(
                path,
                format!(
                    "'{}' is in memory {at_least}{total:.2} times, proven: {}",
                    name(path),
                    parts.join(" + ")
                ),
                Some("on unified memory the GPU can read the page cache in place: the copies are waste; on a discrete GPU only the device copy is needed"),
            )
        }
        Code::CountIsLowerBound {
            path,
            unsearched,
            could_hold,
            ..
        } => text(
            path,
            format!(
                "the count of '{}' is a lower bound: {unsearched} of {} that could hold a copy {} not searched",
                name(path),
                count(*could_hold as u64, "process", "processes"),
                if *unsearched == 1 { "was" } else { "were" }
            ),
            None,
        ),
        Code::CgroupOomKills { cgroup, kills } => text(
            cgroup,
            format!("cgroup '{cgroup}' has had {kills} OOM kill(s)"),
            Some("a private model copy counts against the limit twice with its page cache; map the model instead, or raise the limit"),
        ),
        Code::CgroupNearLimit {
            cgroup,
            usage_bytes,
            limit_bytes,
        } => text(
            cgroup,
            format!(
                "cgroup '{cgroup}' uses {} of its {} limit ({:.0}%)",
                iec(*usage_bytes),
                iec(*limit_bytes),
                *usage_bytes as f64 * 100.0 / *limit_bytes as f64
            ),
            Some("page cache of mapped weights is reclaimable, anonymous copies are not: prefer mapping"),
        ),
        Code::ReadCopy {
            path,
            pid,
            comm,
            read_bytes,
            secs,
            ..
        } => text(
            path,
            format!(
                "pid {pid} ({}) read {} of '{}' with read() in {secs:.1} s: a copying loader",
                comm.as_deref().unwrap_or("?"),
                iec(*read_bytes),
                name(path)
            ),
            Some("map the file instead (mmap, np.load(mmap_mode='r'), torch.load(mmap=True)): read() copies it into anonymous memory beside the page cache"),
        ),
        Code::DirectReclaim {
            pid,
            comm,
            reclaim_ns,
            reclaims,
            longest_ns,
            secs,
        } => text(
            format!("pid {pid}"),
            format!(
                "pid {pid} ({}) stalled {:.0} ms in direct reclaim ({reclaims} reclaims, longest {:.1} ms) in {secs:.1} s",
                comm.as_deref().unwrap_or("?"),
                *reclaim_ns as f64 / 1e6,
                *longest_ns as f64 / 1e6
            ),
            Some("memory (or its cgroup's limit) is short: a private copy of a model counts twice; map it, or raise the limit"),
        ),
        Code::Refaults {
            file,
            path,
            pages,
            page_bytes,
            secs,
        } => {
            let shown = path.clone().unwrap_or_else(|| unnamed(*file));
            let message = format!(
                "'{}' had {} evicted and read back in {secs:.1} s: the page cache cannot hold it",
                name(&shown),
                iec(pages.saturating_mul(*page_bytes))
            );
            text(
                shown,
                message,
                Some("leave room for the page cache (memory limit, competing copies) or keep it mapped and locked"),
            )
        }
        Code::OomKill {
            pid,
            comm,
            anon_rss_bytes,
            file_rss_bytes,
        } => text(
            format!("pid {pid}"),
            format!(
                "pid {pid} ({comm}) was OOM-killed (anonymous {}, file {})",
                iec(*anon_rss_bytes),
                iec(*file_rss_bytes)
            ),
            Some("a private copy of a model counts against memory twice with its page cache; map it instead"),
        ),
        Code::DeviceCopy {
            path,
            pid,
            comm,
            gpu,
            gpu_name,
            integrated,
            device_bytes,
            proven,
            via,
            ..
        } => {
            let label = gpu_label(*gpu, gpu_name.as_deref(), *integrated);
            let (verdict, remedy) = match integrated {
                Some(false) => (
                    "on a discrete GPU the device copy is the right one: host copies of it (page cache, private copies) are the waste once it is uploaded",
                    "after upload, free host copies (drop read() buffers; load with mmap so the page cache stays reclaimable)",
                ),
                Some(true) => (
                    "on an integrated GPU (unified memory) the device could read the page cache in place: this copy doubles the model in the same DRAM",
                    "import the file's pages instead of copying them; `twofold probe` measures map, resident and per-use-copy on this machine",
                ),
                None => (
                    "whether the GPU shares host memory is not known (no libcuda)",
                    "`twofold probe --caps` says whether the GPU is integrated",
                ),
            };
            let message = if *proven {
                let how = match via.as_str() {
                    "upload" => "its upload matched the file's bytes",
                    "clone" => "cloned on the device from an upload of it",
                    _ => "read back identical to the file",
                };
                format!(
                    "pid {pid} ({comm}) holds a device copy of '{}' on {label}: {} of device memory, {how}; {verdict}",
                    name(path),
                    iec(*device_bytes)
                )
            } else {
                let did = match via.as_str() {
                    "mapped" => "maps",
                    "open" => "holds open",
                    "copied" => "copied",
                    "read" => "read()",
                    _ => "names",
                };
                format!(
                    "pid {pid} ({comm}) {did} '{}' and holds {} of device memory on {label}: a suspected device copy (NVML gives sizes, not contents); {verdict}",
                    name(path),
                    iec(*device_bytes)
                )
            };
            text(path, message, Some(remedy))
        }
        Code::Text {
            subject,
            message,
            remedy,
            ..
        } => Text {
            subject: subject.clone(),
            message: message.clone(),
            remedy: remedy.clone(),
        },
    }
}

impl Finding {
    /// What people read: subject, sentence, remedy.
    pub fn text(&self) -> Text {
        render(&self.code)
    }

    /// The file path, cgroup or process the finding concerns.
    pub fn subject(&self) -> String {
        self.text().subject
    }

    /// The sentence.
    pub fn message(&self) -> String {
        self.text().message
    }

    pub fn remedy(&self) -> Option<String> {
        self.text().remedy
    }
}

/// `{"severity", "code", "subject", "message", "remedy"}`, the text written here.
impl Serialize for Finding {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let t = self.text();
        let mut st = s.serialize_struct("Finding", 5)?;
        st.serialize_field("severity", &self.severity)?;
        st.serialize_field("code", self.code.as_str())?;
        st.serialize_field("subject", &t.subject)?;
        st.serialize_field("message", &t.message)?;
        st.serialize_field("remedy", &t.remedy)?;
        st.end()
    }
}

/// A finding read back from JSON keeps its code and text ([`Code::Text`]).
impl<'de> Deserialize<'de> for Finding {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Written {
            severity: Severity,
            code: String,
            subject: String,
            message: String,
            remedy: Option<String>,
        }
        let w = Written::deserialize(d)?;
        Ok(Finding {
            severity: w.severity,
            code: Code::Text {
                code: w.code,
                subject: w.subject,
                message: w.message,
                remedy: w.remedy,
            },
        })
    }
}

#[cfg(test)]
#[path = "text_tests.rs"]
mod tests;

//! Reading another process's memory, read-only, for byte-level proof of copies.
//!
//! - `/proc/PID/maps`: which ranges to search: anonymous mappings (heap, `mmap`ed buffers,
//!   shared anonymous memory) and private writable file mappings (where copy-on-write
//!   pages live). Guard pages (no read permission) and `[vvar]`/`[vsyscall]` are skipped.
//! - `/proc/PID/pagemap` (<https://docs.kernel.org/admin-guide/mm/pagemap.html>): one u64
//!   per page; bit 63 present, bit 62 swapped, bit 61 file-page or shared-anon. Only
//!   present pages are read, and inside private file mappings only anonymous (CoW) pages,
//!   so twofold never faults pages in or swaps them in.
//! - `/proc/PID/mem` (<https://man7.org/linux/man-pages/man5/proc_pid_mem.5.html>), read
//!   with `pread(2)`: copies bytes out of the target without stopping it. Opening it needs
//!   ptrace access (`PTRACE_MODE_ATTACH`: the same user under `ptrace_scope` 0, or root /
//!   `CAP_SYS_PTRACE`). Nothing is ever written to the target.
//!
//! Never `process_vm_readv(2)`: it *pins* the pages it reads (`FOLL_PIN`), and the kernel
//! unshares an anonymous page shared copy-on-write after `fork()` before it lets it be
//! pinned, copying it into the process read. Measured on this kernel (6.18): an 8 MiB
//! buffer shared by fork (2,048 pages) kept 0 of 2,048 pages shared after one
//! `process_vm_readv` of it, and 2,048 of 2,048 after a `pread` of `/proc/PID/mem`
//! (pagemap PFNs of parent and child). `/proc/PID/mem` takes references without pinning,
//! and since only present pages are read (pagemap first) nothing is faulted in either.
//! See docs/read-only.md.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::error::{CollectError, Result};
use super::maps;
use crate::sample::places::{self, Nvidia};
use crate::sample::MappingSample;

/// The search's page (4 KiB whatever the system's page size).
pub use crate::sample::PAGE_BYTES as PAGE;
const PM_PRESENT: u64 = 1 << 63;
const PM_FILE: u64 = 1 << 61;
/// The page is mapped by this process only (pagemap bit 56, since Linux 4.2).
pub const PM_EXCLUSIVE: u64 = 1 << 56;
/// Page frame number (bits 0–54), zero without `CAP_SYS_ADMIN`.
pub const PM_PFN: u64 = (1 << 55) - 1;
/// Most addresses one [`ProcMemory::gather`] call takes.
pub const IOV_MAX: usize = 1024;

/// One entry per 4 KiB unit of `[start, end)` from entries of `sys`-byte pages that begin
/// at `base`.
pub fn expand_entries(
    entries: &[u64],
    base: u64,
    sys: u64,
    start: u64,
    end: u64,
    out: &mut Vec<u64>,
) {
    out.clear();
    let mut a = start / PAGE * PAGE;
    while a < end {
        let i = ((a - base) / sys) as usize;
        out.push(entries.get(i).copied().unwrap_or(0));
        a += PAGE;
    }
}

pub use crate::model::dupes::RegionKind;

/// What kind of memory a readable mapping is for the search; `None`: not searched (shared
/// or read-only file mappings are page cache; the NVIDIA driver's device mappings are the
/// GPU's memory and registers, never read). `driver`: the process maps `/dev/nvidiactl`.
pub fn region_kind(m: &MappingSample, driver: bool) -> Option<RegionKind> {
    Some(match places::nvidia(&m.path) {
        Some(Nvidia::Device) => return None,
        Some(Nvidia::HostMemory | Nvidia::Managed) => RegionKind::Pinned,
        None if places::hugetlb_anon(&m.path) => RegionKind::Hugetlb,
        None if m.inode == 0 && !m.perms.shared => RegionKind::Anon,
        None if driver && m.perms.shared && (m.inode == 0 || places::anonymous_shared(&m.path)) => {
            RegionKind::Pinned
        }
        // Shared anonymous memory, shmem, memfd, SysV shm: anonymous memory (with an
        // inode, but for the oldest kernels' shared anonymous mappings).
        None if m.perms.shared && (m.inode == 0 || m.major == 0) => RegionKind::SharedAnon,
        None if !m.perms.shared && m.perms.write => RegionKind::PrivateFile,
        None => return None,
    })
}

/// A range of the target to search.
#[derive(Debug, Clone)]
pub struct Region {
    pub start: u64,
    pub end: u64,
    pub kind: RegionKind,
    pub label: String,
    /// The file mapped there (private file mappings, and shmem/tmpfs/memfd files).
    pub key: Option<crate::sample::FileKey>,
}

/// A mapping's range and its resident and proportional sizes, as smaps gives them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MappingSizes {
    pub start: u64,
    pub end: u64,
    pub rss_bytes: u64,
    pub pss_bytes: u64,
    /// `KSM:`: its pages KSM merged (Linux 6.1 and later; 0 where the kernel has none).
    pub ksm_bytes: u64,
}

/// `Rss:` and `Pss:` of each mapping of an smaps text, huge pages of the hugetlbfs pool
/// (`Private_Hugetlb:`, `Shared_Hugetlb:`) counted in both (unreadable values: unknown,
/// taken as huge for `Rss`, so a huge region is never skipped for want of a number).
pub fn parse_smaps_sizes(text: &str) -> Vec<MappingSizes> {
    let kb = |rest: &str| -> Option<u64> {
        rest.trim()
            .trim_end_matches("kB")
            .trim()
            .parse::<u64>()
            .ok()
    };
    let mut out: Vec<MappingSizes> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Rss:") {
            if let Some(m) = out.last_mut() {
                m.rss_bytes = kb(rest).map_or(u64::MAX, |k| k.saturating_mul(1024));
            }
        } else if let Some(rest) = line
            .strip_prefix("Private_Hugetlb:")
            .or_else(|| line.strip_prefix("Shared_Hugetlb:"))
        {
            // Huge pages of the hugetlbfs pool are in neither `Rss` nor `Pss`: they are
            // resident, and with no proportional size they count whole (how many share a
            // shared one is known only from frame numbers).
            if let (Some(m), Some(k)) = (out.last_mut(), kb(rest)) {
                m.rss_bytes = m.rss_bytes.saturating_add(k.saturating_mul(1024));
                m.pss_bytes = m.pss_bytes.saturating_add(k.saturating_mul(1024));
            }
        } else if let Some(rest) = line.strip_prefix("KSM:") {
            if let Some(m) = out.last_mut() {
                m.ksm_bytes = kb(rest).map_or(0, |k| k.saturating_mul(1024));
            }
        } else if let Some(rest) = line.strip_prefix("Pss:") {
            if let Some(m) = out.last_mut() {
                m.pss_bytes = kb(rest).map_or(0, |k| k.saturating_mul(1024));
            }
        } else if let Some((range, _)) = line.split_once(' ') {
            if let Some((a, b)) = range.split_once('-') {
                if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                    out.push(MappingSizes {
                        start: a,
                        end: b,
                        rss_bytes: u64::MAX,
                        pss_bytes: 0,
                        ksm_bytes: 0,
                    });
                }
            }
        }
    }
    out
}

/// Read-only access to one process's memory.
pub struct ProcMemory {
    pub pid: i32,
    pagemap: File,
    pagemap_path: PathBuf,
    /// `/proc/PID/mem`, opened read-only: the only way twofold reads another process's
    /// memory.
    mem: File,
}

/// A refusal in words that fit who is reading ([`super::access::denied`]).
fn denied_hint(e: io::Error, what: &str, pid: i32, proc_root: &Path) -> io::Error {
    if matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES)) {
        let why = super::access::denied(what, pid, super::access::privilege(proc_root));
        io::Error::new(e.kind(), format!("{why}: {e}"))
    } else {
        e
    }
}

impl ProcMemory {
    pub fn open(proc_root: &Path, pid: i32) -> Result<ProcMemory> {
        let pagemap_path = proc_root.join(pid.to_string()).join("pagemap");
        let pagemap = File::open(&pagemap_path).map_err(|e| {
            CollectError::io(
                &pagemap_path,
                denied_hint(e, "the page map", pid, proc_root),
            )
        })?;
        // Opening `mem` is the kernel's ptrace check (PTRACE_MODE_ATTACH): a missing
        // permission is reported here, up front.
        let mem_path = proc_root.join(pid.to_string()).join("mem");
        let mem = File::open(&mem_path).map_err(|e| {
            CollectError::io(&mem_path, denied_hint(e, "the memory", pid, proc_root))
        })?;
        Ok(ProcMemory {
            pid,
            pagemap,
            pagemap_path,
            mem,
        })
    }

    /// Another handle on the same process for another thread: the same open files
    /// (positional reads share no offset).
    pub fn try_clone(&self) -> io::Result<ProcMemory> {
        Ok(ProcMemory {
            pid: self.pid,
            pagemap: self.pagemap.try_clone()?,
            pagemap_path: self.pagemap_path.clone(),
            mem: self.mem.try_clone()?,
        })
    }

    /// Ranges worth searching, from `maps` text.
    pub fn regions(maps_path: &Path, maps_text: &str) -> Result<Vec<Region>> {
        let mut maps: Vec<MappingSample> = Vec::new();
        for (i, line) in maps_text.lines().enumerate() {
            if line.is_empty() {
                continue;
            }
            maps.push(
                maps::parse_header(line)
                    .ok_or_else(|| CollectError::parse(maps_path, i + 1, line))?,
            );
        }
        // A process that maps the NVIDIA driver's control device (a CUDA process): its
        // anonymous shared memory is the driver's pinned host memory.
        let driver = maps
            .iter()
            .any(|m| places::nvidia(&m.path) == Some(Nvidia::HostMemory));
        let mut out: Vec<Region> = Vec::new();
        for m in maps {
            if !m.perms.read || m.path == "[vvar]" || m.path == "[vsyscall]" || m.path == "[vdso]" {
                continue;
            }
            let Some(kind) = region_kind(&m, driver) else {
                continue;
            };
            // Adjacent anonymous VMAs are one buffer split by flags (an allocator's
            // madvise(MADV_HUGEPAGE) on its aligned part, say): search them as one.
            if let Some(prev) = out.last_mut() {
                if prev.end == m.start && prev.kind == kind && kind == RegionKind::Anon {
                    prev.end = m.end;
                    continue;
                }
            }
            // The file mapped there: a private file mapping's (its CoW pages), or a
            // shmem/tmpfs file's (a copy found there is in that file); anonymous shared
            // memory, huge pages and driver memory are no file.
            let file = kind == RegionKind::PrivateFile
                || (kind == RegionKind::SharedAnon
                    && m.inode != 0
                    && !places::anonymous_shared(&m.path));
            out.push(Region {
                start: m.start,
                end: m.end,
                kind,
                label: if m.path.is_empty() {
                    "[anon]".to_string()
                } else {
                    m.path.clone()
                },
                key: file.then(|| m.key()),
            });
        }
        Ok(out)
    }

    /// Resident bytes of each mapping, by its start address, from `/proc/PID/smaps` (its
    /// walk skips unpopulated page tables, so a huge empty reservation costs nothing).
    pub fn rss_by_start(&self) -> std::io::Result<std::collections::HashMap<u64, u64>> {
        Ok(self
            .smaps_sizes()?
            .into_iter()
            .map(|m| (m.start, m.rss_bytes))
            .collect())
    }

    /// Each mapping's range with its `Rss` and `Pss` (bytes), from `/proc/PID/smaps`.
    pub fn smaps_sizes(&self) -> std::io::Result<Vec<MappingSizes>> {
        let path = self.pagemap_path.with_file_name("smaps");
        let bytes = super::keyvalue::read_kernel_file(&path)?;
        Ok(parse_smaps_sizes(&String::from_utf8_lossy(&bytes)))
    }

    /// Pagemap entries for `[start, end)`, one per 4 KiB [`PAGE`] (the unit the search
    /// samples in). The kernel writes one entry per *system* page: on 16 KiB or 64 KiB
    /// page systems (arm64, Grace Hopper) each entry is repeated for the 4 KiB units it
    /// covers, so indexing stays right whatever the page size.
    pub fn pagemap(&self, start: u64, end: u64, out: &mut Vec<u64>) -> Result<()> {
        let sys = crate::collect::system::page_size().max(PAGE);
        let first = start / sys;
        let last = end.div_ceil(sys);
        let mut entries = vec![0u64; (last - first) as usize];
        // SAFETY: u64 has no invalid bit patterns; the byte view covers exactly `entries`.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(entries.as_mut_ptr().cast::<u8>(), entries.len() * 8)
        };
        let mut done = 0;
        while done < bytes.len() {
            let n = self
                .pagemap
                .read_at(&mut bytes[done..], first * 8 + done as u64)
                .map_err(|e| CollectError::io(&self.pagemap_path, e))?;
            if n == 0 {
                break;
            }
            done += n;
        }
        expand_entries(&entries, first * sys, sys, start, end, out);
        Ok(())
    }

    /// The present ranges of `[start, end)` (anonymous ones only with `anon_only`) from
    /// `PAGEMAP_SCAN`; `Ok(None)` when the kernel has none ([`super::pagescan::present`]).
    pub fn present_ranges(
        &self,
        start: u64,
        end: u64,
        anon_only: bool,
    ) -> io::Result<Option<Vec<(u64, u64)>>> {
        super::pagescan::present(&self.pagemap, start, end, anon_only)
    }

    /// Whether a page may be read for `kind`: present, and anonymous inside file mappings.
    pub fn eligible(entry: u64, kind: RegionKind) -> bool {
        entry & PM_PRESENT != 0 && (kind != RegionKind::PrivateFile || entry & PM_FILE == 0)
    }

    /// Copies `buf.len()` bytes from the target at `addr` with `pread` of `/proc/PID/mem`;
    /// returns how many bytes were read before the first one that could not be (a range
    /// unmapped meanwhile reads short). Callers read only pages pagemap says are present.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match self.mem.read_at(&mut buf[done..], addr + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // The kernel answers EIO for an address with no mapping (and the first
                // byte unreadable), EFAULT for a bad range: a short read, not an error.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EIO) | Some(libc::EFAULT)) => break,
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    /// Where [`ProcMemory::gather`] puts each address's bytes: address `k`'s `len` bytes
    /// at `buf[k × pitch..]`. A page (or `len`, when longer), so that addresses one pitch
    /// apart lie in memory as they lie in `buf` and a run of them is read in place.
    pub fn pitch(len: usize) -> usize {
        len.max(PAGE as usize)
    }

    /// Reads `len` bytes at each address into `buf` (address `k`'s at
    /// `k × `[`ProcMemory::pitch`]`(len)`; `buf` holds `addrs.len()` pitches), up to
    /// [`IOV_MAX`] addresses at a time. Addresses one pitch apart (a search at stride 1)
    /// are read as one run, one `pread` straight into their places; others one `pread`
    /// each. Returns how many addresses were read completely: a read stops at the first
    /// address that cannot be read in full.
    pub fn gather(&self, addrs: &[u64], len: usize, buf: &mut [u8]) -> io::Result<usize> {
        let pitch = Self::pitch(len);
        debug_assert!(addrs.len() <= IOV_MAX && buf.len() >= addrs.len() * pitch);
        let mut i = 0;
        while i < addrs.len() {
            let mut j = i + 1;
            while j < addrs.len() && addrs[j] == addrs[j - 1] + pitch as u64 {
                j += 1;
            }
            let want = (j - i - 1) * pitch + len;
            let got = self.read(addrs[i], &mut buf[i * pitch..i * pitch + want])?;
            if got < want {
                // The addresses of the run whose `len` bytes all came.
                let whole = if got < len {
                    0
                } else {
                    (got - len) / pitch + 1
                };
                return Ok(i + whole);
            }
            i = j;
        }
        Ok(addrs.len())
    }
}

#[cfg(test)]
mod page_size_tests {
    use super::*;

    /// A 64 KiB-page system (arm64, Grace Hopper): each kernel pagemap entry covers 16 of
    /// the search's 4 KiB units.
    #[test]
    fn pagemap_entries_of_64k_pages_cover_their_4k_units() {
        let sys = 64 << 10;
        let base = 0x7f00_0000_0000u64;
        // Three system pages: present, absent, present.
        let entries = [PM_PRESENT | 1, 0, PM_PRESENT | 3];
        let mut out = Vec::new();
        expand_entries(
            &entries,
            base,
            sys,
            base + 60 * 1024,
            base + 132 * 1024,
            &mut out,
        );
        // 4 KiB units from 60 KiB to 132 KiB: one in page 0, 16 in page 1, two in page 2.
        assert_eq!(out.len(), 18);
        assert_eq!(out[0], PM_PRESENT | 1);
        assert!(out[1..17].iter().all(|e| *e == 0));
        assert_eq!(out[17], PM_PRESENT | 3);
        // A 4 KiB system is the identity.
        expand_entries(&entries, base, 4096, base, base + 3 * 4096, &mut out);
        assert_eq!(out, entries);
    }

    /// `gather` of runs of pages and of single addresses gives exactly the bytes there
    /// (read through this process's own `/proc/self/mem`).
    #[test]
    fn gather_reads_runs_and_singles_exactly() {
        let pages = 16usize;
        let mut mem = vec![0u8; (pages + 1) * PAGE as usize];
        for (i, b) in mem.iter_mut().enumerate() {
            *b = (i * 7 + i / 4096) as u8;
        }
        let base = (mem.as_ptr() as u64).next_multiple_of(PAGE);
        let off = (base - mem.as_ptr() as u64) as usize;
        let t = ProcMemory::open(Path::new("/proc"), std::process::id() as i32).unwrap();
        // Pages 0..6 back to back (a run), then 8, 11, 12 (a single and a run of two).
        let addrs: Vec<u64> = [0u64, 1, 2, 3, 4, 5, 8, 11, 12]
            .iter()
            .map(|p| base + p * PAGE)
            .collect();
        let len = 2064;
        let pitch = ProcMemory::pitch(len);
        assert_eq!(pitch, PAGE as usize);
        let mut buf = vec![0u8; addrs.len() * pitch];
        assert_eq!(t.gather(&addrs, len, &mut buf).unwrap(), addrs.len());
        for (k, a) in addrs.iter().enumerate() {
            let at = off + (a - base) as usize;
            assert_eq!(
                &buf[k * pitch..k * pitch + len],
                &mem[at..at + len],
                "address {k}"
            );
        }
        // Longer than a page: back-to-back addresses one `len` apart are one run.
        let long = PAGE as usize + 100;
        let addrs: Vec<u64> = [0u64, long as u64, 3 * long as u64]
            .iter()
            .map(|d| base + d)
            .collect();
        assert_eq!(ProcMemory::pitch(long), long);
        let mut buf = vec![0u8; addrs.len() * long];
        assert_eq!(t.gather(&addrs, long, &mut buf).unwrap(), addrs.len());
        for (k, a) in addrs.iter().enumerate() {
            let at = off + (a - base) as usize;
            assert_eq!(
                &buf[k * long..(k + 1) * long],
                &mem[at..at + long],
                "long {k}"
            );
        }
        let mut one = vec![0u8; 100];
        assert_eq!(t.read(base + 10, &mut one).unwrap(), 100);
        assert_eq!(&one[..], &mem[off + 10..off + 110]);
        // An unmapped address reads short, not an error.
        assert_eq!(t.read(8, &mut one).unwrap(), 0);
    }
}

#[cfg(test)]
mod region_tests {
    use super::*;

    /// Mappings as `/proc/PID/maps` prints them: a CUDA process on an NVIDIA host (the
    /// driver's lines as reported in public bug reports of CUDA programs), and this
    /// kernel's anonymous shared memory and huge pages.
    const CUDA_MAPS: &str = "\
200000000-200200000 ---p 00000000 00:00 0 
204200000-204600000 rw-s 00000000 00:06 563                              /dev/nvidiactl
7f8d40914000-7f8d40915000 rw-s efde5000 00:06 530                        /dev/nvidia0
7f8d40916000-7f8d40a16000 rw-s 00000000 00:06 531                        /dev/nvidia-uvm
7f1eb6924000-7f1eb6d24000 rw-s 00000000 00:01 1025                       /dev/zero (deleted)
7f1eb7000000-7f1eb7400000 rw-s 00000000 00:01 1026                       /memfd:weights (deleted)
7f1eb8000000-7f1eb8400000 rw-p 00000000 00:00 0 
";

    const PLAIN_MAPS: &str = "\
7f1eb6400000-7f1eb6800000 rw-p 00000000 00:11 20828                      /anon_hugepage (deleted)
7f1eb6924000-7f1eb6d24000 rw-s 00000000 00:01 1025                       /dev/zero (deleted)
7f1eb6e00000-7f1eb6f00000 rw-s 00000000 00:01 32770                      /SYSV0052e2c1 (deleted)
7f1eb7000000-7f1eb7400000 rw-s 00000000 00:01 1026                       /memfd:weights (deleted)
7f1eb7800000-7f1eb7900000 rw-s 00000000 00:1a 77                         /dev/shm/m.safetensors
";

    fn kinds(text: &str) -> Vec<(String, RegionKind, bool)> {
        ProcMemory::regions(Path::new("maps"), text)
            .unwrap()
            .into_iter()
            .map(|r| (r.label, r.kind, r.key.is_some()))
            .collect()
    }

    #[test]
    fn a_cuda_process_has_pinned_memory_and_its_device_memory_is_never_read() {
        let k = kinds(CUDA_MAPS);
        let pinned = |l: &str| (l.to_string(), RegionKind::Pinned, false);
        assert_eq!(
            k,
            vec![
                pinned("/dev/nvidiactl"),
                pinned("/dev/nvidia-uvm"),
                // Its anonymous shared memory is the driver's pinned memory too.
                pinned("/dev/zero (deleted)"),
                // A memfd is a file: a copy there makes it a copy of the model.
                (
                    "/memfd:weights (deleted)".into(),
                    RegionKind::SharedAnon,
                    true
                ),
                ("[anon]".into(), RegionKind::Anon, false),
            ]
        );
        assert!(!k.iter().any(|(l, _, _)| l == "/dev/nvidia0"), "{k:?}");
    }

    #[test]
    fn anonymous_shared_memory_and_huge_pages_are_no_files() {
        assert_eq!(
            kinds(PLAIN_MAPS),
            vec![
                (
                    "/anon_hugepage (deleted)".into(),
                    RegionKind::Hugetlb,
                    false
                ),
                ("/dev/zero (deleted)".into(), RegionKind::SharedAnon, false),
                (
                    "/SYSV0052e2c1 (deleted)".into(),
                    RegionKind::SharedAnon,
                    false
                ),
                (
                    "/memfd:weights (deleted)".into(),
                    RegionKind::SharedAnon,
                    true
                ),
                (
                    "/dev/shm/m.safetensors".into(),
                    RegionKind::SharedAnon,
                    true
                ),
            ]
        );
    }

    #[test]
    fn huge_pages_count_as_resident_in_smaps() {
        let smaps = "\
7f1eb6400000-7f1eb6800000 rw-p 00000000 00:11 20828                      /anon_hugepage (deleted)
Size:               4096 kB
KernelPageSize:     2048 kB
Rss:                   0 kB
Pss:                   0 kB
Shared_Hugetlb:        0 kB
Private_Hugetlb:    4096 kB
7f1eb8000000-7f1eb8400000 rw-p 00000000 00:00 0 
Rss:                4096 kB
Pss:                2048 kB
KSM:                4096 kB
";
        let s = parse_smaps_sizes(smaps);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].rss_bytes, s[0].pss_bytes), (4 << 20, 4 << 20));
        assert_eq!((s[1].rss_bytes, s[1].pss_bytes), (4 << 20, 2 << 20));
        assert_eq!((s[0].ksm_bytes, s[1].ksm_bytes), (0, 4 << 20));
    }
}

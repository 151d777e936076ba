//! Reading another process's memory, read-only, for byte-level proof of copies.
//!
//! - `/proc/PID/maps`: which ranges to search: anonymous mappings (heap, `mmap`ed buffers,
//!   shared anonymous memory) and private writable file mappings (where copy-on-write
//!   pages live). Guard pages (no read permission) and `[vvar]`/`[vsyscall]` are skipped.
//! - `/proc/PID/pagemap` (<https://docs.kernel.org/admin-guide/mm/pagemap.html>): one u64
//!   per page; bit 63 present, bit 62 swapped, bit 61 file-page or shared-anon. Only
//!   present pages are read, and inside private file mappings only anonymous (CoW) pages,
//!   so twofold never faults pages in or swaps them in.
//! - `process_vm_readv(2)`: copies bytes out of the target without stopping it. Needs
//!   ptrace access (`PTRACE_MODE_ATTACH`: the same user under `ptrace_scope` 0, or root /
//!   `CAP_SYS_PTRACE`). Nothing is ever written to the target.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::error::{CollectError, Result};
use super::maps;
use crate::sample::MappingSample;

pub const PAGE: u64 = 4096;
const PM_PRESENT: u64 = 1 << 63;
const PM_FILE: u64 = 1 << 61;
/// Most iovecs one `process_vm_readv` call takes (IOV_MAX on Linux).
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

/// What kind of memory a searched range is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RegionKind {
    /// Private anonymous memory (heap, `mmap(MAP_ANONYMOUS)`, stacks).
    Anon,
    /// Shared anonymous memory or shmem/memfd/tmpfs mappings.
    SharedAnon,
    /// Anonymous (copy-on-write) pages inside a private writable file mapping.
    PrivateFile,
}

/// A range of the target to search.
#[derive(Debug, Clone)]
pub struct Region {
    pub start: u64,
    pub end: u64,
    pub kind: RegionKind,
    pub label: String,
    /// The file mapped there (private file mappings only).
    pub key: Option<crate::sample::FileKey>,
}

/// Read-only access to one process's memory.
pub struct Target {
    pub pid: i32,
    pagemap: File,
    pagemap_path: PathBuf,
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

impl Target {
    pub fn open(proc_root: &Path, pid: i32) -> Result<Target> {
        let pagemap_path = proc_root.join(pid.to_string()).join("pagemap");
        let pagemap = File::open(&pagemap_path).map_err(|e| {
            CollectError::io(
                &pagemap_path,
                denied_hint(e, "the page map", pid, proc_root),
            )
        })?;
        let t = Target {
            pid,
            pagemap,
            pagemap_path,
        };
        // Probe process_vm_readv once, so a missing permission is reported up front.
        let mut probe = [0u8; 1];
        if let Err(e) = t.read(0, &mut probe) {
            if matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::ESRCH)) {
                let path = proc_root.join(pid.to_string()).join("mem");
                return Err(CollectError::io(
                    &path,
                    denied_hint(e, "the memory", pid, proc_root),
                ));
            }
        }
        Ok(t)
    }

    /// Ranges worth searching, from `maps` text.
    pub fn regions(maps_path: &Path, maps_text: &str) -> Result<Vec<Region>> {
        let mut out: Vec<Region> = Vec::new();
        for (i, line) in maps_text.lines().enumerate() {
            if line.is_empty() {
                continue;
            }
            let m: MappingSample = maps::parse_header(line)
                .ok_or_else(|| CollectError::parse(maps_path, i + 1, line))?;
            if !m.perms.read || m.path == "[vvar]" || m.path == "[vsyscall]" || m.path == "[vdso]" {
                continue;
            }
            let kind = if m.inode == 0 {
                if m.perms.shared {
                    RegionKind::SharedAnon
                } else {
                    RegionKind::Anon
                }
            } else if m.major == 0 && m.perms.shared {
                // shmem, memfd, SysV shm: anonymous memory with an inode.
                RegionKind::SharedAnon
            } else if !m.perms.shared && m.perms.write {
                RegionKind::PrivateFile
            } else {
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
            out.push(Region {
                start: m.start,
                end: m.end,
                kind,
                label: if m.path.is_empty() {
                    "[anon]".to_string()
                } else {
                    m.path.clone()
                },
                key: (kind == RegionKind::PrivateFile).then(|| m.key()),
            });
        }
        Ok(out)
    }

    /// Resident bytes of each mapping, by its start address, from `/proc/PID/smaps` (its
    /// walk skips unpopulated page tables, so a huge empty reservation costs nothing).
    pub fn rss_by_start(&self) -> std::io::Result<std::collections::HashMap<u64, u64>> {
        let path = self.pagemap_path.with_file_name("smaps");
        let text = std::fs::read_to_string(path)?;
        let mut out = std::collections::HashMap::new();
        let mut start = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("Rss:") {
                let kb: u64 = rest
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse()
                    .unwrap_or(u64::MAX / 1024);
                if let Some(s) = start.take() {
                    out.insert(s, kb * 1024);
                }
            } else if let Some((range, _)) = line.split_once(' ') {
                if let Some((a, _)) = range.split_once('-') {
                    if let Ok(a) = u64::from_str_radix(a, 16) {
                        start = Some(a);
                    }
                }
            }
        }
        Ok(out)
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

    /// Whether a page may be read for `kind`: present, and anonymous inside file mappings.
    pub fn eligible(entry: u64, kind: RegionKind) -> bool {
        entry & PM_PRESENT != 0 && (kind != RegionKind::PrivateFile || entry & PM_FILE == 0)
    }

    /// Copies `buf.len()` bytes from the target at `addr`.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<usize> {
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: `local` describes our own writable buffer; `remote` is only read by the
        // kernel from the target's address space, which it validates.
        let n = unsafe { libc::process_vm_readv(self.pid, &local, 1, &remote, 1, 0) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    /// Gathers `len` bytes at each address into `buf` (`addrs.len() * len` bytes), up to
    /// [`IOV_MAX`] at a time. Returns how many addresses were read completely: a read
    /// stops at the first address the kernel cannot copy.
    pub fn gather(&self, addrs: &[u64], len: usize, buf: &mut [u8]) -> io::Result<usize> {
        debug_assert!(addrs.len() <= IOV_MAX && buf.len() >= addrs.len() * len);
        let remote: Vec<libc::iovec> = addrs
            .iter()
            .map(|a| libc::iovec {
                iov_base: *a as *mut libc::c_void,
                iov_len: len,
            })
            .collect();
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: addrs.len() * len,
        };
        // SAFETY: as in `read`; the local buffer holds every remote range back to back.
        let n = unsafe {
            libc::process_vm_readv(self.pid, &local, 1, remote.as_ptr(), remote.len() as _, 0)
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize / len)
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
}

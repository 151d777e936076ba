//! One search per physical frame. Workers forked from a process that loaded a model
//! (a preload pool, a fork server) map its copy at the same addresses on the same
//! physical frames until they write to them. Searching each of them again reads the same
//! memory N times; instead one process of each family is searched first, and in each
//! other member the copies it found are checked by frame number (`/proc/PID/pagemap`):
//! where every page of a copy is the same frame in both, the member holds that very copy
//! (it is credited without reading it again, and its search passes over it). Frames not
//! shared (written since the fork, or a copy of its own) are searched as usual.
//!
//! Frame numbers need `CAP_SYS_ADMIN`; without them (they read as 0) nothing is carried
//! and every process is searched whole.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::grid::{Grid, PAGE};
use super::sweep::Hit;
use crate::collect::memory::{ProcMemory, Region};

/// Which processes are searched first, and which after (with the one of their family
/// searched first).
#[derive(Debug, Default, PartialEq)]
pub struct Families {
    pub first: Vec<i32>,
    /// (pid, the family's first).
    pub later: Vec<(i32, i32)>,
}

/// A process's parent and the layout its address space was made with (its stack's start
/// and its heap's, `/proc/PID/stat` fields 28 and 47), which a child forked without `exec`
/// keeps and an `exec` draws anew (`None`: exited or unreadable; a layout of 0: hidden).
/// A process's parent and its layout (stack start, heap start).
type Lineage = (i32, (u64, u64));

fn parent(proc: &Path, pid: i32) -> Option<Lineage> {
    let stat = std::fs::read_to_string(proc.join(pid.to_string()).join("stat")).ok()?;
    // The name may hold spaces and parentheses: the fields follow the last ')'.
    let f: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    Some((f.get(1)?.parse().ok()?, (num(25)?, num(44)?)))
}

/// Groups `pids` into fork families: a process forked (without `exec`) from a parent
/// among them belongs to its parent's family; such children of one parent outside them
/// (not init) form one family. Processes that merely share a parent (a shell's, a test
/// harness's) are not a family: each `exec` lays its memory out anew. The first of a
/// family is its eldest ancestor among them, else its lowest pid.
pub fn of(proc: &Path, pids: &[i32]) -> Families {
    let set: BTreeSet<i32> = pids.iter().copied().collect();
    let info: BTreeMap<i32, Option<Lineage>> = pids.iter().map(|&p| (p, parent(proc, p))).collect();
    let layout = |p: i32| info.get(&p).copied().flatten().map(|i| i.1);
    // Forked from its parent: the same layout, and a known one.
    let forked_from = |p: i32, pp: i32| {
        let parent_layout = match info.get(&pp) {
            Some(i) => i.map(|i| i.1),
            None => parent(proc, pp).map(|i| i.1),
        };
        layout(p).is_some_and(|l| l != (0, 0) && Some(l) == parent_layout)
    };
    let root = |mut p: i32| {
        // Up through parents among the candidates (bounded: a cycle cannot happen in a
        // snapshot of live processes, but pids are reused).
        for _ in 0..64 {
            match info.get(&p).copied().flatten() {
                Some((pp, _)) if set.contains(&pp) && pp != p && forked_from(p, pp) => p = pp,
                _ => break,
            }
        }
        p
    };
    // Family key: the root among the candidates, or for roots forked from a parent
    // outside them, that parent (workers of a master that holds nothing).
    let mut families: BTreeMap<(bool, i32), Vec<i32>> = BTreeMap::new();
    for &p in pids {
        let r = root(p);
        let key = match info.get(&r).copied().flatten() {
            Some((pp, _)) if pp > 1 && !set.contains(&pp) && forked_from(r, pp) => (true, pp),
            _ => (false, r),
        };
        families.entry(key).or_default().push(p);
    }
    let mut out = Families::default();
    for ((by_parent, key), mut members) in families {
        members.sort_unstable();
        let first = match by_parent {
            true => members
                .iter()
                .copied()
                .find(|&m| root(m) == m)
                .unwrap_or(members[0]),
            false => key,
        };
        out.first.push(first);
        out.later.extend(
            members
                .into_iter()
                .filter(|&m| m != first)
                .map(|m| (m, first)),
        );
    }
    out
}

/// A copy found in the family's first process that `pid` maps on the same frames.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Carried {
    pub piece: usize,
    pub addr: u64,
    pub lo: u64,
    pub hi: u64,
    pub mem_bytes: u64,
    pub whole: bool,
}

const PFN_MASK: u64 = (1 << 55) - 1;
const PRESENT: u64 = 1 << 63;

/// The copies `first` was found to hold (`hits` in its `regions`) that `pid` holds on the
/// same physical frames, every present page of each; empty without frame numbers.
pub fn carried(
    proc: &Path,
    grid: &Grid,
    first: i32,
    hits: &[Hit],
    regions: &[Region],
    pid: i32,
) -> Vec<Carried> {
    let (Ok(a), Ok(b)) = (ProcMemory::open(proc, first), ProcMemory::open(proc, pid)) else {
        return Vec::new();
    };
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    let mut out = Vec::new();
    for h in hits {
        let Some(r) = regions.get(h.region) else {
            continue;
        };
        let len = grid.pieces[h.piece].mem_len;
        let lo = h.addr.max(r.start) / PAGE * PAGE;
        let hi = (h.addr + len).min(r.end).next_multiple_of(PAGE);
        if hi <= lo || a.pagemap(lo, hi, &mut ea).is_err() || b.pagemap(lo, hi, &mut eb).is_err() {
            continue;
        }
        let same = ea.len() == eb.len()
            && ea.iter().zip(&eb).all(|(x, y)| {
                // Absent in both is the same; present in both on one frame (not 0: frame
                // numbers hidden) is the same page.
                (x & PRESENT == 0 && y & PRESENT == 0)
                    || (x & PRESENT != 0
                        && x & PFN_MASK != 0
                        && x & PFN_MASK == y & PFN_MASK
                        && y & PRESENT != 0)
            })
            && ea.iter().any(|x| x & PRESENT != 0);
        if same {
            out.push(Carried {
                piece: h.piece,
                addr: h.addr,
                lo: h.addr.max(r.start),
                hi: (h.addr + len).min(r.end),
                mem_bytes: h.mem_bytes,
                whole: h.whole,
            });
        }
        ea.clear();
        eb.clear();
    }
    out
}

/// The carried copies as hits of `pid`'s own search (in its `regions`); those whose
/// memory is no longer in one of its regions are dropped.
pub fn as_hits(carried: &[Carried], regions: &[Region]) -> Vec<Hit> {
    carried
        .iter()
        .filter_map(|c| {
            let region = regions
                .iter()
                .position(|r| r.start <= c.lo && c.hi <= r.end)?;
            Some(Hit {
                piece: c.piece,
                addr: c.addr,
                region,
                mem_bytes: c.mem_bytes,
                whole: c.whole,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forked_children_are_a_family_and_execed_ones_are_not() {
        // Children that exec `sleep`: their own layout, no family of this process's.
        let me = std::process::id() as i32;
        let mut kids: Vec<std::process::Child> = (0..2)
            .map(|_| {
                std::process::Command::new("sleep")
                    .arg("30")
                    .spawn()
                    .unwrap()
            })
            .collect();
        let pids: Vec<i32> = kids.iter().map(|k| k.id() as i32).collect();
        let f = of(Path::new("/proc"), &[pids[0], me, pids[1]]);
        assert_eq!(f.first.len(), 3, "{f:?}");
        assert!(f.later.is_empty(), "{f:?}");
        for k in &mut kids {
            let _ = k.kill();
            let _ = k.wait();
        }
        // Children forked without exec (they keep this layout): one family, led by this
        // process.
        let mut forked = Vec::new();
        for _ in 0..2 {
            // SAFETY: the child only sleeps (async-signal-safe) and exits.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0);
            if pid == 0 {
                unsafe {
                    libc::sleep(30);
                    libc::_exit(0);
                }
            }
            forked.push(pid);
        }
        let f = of(Path::new("/proc"), &[forked[0], me, forked[1]]);
        for &p in &forked {
            unsafe {
                libc::kill(p, libc::SIGKILL);
                libc::waitpid(p, std::ptr::null_mut(), 0);
            }
        }
        if nix::unistd::geteuid().is_root() {
            assert_eq!(f.first, vec![me], "{f:?}");
            assert_eq!(f.later.len(), 2, "{f:?}");
        }
    }
}

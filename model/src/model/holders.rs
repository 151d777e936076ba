//! Who holds a file: the process rows of a report, the mappers and openers of each file.

use super::*;

pub(super) fn process_model(
    p: &ProcessSample,
    holds_files: usize,
    gpu: Option<Vec<device::GpuUse>>,
) -> ProcessModel {
    // What it was seen holding is certain; nothing seen of an unreadable one is unknown.
    let holds_files = match p.unreadable {
        Some(_) if holds_files == 0 => None,
        _ => Some(holds_files),
    };
    let r = p.rollup.as_ref();
    ProcessModel {
        pid: p.pid,
        comm: p.comm.clone(),
        cmdline: p.cmdline.join(" "),
        rss_bytes: p.status.vm_rss_bytes,
        anon_bytes: p.status.rss_anon_bytes,
        file_bytes: p.status.rss_file_bytes,
        shmem_bytes: p.status.rss_shmem_bytes,
        swap_bytes: p.status.vm_swap_bytes,
        pss_bytes: r.map(|r| r.pss_bytes),
        pss_anon_bytes: r.and_then(|r| r.pss_anon_bytes),
        pss_file_bytes: r.and_then(|r| r.pss_file_bytes),
        pss_shmem_bytes: r.and_then(|r| r.pss_shmem_bytes),
        uss_bytes: r.map(|r| r.private_clean_bytes + r.private_dirty_bytes),
        shared_clean_bytes: r.map(|r| r.shared_clean_bytes),
        shared_dirty_bytes: r.map(|r| r.shared_dirty_bytes),
        private_clean_bytes: r.map(|r| r.private_clean_bytes),
        private_dirty_bytes: r.map(|r| r.private_dirty_bytes),
        cgroup: p.cgroup.as_ref().map(|c| c.path.clone()),
        holds_files,
        gpu_memory_bytes: gpu.as_ref().and_then(|g| {
            g.iter()
                .map(|u| u.bytes)
                .try_fold(0u64, |a, b| Some(a + b?))
        }),
        gpu_memory: gpu.unwrap_or_default(),
        unreadable: p.unreadable,
    }
}

pub(super) fn mapper(
    p: &ProcessSample,
    key: FileKey,
    size: Option<u64>,
    page: u64,
) -> Option<Mapper> {
    let vmas: Vec<_> = p.mappings.iter().filter(|m| m.key() == key).collect();
    if vmas.is_empty() {
        return None;
    }
    let shared = vmas.iter().filter(|m| m.perms.shared).count();
    let kind = match shared {
        0 => MapKind::Private,
        n if n == vmas.len() => MapKind::Shared,
        _ => MapKind::Mixed,
    };
    let mut prot = crate::sample::Perms::default();
    for m in &vmas {
        prot.read |= m.perms.read;
        prot.write |= m.perms.write;
        prot.exec |= m.perms.exec;
        prot.shared |= m.perms.shared;
    }
    let eof = size.map(|s| s.div_ceil(page) * page);
    Some(Mapper {
        pid: p.pid,
        comm: p.comm.clone(),
        kind,
        prot: prot.as_str(),
        writable: prot.write,
        vmas: vmas.len(),
        mapped_bytes: vmas.iter().map(|m| m.size_bytes()).sum(),
        resident_bytes: sum_opt(vmas.iter().map(|m| m.rss_bytes)),
        pss_bytes: sum_opt(vmas.iter().map(|m| m.pss_bytes)),
        cow_anon_bytes: sum_opt(vmas.iter().map(|m| m.anonymous_bytes)),
        thp_bytes: sum_opt(vmas.iter().map(|m| m.file_pmd_mapped_bytes)),
        beyond_eof_bytes: eof.map_or(0, |eof| {
            vmas.iter()
                .map(|m| (m.offset_bytes + m.size_bytes()).saturating_sub(eof.max(m.offset_bytes)))
                .sum()
        }),
    })
}

pub(super) fn holders<'a>(
    processes: impl Iterator<Item = &'a ProcessSample>,
    key: FileKey,
) -> Vec<Holder> {
    processes
        .filter_map(|p| {
            let fds: Vec<i32> = p
                .open_files
                .iter()
                .filter(|o| o.key == key)
                .map(|o| o.fd)
                .collect();
            (!fds.is_empty()).then(|| Holder {
                pid: p.pid,
                comm: p.comm.clone(),
                fds,
                mapped: p.mappings.iter().any(|m| m.key() == key),
            })
        })
        .collect()
}

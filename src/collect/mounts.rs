//! Where the cgroup hierarchies are mounted, from `/proc/self/mountinfo` (parsed by the
//! procfs crate), rather than assumed: the live cgroupfs root is the directory that holds
//! the v1 `memory` mount or the v2 (`cgroup2`) mount (`/sys/fs/cgroup` on every
//! distribution seen, but a container or an unusual host may differ).

use std::path::{Path, PathBuf};

use procfs::process::MountInfos;
use procfs::FromBufRead;

/// The cgroupfs root that [`super::cgroup::CgroupReader`] expects (`<root>/memory` for v1,
/// `<root>` or `<root>/unified` for v2), from mountinfo text.
pub fn cgroup_root(mountinfo: &str) -> Option<PathBuf> {
    let mounts = MountInfos::from_buf_read(mountinfo.as_bytes()).ok()?;
    let v1 = mounts
        .0
        .iter()
        .find(|m| m.fs_type == "cgroup" && m.super_options.contains_key("memory"));
    if let Some(m) = v1 {
        return m.mount_point.parent().map(Path::to_path_buf);
    }
    let v2 = mounts.0.iter().find(|m| m.fs_type == "cgroup2")?;
    let p = &v2.mount_point;
    if p.file_name().is_some_and(|n| n == "unified") {
        p.parent().map(Path::to_path_buf)
    } else {
        Some(p.clone())
    }
}

/// The live root: from `/proc/self/mountinfo`, else `/sys/fs/cgroup`.
pub fn live_cgroup_root(proc_root: &Path) -> PathBuf {
    std::fs::read_to_string(proc_root.join("self/mountinfo"))
        .ok()
        .and_then(|t| cgroup_root(&t))
        .unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup"))
}

/// Where `path`, as a process in another mount namespace names it, may be on the host:
/// the process's mount that holds it (longest mount point that is a prefix of it, from its
/// `mountinfo` text `theirs`) gives the file system (`st_dev`) and the path inside it;
/// every host mount (`ours`) of that file system whose root is a prefix of that path
/// gives a candidate, the latest mount first. The caller keeps the one whose `stat` is
/// the file's identity (a bind mount, an overlay or a btrfs subvolume may not show it).
pub fn host_candidates(theirs: &str, ours: &str, path: &Path) -> Vec<PathBuf> {
    let parse = |t: &str| MountInfos::from_buf_read(t.as_bytes()).ok().map(|m| m.0);
    let (Some(theirs), Some(ours)) = (parse(theirs), parse(ours)) else {
        return Vec::new();
    };
    let Some(m) = theirs
        .iter()
        .rev()
        .filter(|m| path.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.components().count())
    else {
        return Vec::new();
    };
    let Ok(rel) = path.strip_prefix(&m.mount_point) else {
        return Vec::new();
    };
    let inside = Path::new(&m.root).join(rel);
    ours.iter()
        .rev()
        .filter(|o| o.majmin == m.majmin)
        .filter_map(|o| {
            let rest = inside.strip_prefix(&o.root).ok()?;
            Some(o.mount_point.join(rest))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bind_mount_seen_from_another_namespace_maps_back_to_the_host() {
        // Host: / on 254:0; the container's /mnt/x is a bind of the host's /tmp/d.
        let ours = "22 1 254:0 / / rw - ext4 /dev/vda rw\n";
        let theirs = "\
40 39 254:0 / / rw - ext4 /dev/vda rw
41 40 254:0 /tmp/d /mnt/x rw - ext4 /dev/vda rw
42 40 0:5 / /dev rw - tmpfs tmpfs rw
";
        assert_eq!(
            host_candidates(theirs, ours, Path::new("/mnt/x/m.gguf")),
            [PathBuf::from("/tmp/d/m.gguf")]
        );
        assert_eq!(
            host_candidates(theirs, ours, Path::new("/etc/hosts")),
            [PathBuf::from("/etc/hosts")]
        );
        // A file system the host has not mounted: nowhere on the host.
        assert!(host_candidates(theirs, ours, Path::new("/dev/shm/m")).is_empty());
        assert!(host_candidates("garbage", ours, Path::new("/m")).is_empty());
    }

    #[test]
    fn v1_hybrid_and_pure_v2_layouts() {
        let hybrid = "\
30 23 0:26 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
35 30 0:31 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
";
        assert_eq!(cgroup_root(hybrid), Some(PathBuf::from("/sys/fs/cgroup")));
        let v2 = "29 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(cgroup_root(v2), Some(PathBuf::from("/sys/fs/cgroup")));
        let odd = "40 23 0:40 / /run/cg/unified rw - cgroup2 none rw\n";
        assert_eq!(cgroup_root(odd), Some(PathBuf::from("/run/cg")));
        assert_eq!(cgroup_root("1 0 8:1 / / rw - ext4 /dev/vda rw\n"), None);
    }
}

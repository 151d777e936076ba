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

/// One mount as a process sees it: its device (`st_dev` of its files, `makedev(major,
/// minor)` of `mountinfo`'s field 3), where it is mounted, and its filesystem type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mounted {
    pub dev: u64,
    pub mount_point: PathBuf,
    pub fs_type: String,
}

impl Mounted {
    /// FUSE, or a filesystem built on it (`fuse.sshfs`, `fuseblk`, virtiofs): opening a
    /// file there drops its page cache unless the daemon says otherwise.
    pub fn is_fuse(&self) -> bool {
        let t = self.fs_type.as_str();
        t == "fuse" || t == "fuseblk" || t == "virtiofs" || t.starts_with("fuse.")
    }
}

/// The mounts of a `mountinfo` text, in its order (a later mount over the same point
/// hides an earlier one).
pub fn parse_mounted(mountinfo: &str) -> Vec<Mounted> {
    let Ok(m) = MountInfos::from_buf_read(mountinfo.as_bytes()) else {
        return Vec::new();
    };
    m.0.into_iter()
        .filter_map(|m| {
            let (major, minor) = m.majmin.split_once(':')?;
            Some(Mounted {
                dev: libc::makedev(major.parse().ok()?, minor.parse().ok()?),
                mount_point: m.mount_point,
                fs_type: m.fs_type,
            })
        })
        .collect()
}

/// The mount that holds `path` (absolute, as named in the namespace of `mounts`): the
/// longest mount point that is a prefix of it, the latest mount of equals. Symbolic links
/// on the way are not followed (nothing is asked of any filesystem).
pub fn mount_of<'a>(mounts: &'a [Mounted], path: &Path) -> Option<&'a Mounted> {
    mounts
        .iter()
        .enumerate()
        .filter(|(_, m)| path.starts_with(&m.mount_point))
        .max_by_key(|(i, m)| (m.mount_point.components().count(), *i))
        .map(|(_, m)| m)
}

/// How long a namespace's mount table is trusted (a mount made or undone shows within it).
const TABLE_AGE: std::time::Duration = std::time::Duration::from_secs(2);
/// Namespaces whose tables are kept at most.
const TABLES: usize = 64;

type Table = std::sync::Arc<Vec<Mounted>>;

/// The tables read, by mount namespace (`PROC/PID/ns/mnt`'s link, a procfs answer).
static TABLES_KEPT: std::sync::Mutex<Vec<(String, std::time::Instant, Table)>> =
    std::sync::Mutex::new(Vec::new());

/// The mounts process `pid` sees (`None`: this process), read from procfs only: its
/// `mountinfo`, kept per mount namespace for two seconds (most processes share one).
/// `None` where procfs does not tell (a fixture root, a process gone).
pub fn table(proc_root: &Path, pid: Option<i32>) -> Option<Table> {
    let dir = proc_root.join(pid.map_or_else(|| "self".to_string(), |p| p.to_string()));
    // This process's own namespace is its own key: twofold never changes namespace, and
    // its link need not be read at each of a snapshot's hundreds of calls (one per model
    // file whose filesystem is asked about).
    let ns = match pid {
        None => Some(format!("{}:self", proc_root.display())),
        Some(_) => std::fs::read_link(dir.join("ns/mnt"))
            .ok()
            .map(|l| format!("{}:{}", proc_root.display(), l.display())),
    };
    let now = std::time::Instant::now();
    if let Some(ns) = &ns {
        let kept = TABLES_KEPT.lock().unwrap_or_else(|e| e.into_inner());
        let hit = kept
            .iter()
            .find(|(n, at, _)| n == ns && now.duration_since(*at) < TABLE_AGE);
        if let Some((_, _, t)) = hit {
            return Some(t.clone());
        }
    }
    let text = std::fs::read_to_string(dir.join("mountinfo")).ok()?;
    let t: Table = std::sync::Arc::new(parse_mounted(&text));
    if let Some(ns) = ns {
        let mut kept = TABLES_KEPT.lock().unwrap_or_else(|e| e.into_inner());
        kept.retain(|(n, at, _)| *n != ns && now.duration_since(*at) < TABLE_AGE);
        if kept.len() >= TABLES {
            kept.remove(0);
        }
        kept.push((ns, now, t.clone()));
    }
    Some(t)
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
    fn the_mount_of_a_path_is_the_longest_prefix_the_latest_of_equals() {
        let text = "\
22 1 254:0 / / rw - ext4 /dev/vda rw
40 22 0:52 / /mnt/m rw - fuse.sshfs host:/x rw
41 22 0:53 / /mnt/m rw - nfs4 srv:/y rw
42 22 0:54 / /mnt/mo rw - tmpfs tmpfs rw
";
        let t = parse_mounted(text);
        let of = |p: &str| mount_of(&t, Path::new(p)).unwrap();
        assert_eq!(of("/etc/hosts").dev, libc::makedev(254, 0));
        assert_eq!(of("/mnt/m/a.gguf").dev, libc::makedev(0, 53));
        assert_eq!(of("/mnt/mo/a").fs_type, "tmpfs");
        assert!(!of("/mnt/m/a").is_fuse());
        assert!(t[1].is_fuse());
        assert!(mount_of(&[], Path::new("/a")).is_none());
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

//! Who is reading: the effective user and `CAP_SYS_PTRACE` of this process, from
//! `PROC/self/status` (`Uid:` effective, `CapEff:` bit 19), and the words for a refusal
//! that fit them.
//!
//! Another process's `maps`, `fd`, `io`, `pagemap` and `mem` need ptrace read access
//! (`PTRACE_MODE_READ`): the same user, or `CAP_SYS_PTRACE`. A reader that has
//! `CAP_SYS_PTRACE` and is still refused is refused by a security policy (an LSM, or a
//! sandbox's init that made itself undumpable in another user namespace): telling root
//! to run as root would be wrong. See
//! <https://man7.org/linux/man-pages/man2/ptrace.2.html> ("Ptrace access mode checking").

use std::path::Path;

pub use crate::sample::Privilege;

/// `CAP_SYS_PTRACE`, as a bit of `CapEff`.
const CAP_SYS_PTRACE: u32 = 19;

/// The privilege of this process, from `PROC/self/status`; `None` where the procfs root
/// has no `self` (a fixture tree) or it cannot be parsed.
pub fn privilege(proc_root: &Path) -> Option<Privilege> {
    let text = std::fs::read_to_string(proc_root.join("self").join("status")).ok()?;
    parse_status(&text)
}

fn parse_status(text: &str) -> Option<Privilege> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    let euid = field("Uid:")?.split_whitespace().nth(1)?.parse().ok()?;
    let cap = u64::from_str_radix(field("CapEff:")?, 16).ok()?;
    Some(Privilege {
        euid,
        cap_sys_ptrace: cap & (1 << CAP_SYS_PTRACE) != 0,
    })
}

pub use crate::sample::unsearched::{EXITED, NO_PTRACE, POLICY};

/// The reason `what` of `pid` was refused, for who is reading.
pub fn denied(what: &str, pid: i32, privilege: Option<Privilege>) -> String {
    match privilege {
        Some(p) if p.reads_any() => format!("reading {what} of pid {pid} was {POLICY}"),
        Some(p) if p.euid == 0 => format!(
            "reading {what} of pid {pid} {NO_PTRACE}: this root lacks CAP_SYS_PTRACE"
        ),
        _ =>
format!("reading {what} of pid {pid} {NO_PTRACE} (root or CAP_SYS_PTRACE, or the same user with kernel.yama.ptrace_scope=0)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_with_ptrace_is_refused_only_by_a_policy() {
        let root = "Name:\tx\nUid:\t0\t0\t0\t0\nCapEff:\t000001fffeffffff\n";
        let p = parse_status(root).unwrap();
        assert_eq!(p.euid, 0);
        assert!(p.reads_any());
        assert!(denied("the page map", 1, Some(p)).contains(POLICY));
        let user = "Uid:\t1000\t1000\t1000\t1000\nCapEff:\t0000000000000000\n";
        let p = parse_status(user).unwrap();
        assert_eq!(p.euid, 1000);
        assert!(!p.reads_any());
        let d = denied("the page map", 1, Some(p));
        assert!(d.contains(NO_PTRACE) && d.contains("root"), "{d}");
        // Root without the capability (dropped in a container) is told about it too.
        let capless = "Uid:\t1000\t0\t0\t0\nCapEff:\t0000000000000000\n";
        let p = parse_status(capless).unwrap();
        assert_eq!(p.euid, 0);
        assert!(denied("maps", 9, Some(p)).ends_with("this root lacks CAP_SYS_PTRACE"));
        assert!(parse_status("Uid:\t0\n").is_none());
        assert!(denied("maps", 9, None).contains(NO_PTRACE));
        assert!(privilege(Path::new("/proc")).is_some());
    }
}

//! Whether another twofold could have mapped a file's pages while this one read
//! `smaps` ([`Quiet`]).

/// Another twofold copying a file's cached pages maps them for a moment
/// (`dupes::cachedcopy`), and so moves the PSS and the shared/private split that `smaps`
/// gives every other mapper of the file, for as long as it maps them: a read made then is
/// true at that moment, wrong to keep. Whether any other twofold could have mapped a page
/// while this one read `smaps` is told by their fault counters (each page mapped is a
/// fault: `minflt` or `majflt` of `/proc/PID/stat`, which only grow), read before and
/// after, and by their mappings of the files read. Any build of twofold, marked or not,
/// is told apart this way: no cooperation is needed.
#[derive(Debug, Default)]
pub struct Quiet {
    faults: Vec<(i32, Option<(u64, u64)>)>,
    mapping: bool,
}

impl Quiet {
    /// The other observers' fault counters now; `mapping` is whether any of them maps a
    /// file read now (as its last `maps` showed).
    pub fn before(proc_root: &std::path::Path, others: &[i32], mapping: bool) -> Quiet {
        let faults = others.iter().map(|&p| (p, faults(proc_root, p))).collect();
        Quiet { faults, mapping }
    }

    /// Whether no other observer mapped a file's page since [`Quiet::before`]: none
    /// mapped a file read, and every one's fault counters stand (one gone, or unreadable,
    /// is not quiet).
    pub fn held(&self, proc_root: &std::path::Path) -> bool {
        !self.mapping
            && self
                .faults
                .iter()
                .all(|(p, f)| f.is_some() && faults(proc_root, *p) == *f)
    }
}

/// `minflt` and `majflt` of `pid`.
fn faults(proc_root: &std::path::Path, pid: i32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    super::statfiles::parse_stat(&text).map(|s| (s.minflt, s.majflt))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_observer_that_faults_is_not_quiet() {
        let root = std::path::Path::new("/proc");
        // A child that sleeps, then maps and touches 64 pages (64 faults at least).
        let mut child = std::process::Command::new("python3")
            .args([
                "-c",
                "import mmap,sys; sys.stdin.readline(); m=mmap.mmap(-1, 64*4096)\n\
                 for i in range(0, len(m), 4096): m[i]=1\nprint('done', flush=True); sys.stdin.readline()",
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        // Wait until it sleeps in readline (its counters stand).
        let mut last = faults(root, pid);
        loop {
            std::thread::sleep(std::time::Duration::from_millis(50));
            let now = faults(root, pid);
            if now == last {
                break;
            }
            last = now;
        }
        let q = Quiet::before(root, &[pid], false);
        assert!(q.held(root), "nothing ran");
        assert!(
            !Quiet::before(root, &[pid], true).held(root),
            "it maps a file read"
        );
        use std::io::{BufRead, Write};
        writeln!(child.stdin.as_mut().unwrap()).unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "done");
        let after = faults(root, pid).unwrap();
        assert!(after.0 + after.1 >= last.unwrap().0 + last.unwrap().1 + 64);
        assert!(!q.held(root), "it faulted 64 pages in");
        drop(child.stdin.take());
        child.wait().unwrap();
        assert!(!q.held(root), "it is gone");
    }
}

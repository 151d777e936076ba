//! Nothing is left behind after a `kill -9` of a campaign: its children die with it
//! (`PR_SET_PDEATHSIG`), and the next campaign finds its cgroup and temp dir by the owner
//! pid in their names, kills what still runs inside, removes them and says so on stderr.
//! Needs root (campaigns create memory cgroups). Tests run one at a time: each one's next
//! campaign would sweep the others' leftovers.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::common::*;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const ROUNDS: usize = 5;

/// Cgroups (under the v1 memory and v2 hierarchies, two levels deep) and temp dirs made by
/// twofold process `pid` (named `twofold-PID-...`).
fn artifacts_of(pid: u32) -> Vec<PathBuf> {
    let prefix = format!("twofold-{pid}-");
    let mut out = Vec::new();
    let mut dirs: Vec<(PathBuf, usize)> = ["/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified"]
        .iter()
        .map(|r| (PathBuf::from(r), 0))
        .collect();
    dirs.push((std::env::temp_dir(), 2));
    while let Some((dir, depth)) = dirs.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                out.push(e.path());
            } else if depth < 2 {
                dirs.push((e.path(), depth + 1));
            }
        }
    }
    out
}

/// Live (not zombie) processes whose command line mentions `marker`.
fn processes_with(marker: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|pid| *pid != std::process::id() as i32)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                String::from_utf8_lossy(&c)
                    .replace('\0', " ")
                    .contains(marker)
            })
        })
        .collect()
}

fn wait_for(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < within, "{what} after {within:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn start(args: &[&str], err: &Path) -> Child {
    Command::new(exe())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(err).unwrap())
        .spawn()
        .unwrap()
}

/// Starts `args` ROUNDS times, each time SIGKILLing it once `ready(pid)` holds, and checks
/// that each next start (and a last cheap campaign) reports and removes what the killed
/// one left, and that nothing of them remains: no cgroup, temp dir or marked process.
fn kill_nine_rounds(
    args: &[&str],
    markers: &dyn Fn(u32) -> Vec<String>,
    ready: &dyn Fn(u32) -> bool,
) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let logs = tempfile::tempdir().unwrap();
    let mut killed: Vec<(u32, Vec<PathBuf>)> = Vec::new();
    for round in 0..=ROUNDS {
        let err = logs.path().join(format!("stderr-{round}"));
        let mut child = if round < ROUNDS {
            start(args, &err)
        } else {
            // A cheap campaign of another kind finds the last one's leftovers too.
            start(&["run", "--memory-max", "64M", "--", "true"], &err)
        };
        let pid = child.id();
        if round < ROUNDS {
            wait_for(
                "the campaign never got going",
                Duration::from_secs(60),
                || ready(pid) || child.try_wait().unwrap().is_some(),
            );
            assert!(
                child.try_wait().unwrap().is_none(),
                "it finished before the kill"
            );
            child.kill().unwrap();
        }
        let status = child.wait().unwrap();
        let stderr = std::fs::read_to_string(&err).unwrap();
        if round == ROUNDS {
            assert!(status.success(), "{status:?}: {stderr}");
        }
        // The one killed before had its leftovers removed, and this one said so.
        if let Some((before, left)) = killed.last() {
            for p in left {
                assert!(
                    stderr.contains(&format!("'{}'", p.display())),
                    "round {round}: '{}' of pid {before} not reported:\n{stderr}",
                    p.display()
                );
            }
            let mentions = stderr.lines().filter(|l| l.contains("leftover")).count();
            if !left.is_empty() {
                assert_eq!(mentions, 1, "one line: {stderr}");
            }
        }
        if round < ROUNDS {
            let left = artifacts_of(pid);
            killed.push((pid, left));
        }
    }
    assert!(
        killed.iter().any(|(_, l)| !l.is_empty()),
        "no kill left anything behind: the test tested nothing"
    );
    for (pid, _) in &killed {
        assert!(artifacts_of(*pid).is_empty(), "{:?}", artifacts_of(*pid));
        for m in markers(*pid) {
            wait_for(
                &format!("processes still running: {m}"),
                Duration::from_secs(5),
                || processes_with(&m).is_empty(),
            );
        }
    }
}

fn root() -> bool {
    require(is_root(), "root (campaigns create memory cgroups)")
}

fn has_cgroup(pid: u32) -> bool {
    artifacts_of(pid)
        .iter()
        .any(|p| p.starts_with("/sys/fs/cgroup") && !leftover_pids(p).is_empty())
}

fn leftover_pids(cgroup: &Path) -> Vec<i32> {
    std::fs::read_to_string(cgroup.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

#[test]
fn run_killed_with_sigkill_leaves_nothing_behind() {
    let _group = crate::common::group(module_path!());
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The command and a background process it forks (which PR_SET_PDEATHSIG does not
    // reach): both named by a marker, both left in the cgroup after the kill.
    let marker = format!("tf-leftover-{}", std::process::id());
    let sleeper = dir.path().join(&marker);
    std::os::unix::fs::symlink("/bin/sleep", &sleeper).unwrap();
    let s = sleeper.to_str().unwrap().to_string();
    let script = format!("{s} 1000 & exec {s} 1001");
    kill_nine_rounds(
        &["run", "--memory-max", "128M", "--", "sh", "-c", &script],
        &|_| vec![marker.clone()],
        // Both sleeps inside the cgroup.
        &|pid| {
            artifacts_of(pid)
                .iter()
                .any(|p| p.starts_with("/sys/fs/cgroup") && leftover_pids(p).len() >= 2)
        },
    );
}

#[test]
fn pressure_killed_with_sigkill_leaves_nothing_behind() {
    let _group = crate::common::group(module_path!());
    if !root() {
        return;
    }
    let marker = format!("tf-leftover-p{}", std::process::id());
    let dir = tempfile::Builder::new().prefix(&marker).tempdir().unwrap();
    let file = model_file(dir.path(), "m.bin", 8 * MIB);
    let f = file.to_str().unwrap().to_string();
    kill_nine_rounds(
        &[
            "pressure",
            &f,
            "--experiment",
            "readers",
            "--readers",
            "3,3,3,3,3,3,3,3,3,3",
            "--memory-max",
            "256M",
        ],
        &|_| vec![marker.clone()],
        &has_cgroup,
    );
}

#[test]
fn demo_killed_with_sigkill_leaves_nothing_behind() {
    let _group = crate::common::group(module_path!());
    if !root() {
        return;
    }
    kill_nine_rounds(
        // 256 MiB: a demo of 16 MiB can finish (0.2 s) between two looks of the test.
        &["demo", "--size", "256M"],
        // The readers' command lines name the model in the temp dir.
        &|pid| vec![format!("twofold-{pid}-")],
        &|pid| {
            let marker = format!("twofold-{pid}-");
            !artifacts_of(pid).is_empty() && !processes_with(&marker).is_empty()
        },
    );
}

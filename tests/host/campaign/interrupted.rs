//! Campaigns stopped part-way (SIGINT, a killed child, a failing competitor, too many
//! readers): the exit code says why and nothing is left behind (cgroups, processes).

use super::*;

#[test]
fn cleanup_after_sigint_and_after_a_killed_child() {
    let _group = crate::common::group(super::GROUP);
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.bin", 32 * MIB);
    let f = file.to_str().unwrap().to_string();
    // SIGINT while the readers experiment runs.
    let mut child = Command::new(exe())
        .args([
            "pressure",
            &f,
            "--experiment",
            "readers",
            "--readers",
            "3,3,3,3",
            "--memory-max",
            "512M",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while processes_with(&format!("__child copy {f}")).len() < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "readers never started"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{status:?}");
    wait_gone(&f);
    assert!(leftover_cgroups().is_empty(), "{:?}", leftover_cgroups());
    // The command's own child is SIGKILLed mid-run; what it started goes too.
    let marker = format!("sleep 3{}", std::process::id() % 10);
    let mut run = Command::new(exe())
        .args([
            "run",
            "--memory-max",
            "256M",
            "--",
            "sh",
            "-c",
            &format!("{marker} & exec {marker}"),
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let parent_of = |pid: i32| -> Option<i32> {
        let st = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        st.lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|v| v.trim().parse().ok())
    };
    let victim = loop {
        // Both sleeps running: kill the command itself (the exec'd sleep, whose parent
        // is twofold), leaving its background sleep to twofold's cleanup.
        let p: Vec<i32> = processes_with(&marker)
            .into_iter()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with(b"sleep"))
            })
            .collect();
        if p.len() >= 2 {
            if let Some(v) = p
                .iter()
                .find(|pid| parent_of(**pid) == Some(run.id() as i32))
            {
                break *v;
            }
        }
        assert!(start.elapsed() < Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(5));
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // The command died of SIGKILL; twofold reports it and kills the background sleep with
    // the cgroup.
    assert!(run.wait().unwrap().success());
    wait_gone(&marker);
    assert!(leftover_cgroups().is_empty(), "{:?}", leftover_cgroups());
    assert!(Path::new(&f).exists(), "the model file must stay");
}

/// Pids in the cgroups twofold process `owner` made (`twofold-OWNER-...`).
fn cgroup_procs_of(owner: u32) -> Option<Vec<i32>> {
    let rd = std::fs::read_dir("/sys/fs/cgroup/memory").ok()?;
    let prefix = format!("twofold-{owner}-");
    let mut found = None;
    for e in rd.flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let procs = std::fs::read_to_string(e.path().join("cgroup.procs")).unwrap_or_default();
            let v: Vec<i32> = procs
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect();
            found.get_or_insert_with(Vec::new).extend(v);
        }
    }
    found
}

fn cgroups_of(owner: u32) -> Vec<String> {
    let prefix = format!("twofold-{owner}-");
    std::fs::read_dir("/sys/fs/cgroup/memory")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

#[test]
fn run_interrupted_exits_128_plus_the_signal_and_says_so() {
    let _group = crate::common::group(super::GROUP);
    if !root() {
        return;
    }
    let marker = format!("tf-interrupt-{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let sleeper = dir.path().join(&marker);
    std::os::unix::fs::symlink("/bin/sleep", &sleeper).unwrap();
    for (i, (sig, code)) in [
        (nix::sys::signal::Signal::SIGINT, 130),
        (nix::sys::signal::Signal::SIGTERM, 143),
    ]
    .iter()
    .cycle()
    .take(12)
    .enumerate()
    {
        let child = Command::new(exe())
            .args(["run", "--memory-max", "128M", "--"])
            .arg(&sleeper)
            .arg("1000")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while cgroup_procs_of(child.id()).is_none_or(|p| p.is_empty()) {
            assert!(start.elapsed() < Duration::from_secs(30), "never started");
            std::thread::sleep(Duration::from_millis(2));
        }
        // Now and then, a moment later.
        std::thread::sleep(Duration::from_millis(7 * (i as u64 % 4)));
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), *sig).unwrap();
        let owner = child.id();
        let out = child.wait_with_output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(out.status.code(), Some(*code), "{sig:?}: {stdout} {stderr}");
        assert!(
            stderr.contains(&format!("interrupted by {sig:?}")),
            "{stderr}"
        );
        assert!(
            !stdout.contains("killed by"),
            "a report of an interrupted run: {stdout}"
        );
        assert!(cgroups_of(owner).is_empty(), "{:?}", cgroups_of(owner));
        wait_gone(&marker);
    }
}

#[test]
fn compare_interrupted_leaves_no_cgroup() {
    let _group = crate::common::group(super::GROUP);
    if !root() {
        return;
    }
    for i in 0..10u64 {
        let child = Command::new(exe())
            .args([
                "compare",
                "--rounds",
                "200",
                "--memory-max",
                "64M",
                "--",
                "true",
                ":::",
                "true",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while cgroup_procs_of(child.id()).is_none() {
            assert!(start.elapsed() < Duration::from_secs(30), "never started");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(13 * i));
        let owner = child.id();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(owner as i32),
            nix::sys::signal::Signal::SIGINT,
        )
        .unwrap();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(130), "{stderr}");
        assert!(stderr.contains("removed what this run created"), "{stderr}");
        assert!(
            cgroups_of(owner).is_empty(),
            "round {i}: {:?}",
            cgroups_of(owner)
        );
    }
}

#[test]
fn a_failing_competitor_fails_the_arm_and_the_command() {
    let _group = crate::common::group(super::GROUP);
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.bin", 4 * MIB);
    let pressure = |fraction: &str| {
        Command::new(exe())
            .args(["pressure".as_ref(), file.as_os_str()])
            .args([
                "--experiment",
                "competitor",
                "--memory-max",
                "128M",
                "--competitor-fraction",
                fraction,
                "--competitor-steps",
                "1",
                "--competitor-step-seconds",
                "0.2",
                "--map-readers",
                "1",
            ])
            .output()
            .unwrap()
    };
    // A fraction that once made the competitor child panic ("capacity overflow") and
    // was reported as a valid experiment: refused when the command line is parsed now.
    let out = pressure("1e12");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // Not a number of the limit at all: refused up front.
    let out = pressure("inf");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("'inf'"), "{stderr}");
    assert!(leftover_cgroups().is_empty(), "{:?}", leftover_cgroups());
}

#[test]
fn too_many_readers_are_refused_at_once() {
    let _group = crate::common::group(super::GROUP);
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.bin", MIB);
    let start = Instant::now();
    let out = Command::new(exe())
        .args(["pressure".as_ref(), file.as_os_str()])
        .args([
            "--experiment",
            "readers",
            "--readers",
            "10000",
            "--memory-max",
            "256M",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("twofold: error"))
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains("'--readers 10000' cannot fit"),
        "{stderr}"
    );
    assert!(errors[0].contains("at most 127 readers fit"), "{stderr}");
    assert!(start.elapsed() < Duration::from_secs(5));
}

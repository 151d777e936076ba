use std::process::Command;

use super::*;

/// Starts `sleep 30` with pid `pid` (root writes the last pid handed out to
/// `/proc/sys/kernel/ns_last_pid`; other forks on the machine may get there first, so
/// retried).
fn spawn_with_pid(pid: i32) -> Option<Child> {
    for _ in 0..500 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).ok()?;
        let mut c = Command::new("sleep").arg("30").spawn().ok()?;
        if c.id() as i32 == pid {
            return Some(c);
        }
        let _ = c.kill();
        let _ = c.wait();
    }
    None
}

#[test]
fn a_reaped_child_is_never_signalled_even_when_its_pid_is_reused() {
    let reg = Registry::default();
    let mut a = reg.spawn(&mut Command::new("true")).unwrap();
    let pid = a.id() as i32;
    // Reaped by its owner without telling the registry (the old registry's pid list).
    a.wait().unwrap();
    assert_eq!(reg.pids(), [pid]);
    let Some(mut b) = spawn_with_pid(pid) else {
        eprintln!("skipped: cannot hand pid {pid} to another process (needs root: /proc/sys/kernel/ns_last_pid)");
        return;
    };
    let u = reg.undo();
    assert_eq!(u.killed, 0);
    std::thread::sleep(Duration::from_millis(50));
    let alive = b.try_wait().unwrap().is_none();
    let _ = b.kill();
    let _ = b.wait();
    assert!(
        alive,
        "the registry killed pid {pid}, which is no longer its child"
    );
}

#[test]
fn undo_kills_and_reaps_live_children_and_forgets_reaped_ones() {
    let reg = Registry::default();
    let live = reg.spawn(Command::new("sleep").arg("30")).unwrap();
    let mut done = reg.spawn(&mut Command::new("true")).unwrap();
    done.wait().unwrap();
    reg.forget(done.id() as i32);
    assert_eq!(reg.pids(), [live.id() as i32]);
    let u = reg.undo();
    assert_eq!(u.killed, 1);
    // Reaped: no zombie left behind.
    assert!(!Path::new(&format!("/proc/{}", live.id())).exists());
    // Closed: nothing new starts.
    let err = reg.spawn(&mut Command::new("true")).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::Interrupted);
    drop(live);
}

#[test]
fn die_with_parent_sets_the_parent_death_signal() {
    // A child of a thread that ends is SIGKILLed (PR_SET_PDEATHSIG follows the thread).
    let child = std::thread::spawn(|| {
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        die_with_parent(&mut cmd);
        cmd.spawn().unwrap()
    })
    .join()
    .unwrap();
    let fd = PidFd::open(child.id() as i32).unwrap();
    assert!(
        fd.wait_exited(Duration::from_secs(5)),
        "the child outlived its parent thread"
    );
    let mut child = child;
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL));
}

#[test]
fn a_child_whose_parent_is_gone_exits_quietly() {
    // As if the parent had died between fork and exec: the pid it checks is not its
    // parent's. It must exit with ORPHAN_EXIT and print nothing, not fail the spawn
    // (which, with the parent really gone, aborts with "fatal runtime error").
    let mut cmd = Command::new("echo");
    cmd.arg("ran")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    die_with(&mut cmd, i32::MAX);
    let out = cmd.spawn().unwrap().wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(ORPHAN_EXIT));
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");
}

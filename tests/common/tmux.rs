//! A detached tmux server per test, to drive `twofold top` in a real terminal (tmux
//! answers crossterm's queries, a bare PTY does not).

use std::process::Command;
use std::time::{Duration, Instant};

/// One tmux server per test (its own socket), killed on drop.
pub struct Tmux {
    socket: String,
}

impl Tmux {
    pub fn new(name: &str) -> Tmux {
        Tmux {
            socket: format!("twofold-test-{name}-{}", std::process::id()),
        }
    }

    pub fn cmd(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .unwrap()
    }

    pub fn start(&self, w: u16, h: u16, shell_cmd: &str) {
        let out = self.cmd(&[
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            &w.to_string(),
            "-y",
            &h.to_string(),
            shell_cmd,
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "top"];
        args.extend_from_slice(keys);
        assert!(self.cmd(&args).status.success());
    }

    pub fn screen(&self) -> String {
        String::from_utf8_lossy(&self.cmd(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    }

    /// Polls the pane until `pred` holds (or panics with the last screen).
    pub fn wait_for(&self, what: &str, timeout: Duration, pred: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let s = self.screen();
            if pred(&s) {
                return s;
            }
            if start.elapsed() > timeout {
                panic!("timed out waiting for {what}; the screen:\n{s}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        // The pane's processes first (and their children), by pid: a top that does not
        // stop on the server's hangup must not outlive the test.
        let panes = self.cmd(&["list-panes", "-a", "-F", "#{pane_pid}"]);
        let pids: Vec<String> = String::from_utf8_lossy(&panes.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        for pid in &pids {
            let _ = Command::new("pkill").args(["-9", "-P", pid]).status();
            let _ = Command::new("kill").args(["-9", pid]).status();
        }
        let _ = self.cmd(&["kill-server"]);
        // The server's socket file stays behind when the server is killed: remove it.
        let dir = std::env::var("TMUX_TMPDIR").unwrap_or_else(|_| "/tmp".into());
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        let _ = std::fs::remove_file(format!("{dir}/tmux-{uid}/{}", self.socket));
    }
}

//! Process file descriptors (`pidfd_open(2)`, `pidfd_send_signal(2)`, `waitid(P_PIDFD)`):
//! a handle on one process that stays valid after it exits, so a signal sent through it can
//! never reach another process that later gets the same pid.
//! <https://man7.org/linux/man-pages/man2/pidfd_open.2.html>

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// A pidfd of one process.
#[derive(Debug)]
pub struct PidFd {
    fd: OwnedFd,
    pid: i32,
}

impl PidFd {
    /// Opens a pidfd for `pid` (a zombie still has one; a reaped pid has none).
    pub fn open(pid: i32) -> io::Result<PidFd> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this fd to us; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        Ok(PidFd { fd, pid })
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Sends `sig`; `ESRCH` once the process has exited (even if its pid is reused).
    pub fn signal(&self, sig: i32) -> io::Result<()> {
        // SAFETY: pidfd_send_signal takes an fd we own, a signal number, a null siginfo
        // and flags 0.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.fd.as_raw_fd(),
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Whether the process has exited (the pidfd polls readable), waiting up to `timeout`.
    pub fn wait_exited(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let mut p = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let left = deadline.saturating_duration_since(Instant::now());
            // SAFETY: one valid pollfd for the duration of the call.
            let n = unsafe { libc::poll(&mut p, 1, left.as_millis().min(i32::MAX as u128) as i32) };
            if n > 0 {
                return true;
            }
            let interrupted =
                n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted;
            if !interrupted || Instant::now() >= deadline {
                return false;
            }
        }
    }

    /// Reaps the process if it is our child and has exited (no zombie left for init);
    /// `false` if it was not reaped here (still running, or reaped by someone else).
    pub fn reap(&self) -> bool {
        // SAFETY: zeroed siginfo is a valid out-parameter for waitid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid with P_PIDFD on an fd we own writes only into `info`.
        let r = unsafe {
            libc::waitid(
                libc::P_PIDFD,
                self.fd.as_raw_fd() as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG,
            )
        };
        // SAFETY: si_pid is valid to read for a siginfo filled in by waitid (0 if none).
        r == 0 && unsafe { info.si_pid() } != 0
    }

    /// SIGKILLs the process and reaps it within `timeout` if it is our child; whether it
    /// was running when signalled.
    pub fn kill_and_reap(&self, timeout: Duration) -> bool {
        let was_running = self.signal(libc::SIGKILL).is_ok();
        if self.wait_exited(timeout) {
            self.reap();
        }
        was_running
    }
}

//! Processes: identifying them safely and killing them without hitting a stranger.
//!
//! A pid alone is not an identity: after a process exits, the kernel may hand its pid
//! to an unrelated process. Every kill here therefore goes through a *pidfd*: open a
//! pidfd for the pid, then check (through `/proc`) that the process is the one we mean
//! — the start time recorded when we started it, or the network namespace it lives
//! in — and only then signal through the pidfd. A pidfd always refers to the process
//! it was opened for, so the check and the signal cannot be split by pid reuse.

use std::collections::HashSet;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};

/// Identity of a namespace: the (device, inode) pair of its nsfs file.
pub type NsId = (u64, u64);

/// The start time of `pid` in clock ticks since boot (field 22 of `/proc/<pid>/stat`),
/// or `None` if there is no such process.
pub fn start_time(pid: i32) -> io::Result<Option<u64>> {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => parse_start_time(&stat).map(Some).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unparsable /proc/{pid}/stat"),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Field 22 of a `/proc/<pid>/stat` line. The command name (field 2) is in parentheses
/// and may itself contain spaces and `)`, so fields are counted after the *last* `)`.
fn parse_start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the `)` come fields 3 (state), 4, …; field 22 is the 20th of them.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The network namespace of `pid`, or `None` if the process is gone (or a kernel thread).
pub fn netns_of(pid: i32) -> Option<NsId> {
    std::fs::metadata(format!("/proc/{pid}/ns/net"))
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Every process (other than this one) whose network namespace is one of `ids`.
pub fn processes_in(ids: &HashSet<NsId>) -> io::Result<Vec<i32>> {
    let own = std::process::id();
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let Some(pid) = entry?
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if u32::try_from(pid).ok() == Some(own) {
            continue;
        }
        if netns_of(pid).is_some_and(|id| ids.contains(&id)) {
            out.push(pid);
        }
    }
    Ok(out)
}

/// A pidfd: a handle on one process that pid reuse cannot redirect.
///
/// The calls go through `rustix` (nix 0.31 has no pidfd wrappers), so this module
/// needs no `unsafe`.
struct Pidfd(OwnedFd);

impl Pidfd {
    /// `None` if there is no process `pid`.
    fn open(pid: i32) -> io::Result<Option<Pidfd>> {
        // pidfd_open(2) refuses 0 and negative pids (EINVAL); say so before rustix's
        // `Pid`, which cannot hold them.
        let Some(target) = (pid > 0).then(|| Pid::from_raw(pid)).flatten() else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("pid {pid}: not a process id"),
            ));
        };
        match pidfd_open(target, PidfdFlags::empty()) {
            Ok(fd) => Ok(Some(Pidfd(fd))),
            Err(Errno::SRCH) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Sends SIGKILL; `false` if the process had already exited.
    fn kill(&self) -> io::Result<bool> {
        self.signal(Signal::KILL)
    }

    /// Sends `sig`; `false` if the process had already exited.
    fn signal(&self, sig: Signal) -> io::Result<bool> {
        match pidfd_send_signal(&self.0, sig) {
            Ok(()) => Ok(true),
            Err(Errno::SRCH) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Waits until the process has exited (a pidfd polls readable then; a zombie
    /// counts as exited: it has left its namespaces already).
    fn wait_exit(&self, timeout: Duration) -> io::Result<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = Timespec::try_from(deadline.saturating_duration_since(Instant::now()))
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "timeout too long"))?;
            let mut fds = [PollFd::new(&self.0, PollFlags::IN)];
            match poll(&mut fds, Some(&left)) {
                Ok(1..) => return Ok(true),
                Ok(0) => return Ok(false),
                Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// How long a SIGKILLed process may take to exit before teardown reports it.
pub const KILL_TIMEOUT: Duration = Duration::from_secs(5);

/// SIGKILLs `pid` if `is_ours` confirms (after the pidfd is open) that it is the
/// process we mean, and waits for it to exit. `Ok(false)` if there was nothing to kill.
pub fn kill_verified(pid: i32, is_ours: impl Fn(i32) -> bool) -> io::Result<bool> {
    let Some(pidfd) = Pidfd::open(pid)? else {
        return Ok(false);
    };
    if !is_ours(pid) || !pidfd.kill()? {
        return Ok(false);
    }
    if pidfd.wait_exit(KILL_TIMEOUT)? {
        Ok(true)
    } else {
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("pid {pid} still running {KILL_TIMEOUT:?} after SIGKILL"),
        ))
    }
}

/// Stops `pid` gracefully if `is_ours` confirms it is the process we mean:
/// SIGTERM, then SIGKILL if it has not exited after `grace`. Blocking (up to
/// `grace` + [`KILL_TIMEOUT`]). `Ok(false)` if there was nothing to stop.
pub fn terminate_verified(
    pid: i32,
    is_ours: impl Fn(i32) -> bool,
    grace: Duration,
) -> io::Result<bool> {
    let Some(pidfd) = Pidfd::open(pid)? else {
        return Ok(false);
    };
    if !is_ours(pid) || !pidfd.signal(Signal::TERM)? {
        return Ok(false);
    }
    if pidfd.wait_exit(grace)? {
        return Ok(true);
    }
    pidfd.kill()?;
    if pidfd.wait_exit(KILL_TIMEOUT)? {
        Ok(true)
    } else {
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("pid {pid} still running {KILL_TIMEOUT:?} after SIGKILL"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn parses_field_22_even_with_hostile_command_names() {
        let line =
            "1234 (a) b (c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 200";
        assert_eq!(parse_start_time(line), Some(987654));
        assert_eq!(parse_start_time("garbage"), None);
        assert_eq!(parse_start_time("1 (x) S 1 2"), None);
    }

    #[test]
    fn own_start_time_is_stable_and_absent_pids_are_none() {
        let me = i32::try_from(std::process::id()).unwrap();
        let a = start_time(me).unwrap().unwrap();
        assert_eq!(start_time(me).unwrap(), Some(a));
        // pid_max is at most 2^22: this pid cannot exist.
        assert_eq!(start_time(i32::MAX).unwrap(), None);
        assert!(netns_of(me).is_some());
        assert!(netns_of(i32::MAX).is_none());
    }

    #[test]
    fn pids_that_name_no_single_process_are_refused() {
        // 0 and negative pids mean process groups to kill(2); never signal those.
        for pid in [0, -1, i32::MIN] {
            let err = kill_verified(pid, |_| true).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{pid}: {err}");
            let err = terminate_verified(pid, |_| true, Duration::ZERO).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{pid}: {err}");
        }
    }

    #[test]
    fn kill_checks_identity_before_signalling() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let st = start_time(pid).unwrap().unwrap();
        // A wrong identity (a "reused pid") is left alone.
        assert!(!kill_verified(pid, |p| start_time(p).ok().flatten() == Some(st + 1)).unwrap());
        assert!(child.try_wait().unwrap().is_none(), "killed a stranger");
        // The right one dies.
        assert!(kill_verified(pid, |p| start_time(p).ok().flatten() == Some(st)).unwrap());
        let status = child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(Signal::KILL.as_raw())
        );
        // Gone (reaped): nothing to kill (checked by identity: the pid may be reused).
        assert!(!kill_verified(pid, |p| start_time(p).ok().flatten() == Some(st)).unwrap());
    }

    #[test]
    fn terminate_sends_sigterm_and_kills_what_ignores_it() {
        let same = |st: u64| move |p| start_time(p).ok().flatten() == Some(st);
        // Exits on SIGTERM.
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let st = start_time(pid).unwrap().unwrap();
        assert!(!terminate_verified(pid, same(st + 1), Duration::from_secs(2)).unwrap());
        assert!(terminate_verified(pid, same(st), Duration::from_secs(2)).unwrap());
        let status = child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(Signal::TERM.as_raw())
        );
        // Ignores SIGTERM: killed after the grace period.
        let mut child = Command::new("sh")
            .args(["-c", "trap '' TERM; echo up; while :; do sleep 0.1; done"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let st = start_time(pid).unwrap().unwrap();
        assert!(terminate_verified(pid, same(st), Duration::from_millis(300)).unwrap());
        let status = child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(Signal::KILL.as_raw())
        );
    }
}

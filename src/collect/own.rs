//! The exporter's own process, as the Prometheus client libraries report it
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! `process_start_time_seconds`): `PROC/self/stat` (utime, stime and starttime, in clock
//! ticks), `PROC/self/statm` (resident pages) and `PROC/stat` (`btime`, the boot time in
//! Unix seconds). See proc(5): <https://man7.org/linux/man-pages/man5/proc.5.html>.

use std::path::Path;

/// This process's CPU time, RSS and start time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OwnProcess {
    /// User plus system CPU time, seconds.
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    /// When it started, Unix seconds (`None` when `PROC/stat` has no `btime`).
    pub start_time_seconds: Option<f64>,
}

/// The fields after `(comm)` of a stat line (comm may hold spaces and parentheses).
fn fields_after_comm(stat: &str) -> Option<Vec<&str>> {
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().collect())
}

/// Parses `self/stat`, `self/statm` and `stat` (pure: the texts, the clock-tick rate and
/// the page size).
pub fn parse(
    stat: &str,
    statm: &str,
    proc_stat: &str,
    ticks: f64,
    page: u64,
) -> Option<OwnProcess> {
    // After comm: state is field 3 of stat(5), so field N is at index N - 3.
    let f = fields_after_comm(stat)?;
    let num = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
    let cpu_seconds = (num(14)? + num(15)?) as f64 / ticks;
    let start_ticks = num(22)?;
    let resident_pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    let btime = proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok());
    Some(OwnProcess {
        cpu_seconds,
        resident_bytes: resident_pages * page,
        start_time_seconds: btime.map(|b| b as f64 + start_ticks as f64 / ticks),
    })
}

/// This process, read under `proc_root`; `None` when the files cannot be read or parsed.
pub fn read(proc_root: &Path) -> Option<OwnProcess> {
    let stat = std::fs::read_to_string(proc_root.join("self/stat")).ok()?;
    let statm = std::fs::read_to_string(proc_root.join("self/statm")).ok()?;
    let proc_stat = std::fs::read_to_string(proc_root.join("stat")).unwrap_or_default();
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if ticks <= 0 || page <= 0 {
        return None;
    }
    parse(&stat, &statm, &proc_stat, ticks as f64, page as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kernel_texts() {
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 5 0 \
                    1000 123456789 2048 18446744073709551615";
        let o = parse(
            stat,
            "30000 2048 500 1 0 3000 0\n",
            "cpu 1 2 3\nbtime 1700000000\n",
            100.0,
            4096,
        )
        .unwrap();
        assert_eq!(o.cpu_seconds, 3.0);
        assert_eq!(o.resident_bytes, 2048 * 4096);
        assert_eq!(o.start_time_seconds, Some(1_700_000_010.0));
        assert_eq!(parse("garbage", "", "", 100.0, 4096), None);
    }

    #[test]
    fn reads_this_process() {
        let o = read(Path::new("/proc")).unwrap();
        let rss = std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find_map(|l| {
                l.strip_prefix("VmRSS:")?
                    .trim()
                    .strip_suffix(" kB")?
                    .parse::<u64>()
                    .ok()
            })
            .unwrap()
            * 1024;
        // The two reads are a few instructions apart: within 4 MiB of each other.
        assert!(o.resident_bytes.abs_diff(rss) < 4 << 20, "{o:?} vs {rss}");
        assert!(o.start_time_seconds.is_some());
    }
}

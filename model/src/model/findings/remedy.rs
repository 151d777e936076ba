//! What to do about a finding: the remedy of an unsearched candidate by why it was not
//! searched, and of an unknown residency, each for who is reading.

use crate::sample::unsearched::Unsearched;
use crate::sample::Privilege;

/// What to do about a candidate that was not searched: by why it was not, and for who is
/// reading (never tell root to run as root).
pub fn suspect_remedy(unsearched: &Unsearched, reader: Option<Privilege>) -> &'static str {
    match unsearched {
        Unsearched::ChangedSinceSearch(_) => {
            return "a live view searches a process whose memory keeps changing on a cadence; `twofold scan` searches it now";
        }
        Unsearched::Policy(_) => {
            return "its memory is closed even to root by a security policy: it can only be searched from inside its sandbox, or with the policy relaxed";
        }
        Unsearched::Exited(_) => {
            return "nothing to do: a process that exited holds no memory; scan again";
        }
        Unsearched::NothingSearchable(_) => {
            return "none: nothing in this file can be searched for, so a copy can be neither proven nor ruled out";
        }
        Unsearched::OverBudget(_) => {
            return "raise --prove-budget to prove or rule it out";
        }
        Unsearched::NoProve(_) => return "scan without --no-prove to prove or rule it out",
        Unsearched::NotAnswering(_) => {
            return "its filesystem did not answer (a hung NFS server, a stopped FUSE daemon): once it answers, the next scan searches it";
        }
        Unsearched::NotIndexed(_) | Unsearched::NoPtrace(_) | Unsearched::Other(_) => {}
    }
    match reader {
        Some(r) if r.reads_any() => {
            "search it alone with `twofold dupes --pid PID FILE` (no budget), or raise --prove-budget, to prove or rule it out"
        }
        Some(r) if r.is_root() => {
            "run with CAP_SYS_PTRACE (this root lacks it), or raise --prove-budget, to prove or rule it out"
        }
        _ => "run as root (or with CAP_SYS_PTRACE) and without --no-prove, or raise --prove-budget, to prove or rule it out",
    }
}

/// What to do about a file whose residency is unknown, for who is reading.
pub fn residency_remedy(reason: &str, reader: Option<Privilege>) -> Option<&'static str> {
    let refused = ["Permission denied", "Operation not permitted", "denied"]
        .iter()
        .any(|w| reason.contains(w));
    match reader {
        Some(r) if r.is_root() => refused.then_some(
            "refused even to root: a security policy, or a file system that refuses root (FUSE without allow_root, NFS root squash)",
        ),
        _ => Some("run as root, or as the file's owner"),
    }
}

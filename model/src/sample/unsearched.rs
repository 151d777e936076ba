//! Why a candidate process was not (fully) searched for a file: the words that begin
//! `ProofSample::unsearched`, which the findings test for their remedy.

/// How a process that refused even a reader with `CAP_SYS_PTRACE` is described.
pub const POLICY: &str = "denied even to root by a security policy (e.g. a sandbox's pid 1)";
/// How a refusal for want of ptrace rights is described.
pub const NO_PTRACE: &str = "needs ptrace rights";
/// How a process that went away is described.
pub const EXITED: &str = "the process exited";
/// How the reason of a candidate checked in place between full searches begins.
pub const CHANGED_SINCE_SEARCH: &str = "its memory changed since its last full search";

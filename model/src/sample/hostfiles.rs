//! What `scan --pid P` without named files looked for.

use serde::{Deserialize, Serialize};

/// What a collection of named processes looked for ([`super::Sample::host_files`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostFiles {
    /// The host's files of interest the processes were searched for.
    pub considered: u64,
    /// Of those, the files left out: no named process maps, holds or names them, and
    /// none holds a copy of them (searched, or too little private memory to hold one).
    pub left_out: u64,
}

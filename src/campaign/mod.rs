//! Campaigns: commands run inside a memory-limited cgroup ([`sandbox`]), sampled
//! ([`sampler`]), summarised (`run`), compared, and put under pressure.

pub mod integrity;
pub mod plot;
pub mod readers;
pub mod run;
pub mod sampler;
pub mod sandbox;
pub mod stats;

//! Campaigns: commands run inside a memory-limited cgroup ([`sandbox`]), sampled
//! ([`sampler`]), summarised (`run`), compared, and put under pressure.

pub mod cache;
pub mod competitor;
pub mod integrity;
pub mod out;
pub mod plot;
pub mod readers;
pub mod run;
pub mod sampler;
pub mod sandbox;
pub mod stats;

/// A progress bar on stderr for `steps` steps; hidden with `--json` (and, by indicatif,
/// when stderr is not a terminal).
pub fn progress(steps: u64, quiet: bool) -> indicatif::ProgressBar {
    if quiet {
        return indicatif::ProgressBar::hidden();
    }
    // No steps: a spinner with the elapsed time.
    let (bar, template) = if steps == 0 {
        (
            indicatif::ProgressBar::new_spinner(),
            "{spinner} [{elapsed_precise}] {msg}",
        )
    } else {
        (
            indicatif::ProgressBar::new(steps),
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}",
        )
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}

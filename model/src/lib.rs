//! twofold's data model: raw [`sample`] types (values exactly as the kernel reported
//! them) and the [`model`] built from them (footprints, representation counts, findings,
//! the reports of `dupes`, `residency`, `inspect`, `probe` and `trace`), with [`units`]
//! to write sizes.
//!
//! Pure: no I/O, no clock, no system calls; a function here takes values and returns
//! values. It may import serde, foldhash (fixed seeds only: no randomness), `twofold-formats` (the parsers' tensor-table types) and
//! `twofold-probe-types` (the GPU probes' report types), and nothing that reads the
//! machine: not libc, nix, procfs, aya, NVML, ratatui, nor the main `twofold` crate
//! (whose `collect`, `dupes` and `engine` fill these types in, and whose `render`,
//! `export` and `tui` show them). The main crate re-exports the modules at their old
//! paths (`twofold::sample`, `twofold::model`, `twofold::units`). The test below keeps
//! the manifest to that list.
//!
//! The sentences of findings, of probe verdicts and of unsearched reasons are here too
//! ([`model::findings::text`], `model::probe`'s `Display`s, [`sample::unsearched`]): the
//! JSON document carries them, so the types' serde needs them.

pub mod model;
pub mod sample;
pub mod units;

#[cfg(test)]
mod purity {
    /// What the model crate may depend on (`[dependencies]` of its manifest).
    const ALLOWED: &[&str] = &[
        "serde",
        "foldhash",
        "twofold-formats",
        "twofold-probe-types",
    ];

    #[test]
    fn the_manifest_names_no_io_dependency() {
        let manifest = include_str!("../Cargo.toml");
        let mut section = "";
        let mut deps = Vec::new();
        for line in manifest.lines().map(str::trim) {
            if line.starts_with('[') {
                section = line;
            } else if !line.is_empty() && !line.starts_with('#') {
                let name = line.split(['=', ' ', '.']).next().unwrap_or("");
                // Dependencies of any kind but the tests' own.
                if section.contains("dependencies") && !section.contains("dev-dependencies") {
                    deps.push((section, name));
                }
            }
        }
        assert!(!deps.is_empty(), "no [dependencies] found in the manifest");
        for (section, name) in deps {
            assert!(
                ALLOWED.contains(&name),
                "{section} names '{name}': the model crate may depend only on {ALLOWED:?}"
            );
        }
    }
}

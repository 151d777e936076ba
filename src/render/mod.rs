//! Rendering: turns models into text for people and JSON for programs. No I/O besides
//! the `Write` it is given.

pub mod dump;
pub mod dupes;
pub mod findings;
mod head;
pub mod inspect;
pub mod probe;
pub mod residency;
pub mod safe;
pub mod scan;
pub mod table;
pub mod trace;
pub mod uploads;

use serde::Serialize;

/// Writes one pretty JSON document followed by a newline.
pub fn json<T: Serialize>(out: &mut dyn std::io::Write, value: &T) -> std::io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, value)?;
    writeln!(out)
}

#![no_main]
//! The zip reader and the `.npz` / torch archive parsers behind `parse_bytes`, on
//! arbitrary bytes: errors are fine, panics, overflows, hangs and huge allocations are not.

use libfuzzer_sys::fuzz_target;
use twofold_formats::{self as container, zip};

fuzz_target!(|data: &[u8]| {
    if let Ok(archive) = zip::read(&data) {
        for e in &archive.entries {
            let _ = zip::data_offset(&data, &archive, e);
        }
    }
    let _ = container::parse_bytes(data);
});

#![no_main]
//! The restricted pickle walker (torch `data.pkl`) on arbitrary bytes.

use libfuzzer_sys::fuzz_target;
use twofold_formats::pickle;

fuzz_target!(|data: &[u8]| {
    let _ = pickle::storages(data);
});

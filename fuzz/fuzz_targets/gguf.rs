#![no_main]
//! The gguf parser, and the sniffing entry point, on arbitrary bytes: errors are fine,
//! panics, overflows, hangs and huge allocations are not.

use libfuzzer_sys::fuzz_target;
use twofold_formats as container;

fuzz_target!(|data: &[u8]| {
    let _ = container::gguf::parse(&data);
    let _ = container::parse_bytes(data);
});

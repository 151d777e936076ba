//! Tests of the upload records' parsing (`upload_records.rs`).
use super::super::upload_entries::entry_name;
use super::*;

#[test]
fn the_record_layout_is_the_c_one() {
    // struct upload_head: 8 + 4 + 4 + 4 + 4 + 8 * 3 + 4 + 4.
    assert_eq!(HEAD, 56);
    assert_eq!(COPY, 56 + 8 + 2064 + 512);
    let mut b = vec![0u8; COPY];
    b[8..12].copy_from_slice(&42u32.to_le_bytes());
    b[16..20].copy_from_slice(&5u32.to_le_bytes());
    b[20..24].copy_from_slice(&1u32.to_le_bytes());
    b[40..48].copy_from_slice(&4096u64.to_le_bytes());
    b[HEAD..HEAD + 4].copy_from_slice(&100u32.to_le_bytes());
    b[HEAD + 4..HEAD + 8].copy_from_slice(&0b11u32.to_le_bytes());
    let r = parse(&b, 0).unwrap();
    assert_eq!(r.pid, 42);
    let Call::Copy(c) = r.call else { panic!() };
    assert_eq!((c.entry, c.bytes, c.anchor.len()), (5, 4096, 100));
    assert_eq!(c.samples.iter().map(|s| s.0).collect::<Vec<_>>(), [0, 270]);
    assert_eq!(entry_name(5), "cuMemcpyHtoDAsync_v2");
    // A small copy: its anchor is the whole copy, no samples (whatever `sampled` says).
    let mut b = vec![0u8; SMALL_COPY];
    b[20..24].copy_from_slice(&1u32.to_le_bytes());
    b[40..48].copy_from_slice(&200u64.to_le_bytes());
    b[48..52].copy_from_slice(&FLAG_SMALL.to_le_bytes());
    b[HEAD..HEAD + 4].copy_from_slice(&200u32.to_le_bytes());
    b[HEAD + 4..HEAD + 8].copy_from_slice(&1u32.to_le_bytes());
    b[HEAD + 8] = 7;
    let Call::Copy(c) = parse(&b, 0).unwrap().call else {
        panic!()
    };
    assert_eq!((c.bytes, c.anchor.len(), c.anchor[0]), (200, 200, 7));
    assert!(c.samples.is_empty());
    assert_eq!(SMALL_COPY, 56 + 8 + 256);
    // A full record that short is refused.
    b[48..52].copy_from_slice(&0u32.to_le_bytes());
    assert!(parse(&b, 0).is_none());
    assert_eq!(sample_offset(4096, 15), 4064);
}

#[test]
fn a_tiny_slot_record_names_its_slot_and_process() {
    let mut b = vec![0u8; HEAD];
    b[8..12].copy_from_slice(&4242u32.to_le_bytes());
    b[20..24].copy_from_slice(&8u32.to_le_bytes());
    b[24..32].copy_from_slice(&17u64.to_le_bytes());
    let r = parse(&b, 0).unwrap();
    assert_eq!(r.pid, 4242);
    assert!(
        matches!(r.call, Call::TinySlot { slot: 17 }),
        "{:?}",
        r.call
    );
    // The tracer keeps it: the sink never sees a slot taken.
    let mut tiny = super::super::tiny::TinySlots::default();
    let mut seen = Vec::new();
    super::super::uploads::hand_on(r, &mut tiny, &mut |n| seen.push(n));
    assert!(seen.is_empty());
}

/// The GPUDirect Storage records (`struct upload_gds`): a registration's handle and file
/// (the kernel's dev_t), a read's handle, destination, bytes and file offset.
#[test]
fn gds_records_are_the_c_layout() {
    assert_eq!(GDS, 56 + 32);
    let mut b = vec![0u8; GDS];
    b[20..24].copy_from_slice(&10u32.to_le_bytes());
    b[HEAD..HEAD + 8].copy_from_slice(&0xabcu64.to_le_bytes());
    b[HEAD + 16..HEAD + 24].copy_from_slice(&77u64.to_le_bytes());
    b[HEAD + 24..HEAD + 28].copy_from_slice(&((8u32 << 20) | 3).to_le_bytes());
    let Call::GdsHandle { handle, file } = parse(&b, 0).unwrap().call else {
        panic!()
    };
    assert_eq!(
        (handle, file.major, file.minor, file.inode),
        (0xabc, 8, 3, 77)
    );
    b[20..24].copy_from_slice(&11u32.to_le_bytes());
    b[16..20].copy_from_slice(&301u32.to_le_bytes());
    b[24..32].copy_from_slice(&0x1000u64.to_le_bytes());
    b[40..48].copy_from_slice(&4096u64.to_le_bytes());
    b[HEAD + 8..HEAD + 16].copy_from_slice(&512u64.to_le_bytes());
    let Call::GdsRead {
        entry,
        handle,
        dst,
        bytes,
        file_offset,
    } = parse(&b, 0).unwrap().call
    else {
        panic!()
    };
    assert_eq!(
        (handle, dst, bytes, file_offset),
        (0xabc, 0x1000, 4096, 512)
    );
    assert_eq!(entry_name(entry), "cuFileRead");
    // A record cut short is no record.
    assert!(parse(&b[..GDS - 1], 0).is_none());
}

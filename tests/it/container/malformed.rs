//! Malformed input: every truncation, lying lengths and absurd counts, wrong magic,
//! non-UTF-8 names, other zips: a clear one-line error each time, never a panic.

use super::*;

/// Every strict prefix of `file` at least `magic` bytes long is an error with a one-line
/// message; shorter ones are opaque; none panics.
fn assert_prefixes_fail(file: &[u8], magic: usize) {
    for cut in 0..file.len() {
        match container::parse_bytes(&file[..cut]) {
            Ok(c) => assert!(
                cut < magic && c.format == Format::Opaque,
                "prefix {cut} of {} parsed as {:?}",
                file.len(),
                c.format
            ),
            Err(e) => {
                let msg = e.to_string();
                assert!(!msg.is_empty() && !msg.contains('\n'), "{msg}");
            }
        }
    }
}

#[test]
fn every_truncation_is_an_error() {
    assert_prefixes_fail(&gguf_file(3, Some(64)).0, 4);
    assert_prefixes_fail(&gguf_file(2, None).0, 4);
    assert_prefixes_fail(&safetensors_file().0, 9);
    assert_prefixes_fail(&npy(1, "<f4", &[3, 4], &bytes(1, 48), 0), 6);
    assert_prefixes_fail(&zip(&npz_entries(), false).0, 4);
    assert_prefixes_fail(&zip(&npz_entries(), true).0, 4);
    assert_prefixes_fail(
        &torch("archive", &[("0", "FloatStorage", 2, bytes(1, 8))]).0,
        4,
    );
}

#[test]
fn lying_lengths_and_absurd_counts() {
    // safetensors header length past the end.
    let mut f = safetensors_file().0;
    f[..8].copy_from_slice(&999_999u64.to_le_bytes());
    f.truncate(1024);
    assert_eq!(
        err(&f),
        "header runs past the end of the file: it would end at byte '1000007' but the file ends at byte '1024'"
    );

    // GGUF: u64::MAX tensors, u64::MAX key-values, a string longer than the file,
    // a string array of u64::MAX items.
    let (g, _) = gguf_file(3, None);
    let mut f = g.clone();
    f[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_eq!(
        err(&f),
        format!(
            "tensor count '{}' cannot fit in a file of '{}' bytes",
            u64::MAX,
            f.len()
        )
    );
    let mut f = g.clone();
    f[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(err(&f).starts_with(&format!("key-value count '{}'", u64::MAX)));
    let mut f = g.clone();
    f[24..32].copy_from_slice(&(u64::MAX - 3).to_le_bytes());
    assert!(err(&f).starts_with("truncated gguf key: needs '18446744073709551612' bytes"));
    let (g, _) = gguf(
        3,
        None,
        &[("t", Kv::Arr(8, vec![Kv::Str("x".into())]))],
        &[],
    );
    let mut f = g.clone();
    let at = 24 + 8 + 1 + 4 + 4;
    f[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(err(&f).starts_with(&format!("array length '{}' cannot fit", u64::MAX)));

    // A GGUF tensor whose element count overflows, and one past the end of the file.
    let t = |dims: &[u64], data| GgufTensor::new("t", dims, 0, data, Dtype::F32);
    let (mut f, _) = gguf(3, None, &[], &[t(&[1, 1], vec![0; 4])]);
    let dims_at = 24 + 8 + 1 + 4;
    f[dims_at..dims_at + 16].copy_from_slice(&[0xff; 16]);
    assert!(err(&f).contains("overflows"), "{}", err(&f));
    let (f, _) = gguf(3, None, &[], &[t(&[16], vec![0; 64])]);
    assert!(err(&f[..f.len() - 1]).contains("lies outside the data section"));

    // npy header length past the end.
    let mut f = npy(1, "<f4", &[1], &[0; 4], 0);
    f[8..10].copy_from_slice(&u16::MAX.to_le_bytes());
    assert_eq!(
        err(&f),
        format!(
            "header runs past the end of the file: it would end at byte '{}' but the file ends at byte '{}'",
            10 + 65535,
            f.len()
        )
    );

    // zip: 65535 entries in a tiny directory; a zip64 record claiming u64::MAX entries.
    let (mut f, _) = zip(&npz_entries(), false);
    let n = f.len() - 28 - 22;
    f[n + 10..n + 12].copy_from_slice(&u16::MAX.to_le_bytes());
    assert!(
        err(&f).starts_with("zip entry count '65535' cannot fit"),
        "{}",
        err(&f)
    );
    let (mut f, _) = zip(&npz_entries(), true);
    let rec = f.len() - 28 - 22 - 20 - 56;
    f[rec + 32..rec + 40].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(
        err(&f).starts_with(&format!("zip entry count '{}'", u64::MAX)),
        "{}",
        err(&f)
    );
}

#[test]
fn wrong_magic() {
    let (mut f, _) = gguf_file(3, None);
    f[3] = b'X';
    assert_eq!(
        gguf::parse(&f).unwrap_err().to_string(),
        "invalid gguf: no 'GGUF' magic"
    );
    assert_eq!(container::parse_bytes(&f).unwrap().format, Format::Opaque);
    let mut f = npy(1, "<f4", &[1], &[0; 4], 0);
    f[1] = b'X';
    assert!(npy::parse(&f).unwrap_err().to_string().contains("magic"));
    assert_eq!(container::parse_bytes(&f).unwrap().format, Format::Opaque);
    assert!(safetensors::parse(&b"\x02\0\0\0\0\0\0\0[]".to_vec())
        .unwrap_err()
        .to_string()
        .contains("not a json object"));
}

#[test]
fn non_utf8_names() {
    let mut t = GgufTensor::new("x", &[1], 0, vec![0; 4], Dtype::F32);
    t.name = vec![b'a', 0xff, 0xfe];
    let (f, _) = gguf(3, None, &[], &[t]);
    assert_eq!(
        err(&f),
        "gguf tensor name at offset '24' is not valid utf-8"
    );

    let (mut f, _, _) = safetensors_file();
    let at = f.windows(7).position(|w| w == b"layer.0").unwrap();
    f[at] = 0xff;
    assert!(err(&f).contains("not a json object"), "{}", err(&f));

    let (mut f, _) = zip(&npz_entries(), false);
    let cd = f.windows(4).position(|w| w == b"PK\x01\x02").unwrap();
    f[cd + 46] = 0xff;
    assert!(
        err(&f).starts_with("zip entry name at offset"),
        "{}",
        err(&f)
    );
}

#[test]
fn other_zips_and_unknown_files_are_opaque() {
    let (f, _) = zip(&[ZipEntry::stored("readme.txt", b"hi".to_vec())], false);
    let c = parse_file("x.zip", &f);
    assert_eq!(c.format, Format::Opaque);
    assert_eq!((c.tensors[0].offset, c.tensors[0].len), (0, f.len() as u64));
    let c = parse_file("model.gguf", b"not a model at all");
    assert_eq!(c.format, Format::Opaque);
}

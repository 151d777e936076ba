use super::*;
use crate::repack::{AnyLayout, Layout};
use crate::repack::{CpuFeatures, WeightUse};

/// Deterministic bytes (splitmix64).
fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) as u8
        })
        .collect()
}

fn row_bytes(l: AmxLayout, cols: usize) -> usize {
    let s = l.spec();
    cols / s.block_elements * s.source_block_bytes
}

/// Golden vectors written by ggml's own AMX packing (`scripts/amx-golden.sh`,
/// `tests/runtimes/amx_dump.cpp`): `LAYOUT.in` the GGUF-order rows, `LAYOUT.out` the packed
/// bytes, `ggml_backend_amx_get_alloc_size` of them. Checked whole ([`pack`]) and tile by tile
/// from each tile's 16 source ranges ([`tile`], [`pack_tile`]), as a proof would.
#[test]
fn matches_bytes_ggml_wrote() {
    // scripts/amx-golden.sh --check points this at vectors it has just made
    let dir = std::env::var_os("TWOFOLD_AMX_FIXTURES").map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/repack/amx"),
        std::path::PathBuf::from,
    );
    let list = std::fs::read_to_string(dir.join("MANIFEST")).unwrap();
    let mut seen = Vec::new();
    for line in list
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        // layout ggml-type rows cols via
        let f: Vec<&str> = line.split_whitespace().collect();
        let l = AmxLayout::from_name(f[0]).unwrap();
        let s = l.spec();
        assert_eq!(f[1], s.source_type, "{line}");
        assert!(matches!(f[4], "buffer" | "direct"), "{line}");
        let (rows, cols): (usize, usize) = (f[2].parse().unwrap(), f[3].parse().unwrap());
        let src = std::fs::read(dir.join(format!("{}.in", f[0]))).unwrap();
        let want = std::fs::read(dir.join(format!("{}.out", f[0]))).unwrap();
        let rb = row_bytes(l, cols);
        assert_eq!(
            packed_size(l, rows as u64, cols as u64),
            Some(want.len() as u64),
            "{line}: ggml_backend_amx_get_alloc_size"
        );
        let got = pack(l, rows, rb, &src).unwrap();
        assert_eq!(got.len(), want.len(), "{line}");
        if let Some(at) = got.iter().zip(&want).position(|(a, b)| a != b) {
            let (t, within) = tile_at(l, rows, rb, at).unwrap();
            panic!(
                "{line}: first difference at byte {at} of {} (tile {}, byte {within})",
                got.len(),
                t.index
            );
        }
        let mut out = vec![0u8; s.tile_bytes()];
        let mut t = 0;
        while let Some(tl) = tile(l, rows, rb, t) {
            let blocks: Vec<&[u8]> = tl.sources().map(|r| &src[r]).collect();
            pack_tile(l, &blocks, &mut out).unwrap();
            assert_eq!(out, want[tl.out.clone()], "{line}: tile {t}");
            t += 1;
        }
        assert_eq!(t * s.tile_bytes(), want.len(), "{line}");
        seen.push(l);
    }
    for l in AmxLayout::ALL {
        assert!(
            seen.contains(&l),
            "no golden vector for '{}'",
            l.spec().name
        );
    }
}

#[test]
fn sizes_follow_get_row_size() {
    // (layout, ggml's get_tile_size: TILE_N × (sizeof block + extra))
    let tiles = [
        (AmxLayout::Q4_0, 16 * 18),
        (AmxLayout::Q4_1, 16 * 20),
        (AmxLayout::Q8_0, 16 * (34 + 4)),
        (AmxLayout::Q4_K, 16 * (144 + 4)),
        (AmxLayout::Q5_K, 16 * (176 + 4)),
        (AmxLayout::Q6_K, 16 * 210),
        (AmxLayout::IQ4_XS, 16 * (136 + 2)),
    ];
    for (l, tb) in tiles {
        let s = l.spec();
        assert_eq!(s.tile_bytes(), tb, "{}", s.name);
        assert_eq!(AmxLayout::from_name(s.name), Some(l));
        assert_eq!(AmxLayout::from_source_type(s.source_type), Some(l));
        let id = (0..64).find(|&i| crate::gguf::ggml_type(i).map(|t| t.0) == Some(s.source_type));
        let (_, elems, bytes) = crate::gguf::ggml_type(id.unwrap()).unwrap();
        assert_eq!(
            (elems, bytes),
            (s.block_elements as u64, s.source_block_bytes as u64)
        );
    }
    // a 576 x 1536 Q8_0 weight: 576 rows of 48 blocks of 38 bytes
    assert_eq!(packed_size(AmxLayout::Q8_0, 576, 1536), Some(576 * 48 * 38));
    assert_eq!(packed_size(AmxLayout::Q4_1, 576, 1536), Some(576 * 48 * 20));
    assert_eq!(packed_size(AmxLayout::Q4_K, 576, 100), None);
    assert_eq!(packed_size(AmxLayout::Q4_0, u64::MAX, 64), None);
    let ratio = |l: AmxLayout| l.spec().ratio();
    assert_eq!(ratio(AmxLayout::Q4_1), 1.0);
    assert_eq!(ratio(AmxLayout::Q6_K), 1.0);
    assert!((ratio(AmxLayout::Q8_0) - 38.0 / 34.0).abs() < 1e-12);
    assert!((ratio(AmxLayout::Q4_K) - 148.0 / 144.0).abs() < 1e-12);
}

#[test]
fn q8_0_compensation_is_128_times_the_sum() {
    let l = AmxLayout::Q8_0;
    let mut block = [0u8; 34];
    block[2..34].copy_from_slice(&[0xff; 32]); // -1 each
    let mut other = [0u8; 34];
    other[2..34].copy_from_slice(&[0x7f; 32]); // 127 each
    let mut blocks: Vec<&[u8]> = vec![&block[..]; 16];
    blocks[3] = &other;
    let mut out = vec![0u8; l.spec().tile_bytes()];
    pack_tile(l, &blocks, &mut out).unwrap();
    let comp = |n: usize| i32::from_le_bytes(out[544 + 4 * n..548 + 4 * n].try_into().unwrap());
    assert_eq!(comp(0), -128 * 32);
    assert_eq!(comp(3), 128 * 127 * 32);
}

#[test]
fn tiles_map_output_to_file_ranges() {
    let l = AmxLayout::Q4_K;
    let (rows, cols) = (32, 768); // 2 row groups x 3 blocks
    let rb = row_bytes(l, cols);
    let tb = l.spec().tile_bytes();
    let t = tile(l, rows, rb, 4).unwrap();
    assert_eq!(
        (t.first_row, t.block, t.out.clone()),
        (16, 1, 4 * tb..5 * tb)
    );
    assert_eq!(t.source(0), 16 * rb + 144..16 * rb + 288);
    assert_eq!(t.source(15), 31 * rb + 144..31 * rb + 288);
    assert_eq!(t.sources().count(), 16);
    assert_eq!(tile(l, rows, rb, 6), None);
    let (at, within) = tile_at(l, rows, rb, 5 * tb + 7).unwrap();
    assert_eq!((at.index, within), (5, 7));
    assert!(tile_at(l, rows, rb, 6 * tb).is_none());
    // out_tile from whole rows = pack_tile from the tile's sources
    let src = bytes(3, rows * rb);
    let rows_of: Vec<&[u8]> = src[16 * rb..32 * rb].chunks_exact(rb).collect();
    let (mut a, mut b) = (vec![0u8; tb], vec![0u8; tb]);
    out_tile(l, &rows_of, 1, &mut a).unwrap();
    let blocks: Vec<&[u8]> = t.sources().map(|r| &src[r]).collect();
    pack_tile(l, &blocks, &mut b).unwrap();
    assert_eq!(a, b);
    assert_eq!(pack(l, rows, rb, &src).unwrap()[t.out], a[..]);
}

#[test]
fn refuses_wrong_shapes_in_words() {
    let l = AmxLayout::Q4_1;
    let e = pack(l, 8, 20, &[0; 8 * 20]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "'8' rows are not a multiple of '16' (layout 'amx_q4_1')"
    );
    assert!(pack(l, 16, 20, &[0; 10]).is_err());
    assert!(pack(l, 16, 19, &[0; 16 * 19]).is_err());
    let e = check_shape(AmxLayout::Q8_0, 1 << 20, 34 << 10).unwrap_err();
    assert!(matches!(e, RepackError::IndexOverflow { .. }), "{e}");
    assert!(check_shape(AmxLayout::Q8_0, usize::MAX - 15, 34 << 10).is_err());
    // the largest tensor whose last tile ggml's int offsets still reach
    let max_tiles = i32::MAX as usize / 608 + 1;
    assert_eq!(
        check_shape(AmxLayout::Q8_0, 16, max_tiles * 34),
        Ok(max_tiles)
    );
    assert!(check_shape(AmxLayout::Q8_0, 16, (max_tiles + 1) * 34).is_err());
    let row = [0u8; 40];
    let rows: Vec<&[u8]> = vec![&row[..]; 16];
    let mut out = [0u8; 320];
    assert!(out_tile(l, &rows[..15], 0, &mut out).is_err());
    assert!(out_tile(l, &rows, 2, &mut out).is_err());
    assert!(out_tile(l, &rows, 1, &mut out[..319]).is_err());
    assert!(out_tile(l, &[], 0, &mut out).is_err());
    let blocks: Vec<&[u8]> = vec![&row[..19]; 16];
    assert!(pack_tile(l, &blocks, &mut out).is_err());
    out_tile(l, &rows, 1, &mut out).unwrap();
    assert_eq!(out, [0u8; 320]);
    assert_eq!(pack(l, 0, 0, &[]).unwrap(), Vec::<u8>::new());
    assert_eq!(pack(l, 32, 0, &[]).unwrap(), Vec::<u8>::new());
    assert!(pack(l, usize::MAX, 2, &[0; 8]).is_err());
}

/// Any shape and any bytes: an answer or an error, never a panic.
#[test]
fn never_panics_on_any_shape() {
    for l in AmxLayout::ALL {
        let s = l.spec();
        for rows in [0, 1, 15, 16, 17, 32] {
            for blocks in [0, 1, 2] {
                for rb in [
                    blocks * s.source_block_bytes,
                    blocks * s.source_block_bytes + 1,
                ] {
                    let src = bytes((rows * 31 + rb) as u64, rows * rb);
                    if let Ok(out) = pack(l, rows, rb, &src) {
                        assert_eq!(
                            out.len() as u64,
                            (rows * blocks) as u64 * s.packed_block_bytes() as u64
                        );
                    }
                    for t in [0, 1, usize::MAX] {
                        let _ = tile(l, rows, rb, t);
                        let _ = tile_at(l, rows, rb, t);
                    }
                    let group: Vec<&[u8]> = src.chunks(rb.max(1)).take(16).collect();
                    let mut out = vec![0u8; s.tile_bytes()];
                    let _ = out_tile(l, &group, 0, &mut out);
                    let _ = out_tile(l, &group, usize::MAX, &mut out);
                }
            }
        }
    }
}

#[test]
fn choice_follows_supports_op() {
    use WeightUse::*;
    let spr = CpuFeatures::from_variant("sapphirerapids", 0).unwrap();
    assert!(spr.amx && spr.avx512 && spr.avx2);
    let skx = CpuFeatures::from_variant("skylakex", 0).unwrap();
    assert!(!skx.amx);
    let c = |t, ne0, ne1, u| choose(t, ne0, ne1, u, &spr);
    assert_eq!(
        c("Q4_1", 576, 1536, MulMat),
        Some(AmxChoice::Packed(AmxLayout::Q4_1))
    );
    assert_eq!(
        c("Q4_1", 576, 49152, TiedOutput),
        Some(AmxChoice::Packed(AmxLayout::Q4_1))
    );
    assert_eq!(
        c("Q6_K", 1536, 576, MulMat),
        Some(AmxChoice::Packed(AmxLayout::Q6_K))
    );
    assert_eq!(c("F16", 576, 1536, MulMat), Some(AmxChoice::Copied));
    // rows (the op's ne[0]) must be a multiple of 32
    assert_eq!(c("Q4_0", 576, 1552, MulMat), None);
    // columns: 32 for the 32-element types, 256 for the K-quants and IQ4_XS
    assert_eq!(
        c("Q4_0", 96, 64, MulMat),
        Some(AmxChoice::Packed(AmxLayout::Q4_0))
    );
    assert_eq!(c("Q4_K", 576, 64, MulMat), None);
    assert_eq!(
        c("IQ4_XS", 768, 64, MulMat),
        Some(AmxChoice::Packed(AmxLayout::IQ4_XS))
    );
    assert_eq!(c("Q4_1", 576, 1536, MulMatId), None);
    assert_eq!(c("Q4_1", 576, 1536, GetRows), None);
    assert_eq!(c("Q4_1", 576, 1536, Other), None);
    assert_eq!(c("IQ4_NL", 576, 1536, MulMat), None);
    assert_eq!(c("BF16", 576, 1536, MulMat), None);
    assert_eq!(choose("Q4_1", 576, 1536, MulMat, &skx), None);
    // where AMX declines, CPU_REPACK (listed after it) decides
    assert_eq!(
        crate::repack::choose("Q4_0", 1552, &spr),
        Some(crate::repack::Choice::Layout(Layout::Q4_0_8x8))
    );
}

#[test]
fn any_layout_names_both_buffers() {
    let a = AnyLayout::from_name("amx_q4_1").unwrap();
    assert_eq!(a, AnyLayout::Amx(AmxLayout::Q4_1));
    assert_eq!(a.source_type(), "Q4_1");
    assert_eq!(
        a.describe(),
        "repacked by llama.cpp's AMX backend (Q4_1 → amx_q4_1)"
    );
    let r = AnyLayout::from_name("q4_0_8x8").unwrap();
    assert_eq!(r, AnyLayout::Repack(Layout::Q4_0_8x8));
    assert_eq!(
        r.describe(),
        "repacked by llama.cpp's CPU backend (Q4_0 → q4_0_8x8)"
    );
    assert_eq!(r.out_bytes(16, 64), Some(16 * 2 * 18));
    assert_eq!(
        AnyLayout::Amx(AmxLayout::Q8_0).out_bytes(16, 64),
        Some(16 * 2 * 38)
    );
    assert_eq!(AnyLayout::from_name("amx_q4_2"), None);
    for l in AmxLayout::ALL {
        assert_eq!(AnyLayout::from_name(l.spec().name), Some(AnyLayout::Amx(l)));
    }
    for l in Layout::ALL {
        assert_eq!(
            AnyLayout::from_name(l.spec().name).map(|a| a.name()),
            Some(l.spec().name)
        );
    }
}

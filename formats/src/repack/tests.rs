use super::*;

/// Deterministic bytes (splitmix64) for the tests that need no bytes from ggml.
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

/// ggml's `make_block_*` for the simple layouts, index by index as the C loop runs:
/// headers, then `end = R·quant_bytes / C` chunks, chunk `i` from row `i % R` at offset
/// `(i / R)·C` of its quants, XORed for `Q4_0`.
fn reference_simple(s: &Spec, blocks: &[&[u8]]) -> Vec<u8> {
    let h = s.header_bytes;
    let q = s.source_block_bytes - h;
    let mut out = vec![0u8; s.out_block_bytes()];
    for (i, b) in blocks.iter().enumerate() {
        out[i * h..i * h + h].copy_from_slice(&b[..h]);
    }
    let end = s.rows * q / s.chunk_bytes;
    for i in 0..end {
        let src_id = i % s.rows;
        let src_offset = (i / s.rows) * s.chunk_bytes;
        let dst_offset = s.rows * h + i * s.chunk_bytes;
        for k in 0..s.chunk_bytes {
            out[dst_offset + k] = blocks[src_id][h + src_offset + k] ^ s.xor;
        }
    }
    out
}

/// ggml's `make_block_q4_Kx8`, statement by statement.
fn reference_q4_k(chunk: usize, blocks: &[&[u8]]) -> Vec<u8> {
    let mut out = vec![0u8; 1152];
    for i in 0..8 {
        out[2 * i..2 * i + 2].copy_from_slice(&blocks[i][0..2]);
        out[16 + 2 * i..16 + 2 * i + 2].copy_from_slice(&blocks[i][2..4]);
    }
    let scales = |j: usize, k: usize| blocks[j][4 + k];
    let qs_at = 16 + 16 + 96;
    for i in 0..(256 * 4 / chunk) {
        let (src_id, src_offset) = (i % 8, (i / 8) * chunk);
        for k in 0..chunk {
            out[qs_at + i * chunk + k] = blocks[src_id][16 + src_offset + k];
        }
    }
    let mut put = |base: usize, s: &[u8; 8], m: &[u8; 8]| {
        for k in 0..4 {
            out[32 + base + k] = (s[k] & 63) + ((s[k + 4] & 48) << 2);
            out[32 + base + 4 + k] = (m[k] & 63) + ((m[k + 4] & 48) << 2);
            out[32 + base + 8 + k] = (s[k + 4] & 15) + ((m[k + 4] & 15) << 4);
        }
    };
    for i in 0..4 {
        let (mut s, mut m) = ([0u8; 8], [0u8; 8]);
        for j in 0..8 {
            s[j] = scales(j, i) & 63;
            m[j] = scales(j, i + 4) & 63;
        }
        put(i * 12, &s, &m);
    }
    for i in 0..4 {
        let (mut s, mut m) = ([0u8; 8], [0u8; 8]);
        for j in 0..8 {
            s[j] = ((scales(j, i) & 192) >> 2) | (scales(j, i + 8) & 15);
            m[j] = ((scales(j, i + 4) & 192) >> 2) | ((scales(j, i + 8) & 240) >> 4);
        }
        put(i * 12 + 48, &s, &m);
    }
    out
}

#[test]
fn every_layout_matches_the_transcribed_make_block() {
    for l in Layout::ALL {
        let s = l.spec();
        let src = bytes(l as u64 + 1, s.out_block_bytes());
        let blocks: Vec<&[u8]> = src.chunks_exact(s.source_block_bytes).collect();
        let mut out = vec![0u8; s.out_block_bytes()];
        interleave(l, &blocks, &mut out).unwrap();
        let want = if s.source_type == "Q4_K" {
            reference_q4_k(s.chunk_bytes, &blocks)
        } else {
            reference_simple(&s, &blocks)
        };
        assert_eq!(out, want, "{}", s.name);
    }
}

#[test]
fn registry_matches_the_block_structs_of_repack_h() {
    let size = |name: &str| Layout::from_name(name).unwrap().spec().out_block_bytes();
    // sizeof() of the structs, from their static_asserts in ggml-cpu/repack.h
    assert_eq!(size("q4_0_4x4"), 4 * 2 + 32 * 2);
    assert_eq!(size("q4_0_8x8"), 8 * 2 + 32 * 4);
    assert_eq!(size("q4_K_8x8"), 2 * 16 + 12 * 8 + 256 * 4);
    assert_eq!(size("iq4_nl_8x8"), 8 * 2 + 32 * 4);
    assert_eq!(size("mxfp4_8x8"), 8 + 32 * 4);
    assert_eq!(size("q8_0_4x8"), 4 * 2 + 32 * 4);
    for l in Layout::ALL {
        let s = l.spec();
        assert_eq!(Layout::from_name(s.name), Some(l));
        let id = (0..64).find(|&i| crate::gguf::ggml_type(i).map(|t| t.0) == Some(s.source_type));
        let (_, elems, bytes) = crate::gguf::ggml_type(id.unwrap()).unwrap();
        assert_eq!(
            (elems, bytes),
            (s.block_elements as u64, s.source_block_bytes as u64)
        );
    }
}

#[test]
fn q4_k_scales_round_trip() {
    for seed in 0..64 {
        let b = bytes(seed, 12);
        let q: [u8; 12] = b.as_slice().try_into().unwrap();
        let pairs: [(u8, u8); 8] = std::array::from_fn(|j| q4_k::unpack(&q, j));
        assert_eq!(q4_k::pack(&pairs), q);
    }
}

#[test]
fn output_order_is_row_groups_then_columns() {
    let l = Layout::Q4_0_8x8;
    let (rows, per_row) = (16, 3);
    let row_bytes = per_row * 18;
    let src = bytes(7, rows * row_bytes);
    let out = repack(l, rows, row_bytes, &src).unwrap();
    let ob = l.spec().out_block_bytes();
    for (i, got) in out.chunks_exact(ob).enumerate() {
        let (first, x) = ((i / per_row) * 8, i % per_row);
        let group: Vec<&[u8]> = (first..first + 8)
            .map(|r| &src[r * row_bytes..(r + 1) * row_bytes])
            .collect();
        let mut want = vec![0u8; ob];
        out_block(l, &group, x, &mut want).unwrap();
        assert_eq!(got, want);
        assert_eq!(origin(l, row_bytes, i * ob + 5), Some((first, x, 5)));
    }
}

#[test]
fn refuses_wrong_shapes_in_words() {
    let l = Layout::Q4_0_8x8;
    let e = repack(l, 12, 18, &[0; 12 * 18]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "'12' rows are not a multiple of '8' (layout 'q4_0_8x8')"
    );
    assert!(repack(l, 8, 18, &[0; 10]).is_err());
    assert!(repack(l, 8, 17, &[0; 8 * 17]).is_err());
    let row = [0u8; 36];
    let rows: Vec<&[u8]> = vec![&row[..]; 8];
    let mut out = [0u8; 144];
    assert!(out_block(l, &rows[..7], 0, &mut out).is_err());
    assert!(out_block(l, &rows, 2, &mut out).is_err());
    assert!(out_block(l, &rows, 1, &mut out[..143]).is_err());
    out_block(l, &rows, 1, &mut out).unwrap();
    assert_eq!(out[16..], [0x88; 128]);
    assert_eq!(origin(l, 0, 0), None);
    assert_eq!(origin(l, 17, 0), None);
    assert_eq!(repack(l, 0, 0, &[]).unwrap(), Vec::<u8>::new());
    assert_eq!(
        repack(l, 0, usize::MAX / 36 * 18, &[]).unwrap(),
        Vec::<u8>::new()
    );
    assert!(repack(l, 16, 0, &[]).unwrap().is_empty());
    assert!(repack(l, usize::MAX, 2, &[0; 8]).is_err());
}

/// Any shape and any bytes: an answer or an error, never a panic.
#[test]
fn never_panics_on_any_shape() {
    for l in Layout::ALL {
        for rows in [0, 1, 4, 7, 8, 9, 16] {
            for row_bytes in [0, 1, 17, 18, 34, 36, 144, 288] {
                let src = bytes(rows as u64 ^ row_bytes as u64, rows * row_bytes);
                if let Ok(out) = repack(l, rows, row_bytes, &src) {
                    assert_eq!(out.len(), src.len());
                }
                let _ = origin(l, row_bytes, rows * row_bytes);
                let group: Vec<&[u8]> = src.chunks(row_bytes.max(1)).take(8).collect();
                let mut out = vec![0u8; l.spec().out_block_bytes()];
                let _ = out_block(l, &group, 0, &mut out);
            }
        }
    }
}

#[test]
fn choice_follows_ggml_by_build_and_rows() {
    let avx2 = CpuFeatures::X86_AVX2;
    let c = |t, r, cpu: &CpuFeatures| choose(t, r, cpu);
    assert_eq!(
        c("Q4_0", 576, &avx2),
        Some(Choice::Layout(Layout::Q4_0_8x8))
    );
    assert_eq!(c("Q4_0", 12, &avx2), None);
    assert_eq!(c("Q4_K", 64, &avx2), Some(Choice::Layout(Layout::Q4_K_8x8)));
    assert_eq!(
        c("IQ4_NL", 64, &avx2),
        Some(Choice::Layout(Layout::IQ4_NL_8x8))
    );
    assert_eq!(
        c("MXFP4", 64, &avx2),
        Some(Choice::Layout(Layout::MXFP4_8x8))
    );
    assert_eq!(c("Q8_0", 64, &avx2), None);
    assert_eq!(c("Q6_K", 64, &avx2), None);
    assert_eq!(c("Q2_K", 64, &avx2), None);
    let skx = CpuFeatures::from_variant("skylakex", 0).unwrap();
    assert_eq!(c("Q2_K", 64, &skx), Some(Choice::Unmodelled("q2_K_8x8")));
    assert_eq!(CpuFeatures::from_variant("haswell", 0), Some(avx2));
    let m2 = CpuFeatures::from_variant("apple_m2_m3", 0).unwrap();
    assert_eq!(c("Q4_0", 64, &m2), Some(Choice::Layout(Layout::Q4_0_4x8)));
    assert_eq!(c("Q4_0", 12, &m2), Some(Choice::Layout(Layout::Q4_0_4x8)));
    assert_eq!(c("Q8_0", 12, &m2), Some(Choice::Layout(Layout::Q8_0_4x8)));
    assert_eq!(c("Q4_K", 64, &m2), Some(Choice::Layout(Layout::Q4_K_8x8)));
    assert_eq!(c("Q6_K", 64, &m2), Some(Choice::Unmodelled("q6_K_8x8")));
    let m1 = CpuFeatures::from_variant("apple_m1", 0).unwrap();
    assert_eq!(c("Q4_0", 12, &m1), Some(Choice::Layout(Layout::Q4_0_4x4)));
    assert_eq!(c("Q4_K", 64, &m1), Some(Choice::Layout(Layout::Q4_K_8x4)));
    assert_eq!(
        c("IQ4_NL", 12, &m1),
        Some(Choice::Layout(Layout::IQ4_NL_4x4))
    );
    assert_eq!(c("MXFP4", 12, &m1), Some(Choice::Layout(Layout::MXFP4_4x4)));
    let sve = CpuFeatures::from_variant("armv8.6_1", 32).unwrap();
    assert_eq!(c("Q4_0", 64, &sve), Some(Choice::Layout(Layout::Q4_0_8x8)));
    let sve128 = CpuFeatures::from_variant("armv8.6_1", 16).unwrap();
    assert_eq!(
        c("Q4_0", 64, &sve128),
        Some(Choice::Layout(Layout::Q4_0_4x8))
    );
    assert_eq!(CpuFeatures::from_variant("nonesuch", 0), None);
    assert_eq!(layouts_for("Q4_0", 576, 576, &avx2), vec![Layout::Q4_0_8x8]);
    assert_eq!(layouts_for("Q4_0", 576, 100, &avx2), vec![]);
    assert_eq!(layouts_for("F16", 576, 576, &avx2), vec![]);
}

#[test]
fn weight_use_follows_llama_arch() {
    use WeightUse::*;
    assert_eq!(weight_use("blk.0.attn_q.weight", 2, true), MulMat);
    assert_eq!(weight_use("output.weight", 2, true), MulMat);
    assert_eq!(weight_use("blk.3.ffn_gate_exps.weight", 3, true), MulMatId);
    assert_eq!(weight_use("token_embd.weight", 2, true), GetRows);
    assert_eq!(weight_use("token_embd.weight", 2, false), TiedOutput);
    assert_eq!(weight_use("per_layer_token_embd.weight", 2, false), GetRows);
    assert_eq!(weight_use("enc.blk.0.attn_rel_b.weight", 2, true), GetRows);
    assert_eq!(weight_use("blk.0.attn_norm.weight", 1, true), Other);
    assert_eq!(weight_use("blk.0.attn_q.bias", 1, true), Other);
    assert!(MulMat.may_repack() && TiedOutput.may_repack() && !GetRows.may_repack());
}

/// Golden vectors written by ggml itself (`scripts/repack-golden.sh`: an x86 AVX2 build
/// without AMX, `tests/runtimes/repack_dump.cpp`): `LAYOUT.in` the GGUF-order rows,
/// `LAYOUT.out` ggml's repacked bytes, for every layout. Those made through the CPU_REPACK
/// buffer (`buffer`) are the ones ggml chose on that build (the script checks ggml's log),
/// and [`choose`] must make the same choice; the others (`direct`) it must not.
#[test]
fn matches_bytes_ggml_wrote() {
    // scripts/repack-golden.sh --check points this at vectors it has just made
    let dir = std::env::var_os("TWOFOLD_REPACK_FIXTURES").map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/repack"),
        std::path::PathBuf::from,
    );
    let list = std::fs::read_to_string(dir.join("MANIFEST")).unwrap();
    let mut seen = Vec::new();
    for line in list
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        // layout ggml-type rows cols via; the files are LAYOUT.in and LAYOUT.out
        let f: Vec<&str> = line.split_whitespace().collect();
        let l = Layout::from_name(f[0]).unwrap();
        let (rows, cols): (usize, usize) = (f[2].parse().unwrap(), f[3].parse().unwrap());
        assert_eq!(f[1], l.spec().source_type, "{line}");
        let src = std::fs::read(dir.join(format!("{}.in", f[0]))).unwrap();
        let want = std::fs::read(dir.join(format!("{}.out", f[0]))).unwrap();
        let s = l.spec();
        let row_bytes = cols / s.block_elements * s.source_block_bytes;
        let got = repack(l, rows, row_bytes, &src).unwrap();
        assert_eq!(got.len(), want.len(), "{line}");
        if let Some(at) = got.iter().zip(&want).position(|(a, b)| a != b) {
            panic!("{line}: first difference at byte {at} of {}", got.len());
        }
        // "buffer": ggml chose the layout on its x86 AVX2 build, as `choose` does
        let x86 = choose(s.source_type, rows as u64, &CpuFeatures::X86_AVX2);
        assert_eq!(x86 == Some(Choice::Layout(l)), f[4] == "buffer", "{line}");
        seen.push(l);
    }
    for l in Layout::ALL {
        assert!(
            seen.contains(&l),
            "no golden vector for '{}'",
            l.spec().name
        );
    }
}

#![allow(clippy::unwrap_used)]

use super::*;

/// Vectors from `scripts/convert-golden.py`: NumPy's and PyTorch's (or ml_dtypes')
/// conversions of edge values and random ones, NaNs left out.
const GOLDEN: &str = include_str!("../testdata/convert-golden.json");

fn golden() -> serde_json::Value {
    serde_json::from_str(GOLDEN).unwrap()
}

fn list(g: &serde_json::Value, k: &str) -> Vec<u32> {
    g[k].as_array()
        .unwrap_or_else(|| panic!("no '{k}' in the golden vectors"))
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

fn check(from: &[u32], want: &[u32], f: impl Fn(u32) -> u32, what: &str) {
    assert_eq!(from.len(), want.len(), "{what}");
    for (x, w) in from.iter().zip(want) {
        assert_eq!(f(*x), *w, "{what}: {x:#x} gave {:#x}, want {w:#x}", f(*x));
    }
}

#[test]
fn narrowing_matches_numpy_and_torch() {
    let g = golden();
    let f32s = list(&g, "f32");
    check(
        &f32s,
        &list(&g, "f32_to_f16_numpy"),
        |x| u32::from(f32_to_f16(x)),
        "f32→f16 numpy",
    );
    if g.get("f32_to_f16_torch").is_some() {
        check(
            &f32s,
            &list(&g, "f32_to_f16_torch"),
            |x| u32::from(f32_to_f16(x)),
            "f32→f16 torch",
        );
    }
    check(
        &f32s,
        &list(&g, "f32_to_bf16"),
        |x| u32::from(f32_to_bf16(x)),
        "f32→bf16",
    );
}

#[test]
fn widening_and_16_bit_conversions_match() {
    let g = golden();
    let f16s = list(&g, "f16");
    let bf16s = list(&g, "bf16");
    check(
        &f16s,
        &list(&g, "f16_to_f32_numpy"),
        |h| f16_to_f32(h as u16),
        "f16→f32",
    );
    check(
        &f16s,
        &list(&g, "f16_to_bf16"),
        |h| u32::from(f32_to_bf16(f16_to_f32(h as u16))),
        "f16→bf16",
    );
    check(
        &bf16s,
        &list(&g, "bf16_to_f16"),
        |h| u32::from(f32_to_f16(bf16_to_f32(h as u16))),
        "bf16→f16",
    );
}

#[test]
fn widening_is_exact_for_every_f16() {
    for h in 0..=u16::MAX {
        let v = f32::from_bits(f16_to_f32(h));
        if v.is_nan() {
            assert_eq!(f16_to_f32(h) & 0x7fc0_0000, 0x7fc0_0000, "{h:#x}");
            continue;
        }
        // Narrowing an exact F16 value gives it back.
        assert_eq!(f32_to_f16(f16_to_f32(h)), h, "{h:#x}");
    }
}

#[test]
fn edge_values_by_hand() {
    let f = |v: f32| f32_to_f16(v.to_bits());
    assert_eq!(f(65504.0), 0x7bff);
    assert_eq!(f(65519.99), 0x7bff);
    assert_eq!(
        f(65520.0),
        0x7c00,
        "halfway past the largest F16 rounds to inf"
    );
    assert_eq!(f(-1e9), 0xfc00);
    assert_eq!(
        f(2f32.powi(-25)),
        0,
        "half the smallest subnormal: ties to even, 0"
    );
    assert_eq!(f(2f32.powi(-25) * 1.5), 1);
    assert_eq!(f(2f32.powi(-24)), 1);
    assert_eq!(f(-0.0), 0x8000);
    assert_eq!(f(1.0 + 2f32.powi(-11)), 0x3c00, "tie to even, down");
    assert_eq!(f(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02, "tie to even, up");
    assert_eq!(
        f32_to_f16(0x7f80_0001) & 0x7e00,
        0x7e00,
        "a NaN stays a NaN, quiet"
    );
    let b = |v: f32| f32_to_bf16(v.to_bits());
    assert_eq!(b(f32::MAX), 0x7f80, "rounds past the largest BF16: inf");
    assert_eq!(b(1.0 + 2f32.powi(-8)), 0x3f80);
    assert_eq!(b(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
    // NaN to BF16 as PyTorch's CPU kernels write it, whatever the sign.
    assert_eq!(f32_to_bf16(0xffc0_0001), 0xffff);
    assert_eq!(f32_to_bf16(0x7fc0_0000), 0xffff);
}

#[test]
fn the_registry_names_ratios_and_sources() {
    assert_eq!(Conversion::F32ToF16.ratio(), (1, 2));
    assert_eq!(Conversion::F16ToF32.ratio(), (2, 1));
    assert_eq!(Conversion::Bf16ToF16.ratio(), (1, 1));
    assert_eq!(Conversion::F32ToBf16.name(), "F32→BF16");
    let of = |d: Dtype| Conversion::of(&d).collect::<Vec<_>>();
    assert_eq!(
        of(Dtype::F32),
        [Conversion::F32ToF16, Conversion::F32ToBf16]
    );
    assert_eq!(
        of(Dtype::F16),
        [Conversion::F16ToF32, Conversion::F16ToBf16]
    );
    assert_eq!(
        of(Dtype::BF16),
        [Conversion::Bf16ToF32, Conversion::Bf16ToF16]
    );
    assert!(of(Dtype::I8).is_empty());
    let json = serde_json::to_string(&Conversion::Bf16ToF16).unwrap();
    assert_eq!(json, "\"bf16_to_f16\"");
}

#[test]
fn convert_works_on_whole_elements() {
    let mut out = vec![9u8; 3];
    let src: Vec<u8> = [1.0f32, -2.0, 65520.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    Conversion::F32ToF16.convert(&src, &mut out);
    assert_eq!(out, [0x00, 0x3c, 0x00, 0xc0, 0x00, 0x7c]);
    Conversion::F16ToF32.convert(&out[..4], &mut out.clone());
    let mut wide = Vec::new();
    Conversion::F16ToF32.convert(&[0x00, 0x3c, 0x01], &mut wide);
    assert_eq!(wide, 1.0f32.to_le_bytes(), "a trailing part is ignored");
    Conversion::Bf16ToF16.convert(&[0x80, 0x3f, 0x80, 0x47], &mut out);
    assert_eq!(
        out,
        [0x00, 0x3c, 0x00, 0x7c],
        "BF16 65536 is past the largest F16"
    );
}

//! Which layout ggml picks: `ggml_repack_get_optimal_repack_type` in `ggml-cpu/repack.cpp`
//! (the CPU features and the row count), `extra_buffer_type::supports_op` there (only the
//! weight of a `MUL_MAT` with 2 dimensions or of a `MUL_MAT_ID` with 3), and llama.cpp's
//! choice of the op each weight is placed for (`LLM_TENSOR_INFOS` in `src/llama-arch.cpp`,
//! `TENSOR_DUPLICATED` in `src/llama-model-loader.cpp`).
//!
//! The features are those **the ggml-cpu build was compiled for** (`ggml_cpu_has_avx2()` is
//! `#if defined(__AVX2__)`), not the host's: a build with `GGML_NATIVE=OFF` and only AVX2
//! picks the AVX2 layouts on an AVX-512 machine. Builds with `GGML_BACKEND_DL` and
//! `GGML_CPU_ALL_VARIANTS` (release packages) load the best `libggml-cpu-VARIANT.so` for the
//! host, and [`CpuFeatures::from_variant`] maps that name to its features. The SVE vector
//! length is the one thing read at run time (`ggml_cpu_get_sve_cnt`).

use super::Layout;

/// The CPU features ggml's repack choice depends on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuFeatures {
    /// x86 `__AVX2__`.
    pub avx2: bool,
    /// x86 `__AVX512F__`.
    pub avx512: bool,
    /// ARM `__ARM_NEON`.
    pub neon: bool,
    /// ARM `__ARM_FEATURE_DOTPROD`.
    pub dotprod: bool,
    /// ARM `__ARM_FEATURE_MATMUL_INT8` (i8mm).
    pub i8mm: bool,
    /// ARM SVE vector length in bytes (`ggml_cpu_get_sve_cnt`), 0 without SVE.
    pub sve_bytes: u32,
    /// s390x vector extensions (`ggml_cpu_has_vxe`).
    pub vxe: bool,
    /// x86 `__AMX_INT8__` with `__AVX512VNNI__` (ggml-cpu then has an `AMX` buffer, listed
    /// before `CPU_REPACK`: [`super::amx::choose`]), on a host whose kernel grants AMX state.
    pub amx: bool,
}

impl CpuFeatures {
    /// An x86-64 build with AVX2 and without AVX-512 (`GGML_NATIVE=OFF -DGGML_AVX2=ON`; the
    /// `haswell` variant), the build the tests here ran.
    pub const X86_AVX2: CpuFeatures = CpuFeatures {
        avx2: true,
        avx512: false,
        neon: false,
        dotprod: false,
        i8mm: false,
        sve_bytes: 0,
        vxe: false,
        amx: false,
    };

    /// The features of one of ggml's CPU backend variants (`ggml_add_cpu_backend_variant`
    /// in `ggml/src/CMakeLists.txt`; the library is `libggml-cpu-VARIANT.so`), with the SVE
    /// length `sve_bytes` of the host for the SVE variants. `None` for a name not known here.
    pub fn from_variant(variant: &str, sve_bytes: u32) -> Option<CpuFeatures> {
        let x86 = |avx2, avx512| CpuFeatures {
            avx2,
            avx512,
            ..CpuFeatures::default()
        };
        let amx = CpuFeatures {
            amx: true,
            ..x86(true, true)
        };
        let arm = |dotprod, i8mm, sve| CpuFeatures {
            neon: true,
            dotprod,
            i8mm,
            sve_bytes: if sve { sve_bytes } else { 0 },
            ..CpuFeatures::default()
        };
        let v = variant.strip_prefix("android_").unwrap_or(variant);
        Some(match v {
            "x64" | "sse42" | "sandybridge" | "ivybridge" | "piledriver" => x86(false, false),
            "haswell" | "alderlake" => x86(true, false),
            "skylakex" | "cannonlake" | "cascadelake" | "icelake" | "cooperlake" | "zen4" => {
                x86(true, true)
            }
            // the one variant built with GGML_AMX_INT8 (ggml/src/CMakeLists.txt)
            "sapphirerapids" => amx,
            "armv8.0_1" => arm(false, false, false),
            "armv8.2_1" | "armv8.2_2" | "apple_m1" => arm(true, false, false),
            "armv8.2_3" => arm(true, false, true),
            "armv8.6_1" if variant.starts_with("android_") => arm(true, true, false),
            "armv8.6_1" | "armv8.6_2" | "armv9.2_1" | "armv9.2_2" => arm(true, true, true),
            "armv9.0_1" => arm(true, true, true),
            "apple_m2_m3" | "apple_m4" => arm(true, true, false),
            _ => return None,
        })
    }
}

/// What ggml does with a tensor of some type and shape on some build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// This layout, which [`super::out_block`] recomputes.
    Layout(Layout),
    /// A layout ggml has that is not modelled here (`q2_K_8x8`, `q5_K_8x4`...): a copy
    /// exists but cannot be proven byte by byte.
    Unmodelled(&'static str),
}

/// The layout `ggml_repack_get_optimal_repack_type` gives a tensor of `tensor_type` (as
/// [`crate::gguf::ggml_type`] names it) with `ne1` rows (ggml's `ne[1]`; for a 3-D tensor
/// of experts, the rows of one expert), or `None` where ggml does not repack it. It does
/// not check that the tensor is a matrix weight: see [`weight_use`].
pub fn choose(tensor_type: &str, ne1: u64, cpu: &CpuFeatures) -> Option<Choice> {
    use Choice::{Layout as L, Unmodelled as U};
    let by8 = ne1 % 8 == 0;
    let by4 = ne1 % 4 == 0;
    let (neon_i8mm, neon_dot) = (cpu.neon && cpu.i8mm, cpu.neon && cpu.dotprod);
    let pick = |rules: &[(bool, Choice)]| rules.iter().find(|(ok, _)| *ok).map(|&(_, c)| c);
    match tensor_type {
        "Q4_0" => pick(&[
            (
                (cpu.avx2 || (cpu.i8mm && cpu.sve_bytes == 32)) && by8,
                L(Layout::Q4_0_8x8),
            ),
            (neon_i8mm && by4, L(Layout::Q4_0_4x8)),
            (neon_dot && by4, L(Layout::Q4_0_4x4)),
            (cpu.vxe && by4, L(Layout::Q4_0_4x4)),
        ]),
        "Q4_K" => pick(&[
            ((cpu.avx2 || neon_i8mm) && by8, L(Layout::Q4_K_8x8)),
            (neon_dot && by8, L(Layout::Q4_K_8x4)),
        ]),
        "Q2_K" => pick(&[(cpu.avx512 && by8, U("q2_K_8x8"))]),
        "Q5_K" => pick(&[
            (neon_i8mm && by8, U("q5_K_8x8")),
            (neon_dot && by8, U("q5_K_8x4")),
        ]),
        "Q6_K" => pick(&[
            (neon_i8mm && by8, U("q6_K_8x8")),
            (neon_dot && by8, U("q6_K_8x4")),
        ]),
        "IQ4_NL" => pick(&[
            (cpu.avx2 && by8, L(Layout::IQ4_NL_8x8)),
            (neon_dot && by4, L(Layout::IQ4_NL_4x4)),
        ]),
        "MXFP4" => pick(&[
            (cpu.avx2 && by8, L(Layout::MXFP4_8x8)),
            (neon_dot && by4, L(Layout::MXFP4_4x4)),
        ]),
        "Q8_0" => pick(&[
            (neon_i8mm && by4, L(Layout::Q8_0_4x8)),
            (neon_dot && by4, L(Layout::Q8_0_4x4)),
        ]),
        "Q1_0" => pick(&[
            (neon_i8mm && by4, U("q1_0_4x8")),
            (neon_dot && by4, U("q1_0_4x4")),
        ]),
        _ => None,
    }
}

/// The modelled layouts ggml picks for a `rows` × `cols` matrix weight of `tensor_type` on
/// a build with `cpu`: empty where it does not repack it (or repacks it into a layout not
/// modelled here, see [`choose`]), else the one layout (ggml picks one per tensor and build).
/// `cols` must be a whole number of blocks, as in any valid tensor.
pub fn layouts_for(tensor_type: &str, rows: u64, cols: u64, cpu: &CpuFeatures) -> Vec<Layout> {
    match choose(tensor_type, rows, cpu) {
        Some(Choice::Layout(l)) if cols % l.spec().block_elements as u64 == 0 => vec![l],
        _ => Vec::new(),
    }
}

/// The op llama.cpp places a weight for, which decides whether the repack buffer may hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightUse {
    /// A matrix weight of `MUL_MAT` (2 dimensions): repacked where [`choose`] gives a layout.
    MulMat,
    /// A 3-D tensor of experts for `MUL_MAT_ID`: repacked likewise, expert by expert.
    MulMatId,
    /// Rows looked up by token (`GET_ROWS`: `token_embd`, `position_embd`...): never repacked.
    GetRows,
    /// `token_embd` of a model without `output.weight`: the input lookup reads the file's
    /// bytes, and llama.cpp loads the tensor a second time as the tied output
    /// (`TENSOR_DUPLICATED`), placed for `MUL_MAT`: that copy is repacked like [`MulMat`].
    ///
    /// [`MulMat`]: WeightUse::MulMat
    TiedOutput,
    /// Anything else (norms, biases, 1-D or 4-D tensors): never repacked.
    Other,
}

impl WeightUse {
    /// Whether ggml's repack buffer may hold a copy of the tensor (if its type and rows have
    /// a layout on the build: [`choose`]).
    pub fn may_repack(self) -> bool {
        matches!(
            self,
            WeightUse::MulMat | WeightUse::MulMatId | WeightUse::TiedOutput
        )
    }
}

/// Names (after any `blk.N.` prefix, before `.weight`) that llama.cpp reads with `GET_ROWS`
/// (`LLM_TENSOR_INFOS` in `src/llama-arch.cpp`, llama.cpp `0c1e570`).
const GET_ROWS: [&str; 7] = [
    "token_embd",
    "position_embd",
    "token_types",
    "per_layer_token_embd",
    "nextn.embed_tokens",
    "attn_rel_b",
    "d2t",
];

/// How llama.cpp uses the GGUF tensor `name` with `n_dims` dimensions in a model that has an
/// `output.weight` tensor or not. A name-based reading of `LLM_TENSOR_INFOS` that holds for
/// the common architectures; an unusual op (a convolution weight of 2 dimensions) is taken
/// for `MUL_MAT`, which only errs towards looking for a copy that is not there.
pub fn weight_use(name: &str, n_dims: usize, has_output_weight: bool) -> WeightUse {
    let base = name.strip_suffix(".weight").unwrap_or(name);
    let base = strip_layer(base);
    if base == "token_embd" && !has_output_weight && n_dims == 2 {
        return WeightUse::TiedOutput;
    }
    if GET_ROWS.contains(&base) {
        return WeightUse::GetRows;
    }
    if !name.ends_with(".weight") {
        return WeightUse::Other;
    }
    match n_dims {
        2 => WeightUse::MulMat,
        3 if base.contains("_exps") => WeightUse::MulMatId,
        _ => WeightUse::Other,
    }
}

/// `blk.12.ffn_down` → `ffn_down`; `enc.blk.3.attn_rel_b` → `attn_rel_b`.
fn strip_layer(base: &str) -> &str {
    let rest = base
        .strip_prefix("enc.")
        .or_else(|| base.strip_prefix("dec."))
        .unwrap_or(base);
    match rest.strip_prefix("blk.") {
        Some(r) => r.split_once('.').map_or(r, |(_, tail)| tail),
        None => rest,
    }
}

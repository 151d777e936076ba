//! The pass kernel, in WGSL, turned into SPIR-V by naga at run time (about a
//! millisecond). Every invocation walks 16-byte elements with a grid stride and adds the
//! two sums of [`crate::types::Checksum`] into a result buffer with atomics.

/// The WGSL source. `base_word` is the index of the range's first u32 word in the
/// working set (mod 2^32), `n_vec4` the number of 16-byte elements to read.
pub const WGSL: &str = r#"
struct Params {
    base_word: u32,
    n_vec4: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<storage, read> data: array<vec4<u32>>;
@group(0) @binding(1) var<uniform> params: Params;
@group(0) @binding(2) var<storage, read_write> result: array<atomic<u32>, 2>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>,
        @builtin(num_workgroups) groups: vec3<u32>) {
    let stride = groups.x * 256u;
    let n = params.n_vec4;
    var s = vec4<u32>(0u);
    var w = vec4<u32>(0u);
    var j = gid.x;
    loop {
        if (j >= n) { break; }
        let v = data[j];
        let k0 = 2u * (params.base_word + 4u * j) + 1u;
        s = s + v;
        w = w + v * vec4<u32>(k0, k0 + 2u, k0 + 4u, k0 + 6u);
        j = j + stride;
    }
    atomicAdd(&result[0], s.x + s.y + s.z + s.w);
    atomicAdd(&result[1], w.x + w.y + w.z + w.w);
}
"#;

/// SPIR-V words of [`WGSL`].
pub fn spirv() -> Result<Vec<u32>, String> {
    let module = naga::front::wgsl::parse_str(WGSL)
        .map_err(|e| format!("WGSL parse: {}", e.emit_to_string(WGSL)))?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::empty(),
    )
    .validate(&module)
    .map_err(|e| format!("WGSL validation: {}", e.emit_to_string(WGSL)))?;
    let options = naga::back::spv::Options {
        lang_version: (1, 0),
        flags: naga::back::spv::WriterFlags::empty(),
        force_loop_bounding: false,
        ..Default::default()
    };
    let pipeline = naga::back::spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: "main".into(),
    };
    naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline))
        .map_err(|e| format!("SPIR-V output: {e}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn wgsl_compiles_to_spirv() {
        let words = super::spirv().unwrap();
        assert_eq!(words[0], 0x0723_0203, "SPIR-V magic");
        assert!(words.len() > 100);
    }
}

//! The pass kernel, in WGSL, turned into SPIR-V by naga at run time (about a
//! millisecond). Every workgroup walks one contiguous block of 16-byte elements, reduces
//! the two sums of [`crate::types::Checksum`] in workgroup memory and adds them into a
//! result buffer with one atomic each.

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

var<workgroup> red_s: array<u32, 256>;
var<workgroup> red_w: array<u32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) groups: vec3<u32>) {
    // Each workgroup reads one contiguous block (friendly to a CPU device's TLB and
    // prefetcher); within it, neighbouring invocations read neighbouring 16 bytes.
    let n = params.n_vec4;
    let per = ((n + groups.x - 1u) / groups.x + 255u) / 256u * 256u;
    let start = wid.x * per;
    let end = min(start + per, n);
    let step = vec4<u32>(0u, 2u, 4u, 6u);
    var s = vec4<u32>(0u);
    var w = vec4<u32>(0u);
    var j = start + lid.x;
    // Four independent loads in flight per invocation, then the remainder.
    loop {
        if (j + 768u >= end) { break; }
        let a = data[j];
        let b = data[j + 256u];
        let c = data[j + 512u];
        let d = data[j + 768u];
        let ka = 2u * (params.base_word + 4u * j) + 1u;
        s = s + a + b + c + d;
        w = w + a * (vec4<u32>(ka) + step) + b * (vec4<u32>(ka + 2048u) + step)
              + c * (vec4<u32>(ka + 4096u) + step) + d * (vec4<u32>(ka + 6144u) + step);
        j = j + 1024u;
    }
    loop {
        if (j >= end) { break; }
        let v = data[j];
        let k = 2u * (params.base_word + 4u * j) + 1u;
        s = s + v;
        w = w + v * (vec4<u32>(k) + step);
        j = j + 256u;
    }
    // Reduce in the workgroup, then one atomic per workgroup: same-address atomics
    // from every invocation would cost more than the reads on a GPU.
    red_s[lid.x] = s.x + s.y + s.z + s.w;
    red_w[lid.x] = w.x + w.y + w.z + w.w;
    workgroupBarrier();
    var half = 128u;
    loop {
        if (half == 0u) { break; }
        if (lid.x < half) {
            red_s[lid.x] = red_s[lid.x] + red_s[lid.x + half];
            red_w[lid.x] = red_w[lid.x] + red_w[lid.x + half];
        }
        workgroupBarrier();
        half = half / 2u;
    }
    if (lid.x == 0u) {
        atomicAdd(&result[0], red_s[0]);
        atomicAdd(&result[1], red_w[0]);
    }
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

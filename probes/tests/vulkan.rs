//! The Vulkan backend for real. CI provides lavapipe (mesa-vulkan-drivers), so a missing
//! Vulkan device fails there; elsewhere the tests say SKIPPED.
#![allow(clippy::unwrap_used)]

use std::io::Write;

use twofold_probes::backend::{ArmPlan, Backend};
use twofold_probes::types::{Arm, ImportMethod, Topology};
use twofold_probes::vulkan::{self, VulkanBackend};
use twofold_probes::{checksum, mapping};

fn vulkan_device() -> Option<usize> {
    let caps = vulkan::caps();
    let ok = caps.devices.iter().any(|d| d.external_memory_host);
    if !ok {
        if std::env::var_os("CI").is_some() {
            panic!("CI must provide a Vulkan device with VK_EXT_external_memory_host: {caps:?}");
        }
        eprintln!(
            "SKIPPED: no Vulkan device with VK_EXT_external_memory_host ({:?})",
            caps.not_available
        );
        return None;
    }
    Some(vulkan::default_device(&caps.devices))
}

fn file(dir: &std::path::Path, size: usize) -> std::path::PathBuf {
    let p = dir.join("probe.bin");
    let mut f = std::fs::File::create(&p).unwrap();
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut buf = vec![0u8; size];
    for w in buf.chunks_exact_mut(8) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        w.copy_from_slice(&s.to_le_bytes());
    }
    f.write_all(&buf).unwrap();
    p
}

#[test]
fn caps_list_lavapipe_limits() {
    let Some(dev) = vulkan_device() else { return };
    let caps = vulkan::caps();
    let d = &caps.devices[dev];
    assert!(d.min_imported_host_pointer_alignment.unwrap() >= 1);
    assert!(d.max_storage_buffer_range > 0);
    assert!(!d.heaps.is_empty() && !d.memory_types.is_empty());
    if d.device_type == "cpu" {
        assert_eq!(d.topology, Topology::Unified);
    }
}

#[test]
fn arms_checksums_match_the_cpu_over_several_ranges() {
    let Some(dev) = vulkan_device() else { return };
    let dir = tempfile::tempdir().unwrap();
    let size = 24 << 20;
    let p = file(dir.path(), size);
    let map = mapping::map_shared_read_only(&p, size as u64).unwrap();
    VulkanBackend
        .try_import(dev, &map, ImportMethod::VulkanHostPointer)
        .unwrap();
    let plan = ArmPlan {
        order: vec![Arm::PerUseCopy, Arm::Map, Arm::Resident],
        warmup: 1,
        passes: 2,
        expected: checksum::parallel(&map),
        range_limit: Some(5 << 20),
        import_limit: Some(8 << 20),
        chunk_bytes: 3 << 20,
        references: true,
    };
    let mut seen = Vec::new();
    let r = VulkanBackend
        .run_arms(dev, &map, &plan, &mut |a| {
            seen.push(a);
            Some(1.0)
        })
        .unwrap();
    eprintln!("{r:#?}");
    assert_eq!(seen, plan.order);
    for run in &r.runs {
        assert!(run.checksums_ok, "{run:?}");
        assert_eq!(run.pass_seconds.len(), 2);
        assert!(run.max_range_bytes <= 5 << 20);
    }
    let map_run = r.runs.iter().find(|a| a.arm == Arm::Map).unwrap();
    assert!(map_run.ranges >= 5, "{map_run:?}");
}

#[test]
fn writable_and_copy_on_write_views_import_too() {
    use twofold_probes::job::{run, Job, JobResult};
    use twofold_probes::mapping::MappingKind;
    use twofold_probes::types::{BackendKind, ImportStatus};
    let Some(dev) = vulkan_device() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = file(dir.path(), 4 << 20);
    for kind in [
        MappingKind::SharedReadOnly,
        MappingKind::SharedReadWrite,
        MappingKind::PrivateCopyOnWrite,
    ] {
        let job = Job::Import {
            backend: BackendKind::Vulkan,
            device: dev,
            file: p.clone(),
            bytes: 4 << 20,
            method: ImportMethod::VulkanHostPointer,
            mapping: kind,
            fake: None,
        };
        let JobResult::Import(o) = run(&job, &|_, _| None) else {
            panic!("not an import result");
        };
        assert_eq!(o.status, ImportStatus::Ok, "{o:?}");
        assert_eq!(o.mapping, kind.name());
        assert!(o.anon_bytes_delta.is_some() && o.file_bytes_delta.is_some());
    }
}

//! The probe interface every driver stack implements, and a fake for tests.

use serde::{Deserialize, Serialize};

use crate::checksum;
use crate::types::{
    Arm, ArmRun, ArmsReport, BackendKind, Checksum, ImportMethod, ReferenceRate, Topology,
};

/// What one probe process measures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmPlan {
    /// Arms in the order this process runs them (rotated across processes).
    pub order: Vec<Arm>,
    /// Passes run and discarded before the timed ones.
    pub warmup: u32,
    /// Timed passes.
    pub passes: u32,
    /// The CPU's checksum of the working set.
    pub expected: Checksum,
    /// Bind at most this many bytes per descriptor (further capped by the device's
    /// maxStorageBufferRange).
    pub range_limit: Option<u64>,
    /// Import at most this many bytes per allocation or registration (the measured
    /// ceiling, if smaller than the driver's own limit).
    pub import_limit: Option<u64>,
    /// Bytes staged per copy in the per-use copy arm.
    pub chunk_bytes: u64,
    /// Also measure the copy rates the kernels are judged against.
    pub references: bool,
}

/// One timed pass of a prepared arm: seconds and the device's checksum.
pub type PassFn<'a> = Box<dyn FnMut() -> Result<(f64, Checksum), String> + 'a>;

/// Runs `plan.warmup + plan.passes` rounds of paired passes: every round runs one pass
/// of each prepared arm, starting one arm later than the round before, so drift and
/// noise fall on all arms alike. An arm stops at its first error or checksum mismatch.
pub fn interleave(plan: &ArmPlan, arms: &mut [(ArmRun, Option<PassFn<'_>>)]) {
    let n = arms.len();
    for round in 0..(plan.warmup + plan.passes) as usize {
        for k in 0..n {
            let (run, f) = &mut arms[(k + round) % n];
            let Some(f) = f else { continue };
            if run.error.is_some() {
                continue;
            }
            match f() {
                Ok((secs, got)) => {
                    run.device_checksum = Some(got);
                    if got != plan.expected {
                        run.checksums_ok = false;
                        run.error = Some(format!(
                            "pass {round}: device checksum {got} differs from the CPU's {}",
                            plan.expected
                        ));
                    } else if round >= plan.warmup as usize {
                        run.pass_seconds.push(secs);
                    }
                }
                Err(e) => {
                    run.checksums_ok = false;
                    run.error = Some(format!("pass {round}: {e}"));
                }
            }
        }
    }
}

/// An arm ready to run: checksums assumed good until a pass says otherwise.
pub fn prepared(arm: Arm, bytes: u64) -> ArmRun {
    let mut r = ArmRun::failed(arm, bytes, "");
    r.error = None;
    r.checksums_ok = true;
    r
}

/// Called once per arm after all passes, with every arm's allocations still alive:
/// returns the fraction of the working set in the page cache (the post-execution
/// coexistence check).
pub type Observer<'a> = &'a mut dyn FnMut(Arm) -> Option<f64>;

/// One driver stack (Vulkan, CUDA, or the fake).
pub trait Backend {
    fn kind(&self) -> BackendKind;

    /// The import attempts this backend makes on a file mapping.
    fn import_methods(&self) -> Vec<ImportMethod>;

    /// Imports `data` (a read-only shared file mapping) with `method`, then releases it.
    /// `Err` carries the driver's exact error.
    fn try_import(&self, device: usize, data: &[u8], method: ImportMethod) -> Result<(), String>;

    /// Runs the three arms over `data` (the working set).
    fn run_arms(
        &self,
        device: usize,
        data: &[u8],
        plan: &ArmPlan,
        observe: Observer<'_>,
    ) -> Result<ArmsReport, String>;
}

/// A backend that computes on the CPU and reports configured rates, with no sleeping:
/// pass times are the bytes divided by the rate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Fake {
    pub topology: Topology,
    /// GB/s per arm; `None` makes the arm fail.
    pub map_gbps: Option<f64>,
    pub resident_gbps: Option<f64>,
    pub per_use_copy_gbps: Option<f64>,
    /// Imports above this many bytes fail.
    pub import_ceiling: u64,
    /// Corrupt the map arm's checksum (to test invalid arms).
    pub corrupt_map: bool,
    pub device_free_bytes: Option<u64>,
    /// Imports never return (a driver stuck pinning pages), to test the timeout.
    pub hang_imports: bool,
}

impl Default for Fake {
    fn default() -> Self {
        Fake {
            topology: Topology::DiscretePcie,
            map_gbps: Some(50.0),
            resident_gbps: Some(3000.0),
            per_use_copy_gbps: Some(45.0),
            import_ceiling: u64::MAX,
            corrupt_map: false,
            device_free_bytes: Some(64 << 30),
            hang_imports: false,
        }
    }
}

impl Backend for Fake {
    fn kind(&self) -> BackendKind {
        BackendKind::Fake
    }

    fn import_methods(&self) -> Vec<ImportMethod> {
        vec![ImportMethod::Fake]
    }

    fn try_import(&self, _device: usize, data: &[u8], _m: ImportMethod) -> Result<(), String> {
        if self.hang_imports {
            // Like a driver stuck pinning pages: never returns.
            loop {
                std::thread::park();
            }
        }
        if data.len() as u64 > self.import_ceiling {
            return Err(format!(
                "fake: {} bytes exceed the import ceiling of {}",
                data.len(),
                self.import_ceiling
            ));
        }
        Ok(())
    }

    fn run_arms(
        &self,
        _device: usize,
        data: &[u8],
        plan: &ArmPlan,
        observe: Observer<'_>,
    ) -> Result<ArmsReport, String> {
        let bytes = data.len() as u64;
        let sum = checksum::parallel(data);
        let limit = plan.range_limit.unwrap_or(bytes).max(16);
        let ranges = crate::mapping::split(bytes, limit, 16);
        let mut arms: Vec<(ArmRun, Option<PassFn<'_>>)> = Vec::new();
        for &arm in &plan.order {
            let rate = match arm {
                Arm::Map => self.map_gbps,
                Arm::Resident => self.resident_gbps,
                Arm::PerUseCopy => self.per_use_copy_gbps,
            };
            let Some(rate) = rate else {
                arms.push((ArmRun::failed(arm, bytes, "fake: arm disabled"), None));
                continue;
            };
            let mut got = sum;
            if self.corrupt_map && arm == Arm::Map {
                got.sum ^= 1;
            }
            let mut run = prepared(arm, bytes);
            run.setup_seconds = (arm == Arm::Resident).then_some(0.0);
            run.max_range_bytes = ranges.iter().map(|r| r.1).max().unwrap_or(0);
            run.ranges = ranges.len() as u32;
            run.detail = Some("fake".into());
            let secs = bytes as f64 / (rate * 1e9);
            arms.push((run, Some(Box::new(move || Ok((secs, got))))));
        }
        interleave(plan, &mut arms);
        let mut runs = Vec::new();
        for (mut run, _) in arms {
            run.resident_fraction_after = observe(run.arm);
            runs.push(run);
        }
        Ok(ArmsReport {
            backend: BackendKind::Fake,
            device: "fake device".into(),
            topology: self.topology,
            runs,
            references: vec![ReferenceRate {
                what: "fake copy".into(),
                bytes,
                gbps: 1.0,
            }],
            device_free_bytes: self.device_free_bytes,
            kernel: "CPU".into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_reports_configured_rates_and_real_checksums() {
        let data: Vec<u8> = (0..1 << 20).map(|i| i as u8).collect();
        let plan = ArmPlan {
            order: vec![Arm::PerUseCopy, Arm::Map, Arm::Resident],
            warmup: 1,
            passes: 3,
            expected: checksum::of(&data, 0),
            range_limit: Some(256 << 10),
            import_limit: None,
            chunk_bytes: 1 << 20,
            references: false,
        };
        let fake = Fake {
            corrupt_map: true,
            ..Fake::default()
        };
        let mut seen = Vec::new();
        let r = fake
            .run_arms(0, &data, &plan, &mut |a| {
                seen.push(a);
                Some(1.0)
            })
            .unwrap();
        assert_eq!(seen, plan.order);
        let map = r.runs.iter().find(|a| a.arm == Arm::Map).unwrap();
        assert!(!map.checksums_ok);
        let res = r.runs.iter().find(|a| a.arm == Arm::Resident).unwrap();
        assert!(res.checksums_ok);
        assert_eq!(res.ranges, 4);
        assert!((res.pass_seconds[0] - (1 << 20) as f64 / 3e12).abs() < 1e-12);
        assert!(fake.try_import(0, &data, ImportMethod::Fake).is_ok());
        let small = Fake {
            import_ceiling: 1000,
            ..Fake::default()
        };
        assert!(small.try_import(0, &data, ImportMethod::Fake).is_err());
    }
}

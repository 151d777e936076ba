//! The CI gate of `scan --fail-on`: conditions over a report that a deployment check can
//! fail on, each met with the files that meet it. Pure: the command turns a met
//! condition into exit status 1.

use serde::{Deserialize, Serialize};

use super::{FileModel, Report};

/// A condition `scan --fail-on` checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Condition {
    /// A file's bytes are proven in memory beside the page cache: a private copy, copy-on-
    /// write pages of it, or a proven device copy (the model is held twice).
    Copies,
    /// A file has a suspected copy (a candidate not searched, or a device copy by size).
    Suspected,
    /// A file's count is a lower bound (something not searched, or a part unknown).
    LowerBound,
}

impl Condition {
    pub fn name(self) -> &'static str {
        match self {
            Condition::Copies => "copies",
            Condition::Suspected => "suspected",
            Condition::LowerBound => "lower-bound",
        }
    }

    /// Why `f` meets the condition, in words; `None` when it does not.
    pub fn met_by(self, f: &FileModel) -> Option<String> {
        let r = &f.representations;
        match self {
            Condition::Copies => {
                let proven_device = f.device_copies.iter().any(|d| d.proven);
                let cow = r.cow.unwrap_or(0.0);
                (r.private_copies > 0.0 || cow > 0.0 || proven_device).then(|| {
                    let mut parts = Vec::new();
                    if r.private_copies > 0.0 {
                        parts.push(format!("{:.2} private copies", r.private_copies));
                    }
                    if cow > 0.0 {
                        parts.push(format!("{:.2} in copy-on-write pages", cow));
                    }
                    if proven_device {
                        parts.push("a proven device copy".to_string());
                    }
                    format!("proven {}", parts.join(", "))
                })
            }
            Condition::Suspected => (r.suspected > 0.0 || r.suspected_device > 0.0).then(|| {
                format!(
                    "{:.2} suspected copies, {:.2} suspected on a device",
                    r.suspected, r.suspected_device
                )
            }),
            Condition::LowerBound => r.lower_bound.then(|| {
                if r.unsearched > 0 {
                    format!("the count is a lower bound ({} unsearched)", r.unsearched)
                } else {
                    "the count is a lower bound (a part is unknown)".to_string()
                }
            }),
        }
    }
}

/// A condition met by a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Met {
    pub condition: Condition,
    pub path: String,
    pub why: String,
}

/// Every (condition, file) of `conditions` that `report` meets, conditions in the order
/// given, files in the report's order.
pub fn check(report: &Report, conditions: &[Condition]) -> Vec<Met> {
    let mut met = Vec::new();
    for &c in conditions {
        for f in &report.files {
            if let Some(why) = c.met_by(f) {
                met.push(Met {
                    condition: c,
                    path: f.path.clone(),
                    why,
                });
            }
        }
    }
    met
}

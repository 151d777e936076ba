//! The filter line of `top`: `anon>1G`, `count>=2`, `resident<50` (percent) compare a
//! field of the registry ([`crate::model::fields`]); any other text is a substring of names.
//! A comparison that names no field or no number is an error, shown on the status line.

/// One comparison of a `field>value` filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    Gt,
    Ge,
    Lt,
    Le,
    Eq,
}

/// A parsed filter: a substring of names, or a comparison on a column.
#[derive(Debug, Clone, PartialEq)]
pub enum Filter {
    Substring(String),
    Compare { field: String, cmp: Cmp, value: f64 },
}

/// The fields a filter compares on the workload rollup (`groups::workload_value`).
pub const WORKLOAD_FIELDS: [&str; 6] = ["pss", "uss", "anon", "swap", "procs", "files"];

/// The names a comparison takes: every field of the registry's files, processes and
/// cgroups, and the sums of the workload rollup.
fn is_field(name: &str) -> bool {
    use crate::model::fields::{CgroupField, FileField, ProcessField};
    FileField::named(name).is_some()
        || ProcessField::named(name).is_some()
        || CgroupField::named(name).is_some()
        || WORKLOAD_FIELDS.contains(&name)
}

impl Filter {
    /// `anon>1G`, `count>=2`, `resident<50` (percent), or any other text as a substring.
    /// Text that reads as a comparison (a word, an operator, a value) but names no field
    /// or no number is an error saying which: it is never taken as a substring silently.
    pub fn parse(text: &str) -> Result<Filter, String> {
        let t = text.trim();
        for (op, cmp) in [
            (">=", Cmp::Ge),
            ("<=", Cmp::Le),
            (">", Cmp::Gt),
            ("<", Cmp::Lt),
            ("=", Cmp::Eq),
        ] {
            let Some((field, value)) = t.split_once(op) else {
                continue;
            };
            let field = field.trim().to_ascii_lowercase();
            // A path or a phrase (`/models/a=b`) is text to find, not a comparison.
            let word =
                !field.is_empty() && field.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !word {
                break;
            }
            if !is_field(&field) {
                return Err(format!(
                    "no field '{field}' to compare (the sort column names, docs/top.md)"
                ));
            }
            let value = value.trim();
            if value.is_empty() {
                return Err(format!("'{field}{op}' needs a value"));
            }
            let num = value
                .trim_end_matches('%')
                .parse::<f64>()
                .ok()
                .filter(|_| !value.chars().any(|c| c.is_ascii_alphabetic()))
                .or_else(|| crate::units::parse_size(value).ok().map(|b| b as f64));
            return match num {
                Some(value) => Ok(Filter::Compare { field, cmp, value }),
                None => Err(format!(
                    "'{value}' is not a number or a size (1.5, 90, 512M, 2G)"
                )),
            };
        }
        Ok(Filter::Substring(t.to_lowercase()))
    }

    pub fn compare(cmp: Cmp, have: Option<f64>, want: f64) -> bool {
        // An unknown value never passes a comparison.
        let Some(have) = have else { return false };
        match cmp {
            Cmp::Gt => have > want,
            Cmp::Ge => have >= want,
            Cmp::Lt => have < want,
            Cmp::Le => have <= want,
            Cmp::Eq => (have - want).abs() < 1e-9_f64.max(want.abs() * 1e-9),
        }
    }
}

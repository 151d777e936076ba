//! The filter line of `top`: `anon>1G`, `count>=2`, `resident<50` (percent) compare a
//! field of the registry ([`crate::model::fields`]); any other text is a substring of names.

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

impl Filter {
    /// `anon>1G`, `count>=2`, `resident<50` (percent), or any other text as a substring.
    pub fn parse(text: &str) -> Filter {
        let t = text.trim();
        for (op, cmp) in [
            (">=", Cmp::Ge),
            ("<=", Cmp::Le),
            (">", Cmp::Gt),
            ("<", Cmp::Lt),
            ("=", Cmp::Eq),
        ] {
            if let Some((field, value)) = t.split_once(op) {
                let field = field.trim().to_ascii_lowercase();
                let value = value.trim();
                let num = value
                    .trim_end_matches('%')
                    .parse::<f64>()
                    .ok()
                    .filter(|_| !value.chars().any(|c| c.is_ascii_alphabetic()))
                    .or_else(|| crate::units::parse_size(value).ok().map(|b| b as f64));
                if let (false, Some(value)) = (field.is_empty(), num) {
                    return Filter::Compare { field, cmp, value };
                }
            }
        }
        Filter::Substring(t.to_lowercase())
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

//! The words of findings live with the model ([`crate::model::findings::text`]): the
//! JSON document carries them, so its serialisation needs them.

pub use crate::model::findings::remedy::{residency_remedy, suspect_remedy};
pub use crate::model::findings::text::{render, Text};

/// Who could hold a copy of `f` and who was searched, naming each process not searched
/// and why ("3 processes could hold a copy: 2 searched byte by byte, 1 not: pid 42
/// (over the proof budget)"); `None` when none could. The same words in `scan`, `replay`
/// and `top`.
pub fn searched_line(f: &crate::model::FileModel) -> Option<String> {
    let c = &f.candidates;
    if c.could_hold == 0 {
        return None;
    }
    let mut s = format!(
        "{} process{} could hold a copy: {} searched byte by byte, {} not",
        c.could_hold,
        if c.could_hold == 1 { "" } else { "es" },
        c.searched,
        c.not_searched
    );
    // Grouped by reason: "pid 1, 2 and 5 more (over the proof budget)".
    let mut by_why: Vec<(String, Vec<i32>)> = Vec::new();
    for x in &c.unsearched {
        let why = x.why.text();
        let why = why
            .strip_prefix("not searched: ")
            .unwrap_or(why)
            .to_string();
        match by_why.iter_mut().find(|(w, _)| *w == why) {
            Some((_, pids)) => pids.push(x.pid),
            None => by_why.push((why, vec![x.pid])),
        }
    }
    if c.not_searched > 0 && !by_why.is_empty() {
        const SHOWN: usize = 3;
        let groups: Vec<String> = by_why
            .iter()
            .map(|(why, pids)| {
                let shown: Vec<String> = pids.iter().take(SHOWN).map(|p| p.to_string()).collect();
                let more = match pids.len().saturating_sub(SHOWN) {
                    0 => String::new(),
                    n => format!(" and {n} more"),
                };
                format!(
                    "pid{} {}{more} ({})",
                    if pids.len() == 1 { "" } else { "s" },
                    shown.join(", "),
                    super::safe::safe(why)
                )
            })
            .collect();
        s.push_str(": ");
        s.push_str(&groups.join("; "));
    }
    Some(s)
}

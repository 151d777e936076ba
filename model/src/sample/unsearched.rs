//! Why a candidate process was not (fully) searched for a file: [`Unsearched`].
//!
//! JSON and stored recordings carry the reason as its sentence, exactly as when it was a
//! string; a sentence read back is typed again by [`Unsearched::parse`], so a recording
//! made before the type existed replays with the same remedies.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How a process that refused even a reader with `CAP_SYS_PTRACE` is described.
pub const POLICY: &str = "denied even to root by a security policy (e.g. a sandbox's pid 1)";
/// How a refusal for want of ptrace rights is described.
pub const NO_PTRACE: &str = "needs ptrace rights";
/// How a process that went away is described.
pub const EXITED: &str = "the process exited";
/// How the reason of a candidate checked in place between full searches begins.
pub const CHANGED_SINCE_SEARCH: &str = "its memory changed since its last full search";

/// What the reason of a file whose filesystem did not answer says (the collection's words:
/// `'/mnt/nfs/m.gguf': the filesystem did not answer in 2 s`).
pub const DID_NOT_ANSWER: &str = "the filesystem did not answer";

const NOTHING_SEARCHABLE: &str = "nothing in the file can be searched for (no tensor, and no run of its bytes, of 256 bytes or more with information in it)";

/// Why a candidate was not searched, or only in part: the kind of reason, with the
/// sentence that says it (what the JSON carries).
///
/// Build one with the constructors ([`Unsearched::over_budget`], [`Unsearched::from_error`],
/// ...): they write the sentence and type it by [`Unsearched::parse`], so a reason is
/// always of the kind its sentence reads as, and stays so through a recording.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unsearched {
    /// Its memory changed since its last full search, so only the copies found then were
    /// checked again, in place (after what that search had left unsearched, if anything).
    ChangedSinceSearch(String),
    /// Refused even to a reader with `CAP_SYS_PTRACE`: a security policy ([`POLICY`]).
    Policy(String),
    /// The process exited while it was searched ([`EXITED`]).
    Exited(String),
    /// Nothing in the file can be searched for (no tensor or run of information of 256
    /// bytes or more): a copy can be neither proven nor ruled out.
    NothingSearchable(String),
    /// The proof budget was spent before the search began, or during it (searched in
    /// part).
    OverBudget(String),
    /// Not searched at all: proofs were off (`--no-prove`).
    NoProve(String),
    /// Refused for want of ptrace rights ([`NO_PTRACE`]).
    NoPtrace(String),
    /// The model files could not be indexed.
    NotIndexed(String),
    /// The file's filesystem did not answer in time ([`DID_NOT_ANSWER`]): a hung
    /// mount, whose file is not read until it answers again.
    NotAnswering(String),
    /// The file could not be opened, read or parsed, or the search failed otherwise.
    Other(String),
}

impl Unsearched {
    /// The proof budget (seconds) was spent before the search of the process began.
    pub fn over_budget(budget_secs: f64) -> Unsearched {
        Unsearched::parse(&format!(
            "not searched: over the proof budget ({budget_secs:.1} s; raise --prove-budget)"
        ))
    }

    /// The proof budget ran out during the search.
    pub fn partly_over_budget() -> Unsearched {
        Unsearched::parse("searched in part: over the proof budget (raise --prove-budget)")
    }

    pub fn nothing_searchable() -> Unsearched {
        Unsearched::parse(NOTHING_SEARCHABLE)
    }

    /// The model files could not be indexed (`error`).
    pub fn not_indexed(error: &str) -> Unsearched {
        Unsearched::parse(&format!("the model files could not be indexed: {error}"))
    }

    /// The file's filesystem did not answer: `why` is the collection's sentence
    /// (`'/mnt/x/m.gguf': the filesystem did not answer in 2 s`).
    pub fn not_answering(why: &str) -> Unsearched {
        Unsearched::parse(&format!("not searched: {why}"))
    }

    /// No proof was made (`--no-prove`).
    pub fn no_prove() -> Unsearched {
        Unsearched::parse("not searched (--no-prove)")
    }

    /// Checked in place since the last full search: `when` says when and how often (it
    /// follows [`CHANGED_SINCE_SEARCH`]); `before`, what that search had left unsearched.
    pub fn changed_since_search(before: Option<&Unsearched>, when: &str) -> Unsearched {
        let why = format!("{CHANGED_SINCE_SEARCH}{when}");
        Unsearched::parse(&match before {
            Some(b) => format!("{b}; {why}"),
            None => why,
        })
    }

    /// The reason of a failed search of a process or file, in its words (a refusal names
    /// [`POLICY`] or [`NO_PTRACE`], an exit [`EXITED`]).
    pub fn from_error(words: String) -> Unsearched {
        Unsearched::parse(&words)
    }

    /// The reason a sentence gives, for any sentence a recording holds. The words decide,
    /// in this order (the first that applies): a check in place since the last full
    /// search, a security policy, an exit, a filesystem that did not answer, nothing
    /// searchable, the budget, `--no-prove`, no ptrace rights, no index.
    pub fn parse(text: &str) -> Unsearched {
        let t = text.to_string();
        if text.contains(CHANGED_SINCE_SEARCH) {
            Unsearched::ChangedSinceSearch(t)
        } else if text.contains(POLICY) {
            Unsearched::Policy(t)
        } else if text.contains(EXITED) {
            Unsearched::Exited(t)
        } else if text.contains(DID_NOT_ANSWER) {
            Unsearched::NotAnswering(t)
        } else if text.contains("nothing in the file can be searched") {
            Unsearched::NothingSearchable(t)
        } else if text.contains("budget") {
            Unsearched::OverBudget(t)
        } else if text.contains("--no-prove") {
            Unsearched::NoProve(t)
        } else if text.contains(NO_PTRACE) {
            Unsearched::NoPtrace(t)
        } else if text.starts_with("the model files could not be indexed") {
            Unsearched::NotIndexed(t)
        } else {
            Unsearched::Other(t)
        }
    }

    /// The sentence.
    pub fn text(&self) -> &str {
        match self {
            Unsearched::ChangedSinceSearch(t)
            | Unsearched::Policy(t)
            | Unsearched::Exited(t)
            | Unsearched::NothingSearchable(t)
            | Unsearched::OverBudget(t)
            | Unsearched::NoProve(t)
            | Unsearched::NoPtrace(t)
            | Unsearched::NotIndexed(t)
            | Unsearched::NotAnswering(t)
            | Unsearched::Other(t) => t,
        }
    }
}

/// The sentence, as the JSON and the reports carry it.
impl fmt::Display for Unsearched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text())
    }
}

impl From<&str> for Unsearched {
    fn from(text: &str) -> Self {
        Unsearched::parse(text)
    }
}

impl From<String> for Unsearched {
    fn from(text: String) -> Self {
        Unsearched::parse(&text)
    }
}

impl Serialize for Unsearched {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.text())
    }
}

impl<'de> Deserialize<'de> for Unsearched {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(|t| Unsearched::parse(&t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sentences as the code wrote them when the reason was a string.
    const OLD: &[&str] = &[
        "not searched: over the proof budget (2.0 s; raise --prove-budget)",
        "not searched: over the proof budget (0.3 s; raise --prove-budget)",
        "searched in part: over the proof budget (raise --prove-budget)",
        "nothing in the file can be searched for (no tensor, and no run of its bytes, of 256 bytes or more with information in it)",
        "the model files could not be indexed: out of memory",
        "not searched (--no-prove)",
        "open /proc/9/pagemap: reading the page map of pid 9 was denied even to root by a security policy (e.g. a sandbox's pid 1): Permission denied (os error 13)",
        "open /proc/9/pagemap: reading the page map of pid 9 needs ptrace rights: this root lacks CAP_SYS_PTRACE: Operation not permitted (os error 1)",
        "the process exited while it was searched",
        "cannot open '/m/model.gguf': No such file or directory (os error 2)",
        "its memory changed since its last full search 30 s ago (searched again every 60 s while it changes)",
        "searched in part: over the proof budget (raise --prove-budget); its memory changed since its last full search 5 s ago (searched again every 60 s while it changes; the copies found then were checked again now)",
        "over the proof budget",
    ];

    #[test]
    fn an_old_string_reads_back_typed_and_writes_the_same() {
        for text in OLD {
            let json = serde_json::to_string(text).unwrap();
            let u: Unsearched = serde_json::from_str(&json).unwrap();
            assert_eq!(serde_json::to_string(&u).unwrap(), json, "{u:?}");
            assert_eq!(Unsearched::parse(&u.to_string()), u);
        }
        use Unsearched as U;
        let kind = |t: &str| std::mem::discriminant(&U::parse(t));
        let d = std::mem::discriminant::<U>;
        assert_eq!(kind(OLD[0]), d(&U::over_budget(2.0)));
        assert_eq!(U::over_budget(2.0).text(), OLD[0]);
        assert_eq!(U::partly_over_budget().text(), OLD[2]);
        assert_eq!(kind(OLD[2]), d(&U::OverBudget(String::new())));
        assert_eq!(U::nothing_searchable().text(), OLD[3]);
        assert_eq!(kind(OLD[3]), d(&U::NothingSearchable(String::new())));
        assert_eq!(U::not_indexed("out of memory").text(), OLD[4]);
        assert_eq!(kind(OLD[4]), d(&U::NotIndexed(String::new())));
        assert_eq!(U::no_prove().text(), OLD[5]);
        assert_eq!(kind(OLD[5]), d(&U::NoProve(String::new())));
        assert_eq!(kind(OLD[6]), d(&U::Policy(String::new())));
        assert_eq!(kind(OLD[7]), d(&U::NoPtrace(String::new())));
        assert_eq!(kind(OLD[8]), d(&U::Exited(String::new())));
        assert_eq!(kind(OLD[9]), d(&U::Other(String::new())));
        assert_eq!(kind(OLD[10]), d(&U::ChangedSinceSearch(String::new())));
        let when = " 5 s ago (searched again every 60 s while it changes; the copies found then were checked again now)";
        let c = U::changed_since_search(Some(&U::partly_over_budget()), when);
        assert_eq!(c.text(), OLD[11]);
        assert_eq!(kind(OLD[11]), d(&c));
        let hung = U::not_answering("'/mnt/x/m.gguf': the filesystem did not answer in 2 s");
        assert_eq!(
            hung.text(),
            "not searched: '/mnt/x/m.gguf': the filesystem did not answer in 2 s"
        );
        assert_eq!(kind(hung.text()), d(&U::NotAnswering(String::new())));
        // A sentence that names the budget in other words is still about the budget.
        assert_eq!(kind(OLD[12]), d(&U::over_budget(1.0)));
    }

    #[test]
    fn a_missing_reason_stays_null() {
        let none: Option<Unsearched> = serde_json::from_str("null").unwrap();
        assert_eq!(none, None);
        assert_eq!(serde_json::to_string(&none).unwrap(), "null");
    }
}

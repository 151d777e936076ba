//! The words of findings live with the model ([`crate::model::findings::text`]): the
//! JSON document carries them, so its serialisation needs them.

pub use crate::model::findings::remedy::{residency_remedy, suspect_remedy};
pub use crate::model::findings::text::{render, Text};

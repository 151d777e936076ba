//! twofold: how many times is my model in memory, and why?
//!
//! The crate follows the data flow: [`collect`] reads the kernel's files (every reader
//! takes a root path) into raw [`sample`] types; [`model`] derives footprints,
//! representation estimates and findings from a sample without any I/O; [`render`] turns
//! a model into tables or JSON; [`cmd`] wires the commands defined in [`cli`].
//!
//! ```no_run
//! use twofold::collect::{gather, Roots};
//! let mut warnings = Vec::new();
//! let sample = gather::gather(&Roots::live(), &gather::Request::default(), &mut warnings)?;
//! let report = twofold::model::from_sample(&sample);
//! for f in &report.files {
//!     println!("{}: {:?} representations", f.path, f.representations.proven);
//! }
//! # Ok::<(), anyhow::Error>(())
//! ```

pub mod campaign;
pub mod cleanup;
pub mod cli;
pub mod cmd;
pub mod collect;
/// Files and pids a user names, checked before any work (in collect: they are read).
pub use collect::input;
pub use twofold_formats as container;
pub mod dupes;
pub mod engine;
pub mod export;
pub use twofold_model::{model, sample, units};
pub mod render;
pub mod spawn;
pub mod store;
pub mod timespec;
pub mod tui;

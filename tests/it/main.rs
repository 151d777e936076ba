//! Integration tests that neither disturb the host nor count its memory exactly: the
//! parsers on real files, fixture trees, GPU and probe paths. One binary (the heavy
//! dependencies are linked once); each file below is a module.

#[path = "../common/mod.rs"]
mod common;
#[path = "../writers/mod.rs"]
mod writers;

mod container;
mod deploy;
mod docs;
mod fixture_trees;
mod fuzz_seeds;
mod gpu;
mod inspect;
mod layers;
mod probe;
mod python;

//! The columns `top` sorts by, per view, in the order `s` cycles through them (the first
//! is the default): one list for `top`'s keys, its `--sort` help and docs/top.md (tested).

use super::{CgroupField, Field, FileField, ProcessField};

pub const FILES: [Field; 10] = {
    use FileField as F;
    [
        Field::File(F::Count),
        Field::File(F::Size),
        Field::File(F::Cache),
        Field::File(F::Cow),
        Field::File(F::Private),
        Field::File(F::Suspected),
        Field::File(F::Resident),
        Field::File(F::Holders),
        Field::File(F::Uploaded),
        Field::File(F::Path),
    ]
};

pub const PROCESSES: [Field; 14] = {
    use ProcessField as P;
    [
        Field::Process(P::Rss),
        Field::Process(P::Anon),
        Field::Process(P::File),
        Field::Process(P::Pss),
        Field::Process(P::Growth),
        Field::Process(P::Files),
        Field::Process(P::Pid),
        Field::Process(P::Comm),
        Field::Process(P::Shmem),
        Field::Process(P::Cow),
        Field::Process(P::Uss),
        Field::Process(P::Dirty),
        Field::Process(P::Swap),
        Field::Process(P::Gpu),
    ]
};

pub const CGROUPS: [Field; 10] = {
    use CgroupField as C;
    [
        Field::Cgroup(C::Usage),
        Field::Cgroup(C::Limit),
        Field::Cgroup(C::Anon),
        Field::Cgroup(C::File),
        Field::Cgroup(C::OomKills),
        Field::Cgroup(C::Path),
        Field::Cgroup(C::Peak),
        Field::Cgroup(C::High),
        Field::Cgroup(C::Refaults),
        Field::Cgroup(C::Psi),
    ]
};

/// The names of `fields`, as `--sort` and a filter take them.
pub fn names(fields: &[Field]) -> Vec<&'static str> {
    fields.iter().map(|f| f.name()).collect()
}

/// `--sort`'s help: every view's sort columns, from the lists above.
pub fn help() -> String {
    format!(
        "Sort column to start with, in whichever view has it (the first of each is the \
         default). Files: {}. Processes: {}. Cgroups: {}",
        names(&FILES).join(", "),
        names(&PROCESSES).join(", "),
        names(&CGROUPS).join(", ")
    )
}

// mimalloc rather than glibc's malloc for every command that observes: a live view
// allocates and frees small objects by the thousand each snapshot; on the moving host of
// `bench/host.sh` `top --interval 1s` used about a fifth less CPU with it (306 against 387
// ticks in 120 s, side by side; bench/RESULTS-host.md). The workloads that tests and
// benches measure (`__child`, `__bench`) keep glibc's: their footprints, and what their
// freed buffers still hold, are the ones the tests were written against.
#[global_allocator]
static GLOBAL: Alloc = Alloc;

struct Alloc;

/// 0: not decided yet; 1: mimalloc; 2: the system's.
static MODE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Which allocator, decided at the first allocation (before any thread or any memory
/// handed out) from this process's own command line, read without allocating.
fn system_allocator() -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    match MODE.load(Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let system = is_workload();
            MODE.store(if system { 2 } else { 1 }, Relaxed);
            system
        }
    }
}

/// Whether argv[1] is `__child` or `__bench` (`/proc/self/cmdline`, into a stack buffer).
fn is_workload() -> bool {
    let mut buf = [0u8; 512];
    // SAFETY: a NUL-terminated path; the buffer is ours and `read` writes at most its length.
    let n = unsafe {
        let fd = libc::open(
            c"/proc/self/cmdline".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return false;
        }
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        n
    };
    let Ok(n) = usize::try_from(n) else {
        return false;
    };
    let arg1 = buf[..n].split(|b| *b == 0).nth(1).unwrap_or(&[]);
    arg1 == b"__child" || arg1 == b"__bench"
}

// SAFETY: every call goes to the one allocator chosen before the first allocation, so a
// block is always freed or grown by the allocator that made it.
unsafe impl std::alloc::GlobalAlloc for Alloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        if system_allocator() {
            std::alloc::System.alloc(layout)
        } else {
            mimalloc::MiMalloc.alloc(layout)
        }
    }
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        if system_allocator() {
            std::alloc::System.alloc_zeroed(layout)
        } else {
            mimalloc::MiMalloc.alloc_zeroed(layout)
        }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        if system_allocator() {
            std::alloc::System.dealloc(ptr, layout)
        } else {
            mimalloc::MiMalloc.dealloc(ptr, layout)
        }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        if system_allocator() {
            std::alloc::System.realloc(ptr, layout, new)
        } else {
            mimalloc::MiMalloc.realloc(ptr, layout, new)
        }
    }
}

use std::io::Write;
use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use twofold::cli::{Cli, Command};
use twofold::cmd;

fn run(cli: Cli, out: &mut dyn Write) -> anyhow::Result<()> {
    // Every command but the workloads of `__child` and `__bench` observes: it carries the
    // mark other twofolds know it by, whatever this binary's name or build.
    if !matches!(cli.command, Command::Child(_) | Command::Bench(_)) {
        twofold::collect::observer::mark();
    }
    match cli.command {
        Command::Scan(a) => cmd::scan::run(&a, out),
        Command::Residency(a) => cmd::residency::run(&a, out),
        Command::Dupes(a) => cmd::dupes::run(&a, out),
        Command::Run(a) => cmd::run::run(&a, out),
        Command::Compare(a) => cmd::compare::run(&a, out),
        Command::Pressure(a) => cmd::pressure::run(&a, out),
        Command::Demo(a) => cmd::demo::run(&a, out),
        Command::Inspect(a) => cmd::inspect::run(&a, out),
        Command::Trace(a) => cmd::trace::run(&a, out),
        Command::Probe(a) => cmd::probe::run(&a, out),
        Command::Record(a) => {
            no_thp_for_observer();
            cmd::record::record(&a, out)
        }
        Command::Replay(a) => cmd::record::replay(&a, out),
        Command::Top(a) => {
            no_thp_for_observer();
            cmd::top::run(&a, out)
        }
        Command::Dump(a) => cmd::record::dump(&a, out),
        Command::Snapshot(a) => cmd::record::snapshot(&a, out),
        Command::Serve(a) => {
            no_thp_for_observer();
            cmd::serve::run(&a, out)
        }
        Command::Child(a) => cmd::child::run(&a),
        Command::Bench(a) => cmd::bench::run(&a, out),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "twofold", out);
            Ok(())
        }
        Command::Man(a) => cmd::man::run(&a, out),
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Parses the command line; a usage error is one line on stderr and exit 2, like every
/// other error (help and version print as clap formats them).
fn parse() -> Result<Cli, ExitCode> {
    use clap::error::ErrorKind;
    match Cli::try_parse() {
        Ok(cli) => Ok(cli),
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            e.exit()
        }
        Err(e) if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            // No command: one line naming what is missing, not the help with no error.
            let names: Vec<String> = Cli::command()
                .get_subcommands()
                .filter(|c| !c.is_hide_set() && c.get_name() != "help")
                .map(|c| c.get_name().to_string())
                .collect();
            eprintln!(
                "twofold: error: no command given: one of {} ('twofold --help' says what each does)",
                names.join(", ")
            );
            Err(ExitCode::from(2))
        }
        Err(e) => {
            let text = e.render().to_string();
            // The message, up to the blank line before clap's usage and tips, as one line.
            let message: Vec<&str> = text
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            let line = message.join(" ");
            let line = line.strip_prefix("error: ").unwrap_or(&line);
            eprintln!("twofold: error: {line}");
            Err(ExitCode::from(2))
        }
    }
}

// mimalloc's own option setter (the static library that `mimalloc` links: `mimalloc.h`).
extern "C" {
    fn mi_option_set(option: libc::c_int, value: libc::c_long);
    #[cfg(test)]
    fn mi_option_get(option: libc::c_int) -> libc::c_long;
}

/// `mi_option_purge_delay` in mimalloc's `mi_option_e` (v2 and v3 alike).
const MI_OPTION_PURGE_DELAY: libc::c_int = 15;

/// Memory that mimalloc frees is handed back to the kernel after this long unused, not
/// after its default 1 s: a live view's snapshot, 1 s after the last, allocated the pages
/// that the last one freed and faulted them in again (195 minor faults a second for `top
/// --interval 1s` on `bench/host.sh`; 56 with 10 s, and 12–23% less CPU in two side-by-side
/// runs, bench/RESULTS-host.md). `MIMALLOC_PURGE_DELAY` in the environment wins.
const PURGE_DELAY_MS: libc::c_long = 10_000;

/// Sets mimalloc's purge delay where mimalloc is this process's allocator.
fn tune_allocator() {
    if !system_allocator() && std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets one of mimalloc's options (an atomic store); valid at any time.
        unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    }
}

#[cfg(test)]
#[test]
fn an_observer_keeps_freed_memory_ten_seconds() {
    // This test binary observes (it is no `__child`): mimalloc is its allocator.
    tune_allocator();
    // SAFETY: reads one of mimalloc's options.
    let got = unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) };
    let want = std::env::var("MIMALLOC_PURGE_DELAY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(PURGE_DELAY_MS);
    assert_eq!(got, want);
}

/// For a long-running observer (`top`, `serve`, `record`), which starts no process: no
/// transparent huge page in any of its own mappings (`PR_SET_THP_DISABLE`, whatever the
/// host's THP mode; mimalloc advises its arenas `MADV_HUGEPAGE`). khugepaged collapsed
/// `serve`'s heap every few seconds on `bench/host.sh` (90 to 103 collapses in 70 s, 96 MiB
/// of its RSS in huge pages), and each collapse moves the host counter that says no page
/// was merged or collapsed since a share-out (`dupes::physical::SilentMoves`): the copies'
/// sharers were read again each minute because of twofold itself. The flag would pass to
/// children, so the commands that start workloads keep the host's default.
fn no_thp_for_observer() {
    // SAFETY: prctl with PR_SET_THP_DISABLE only sets a flag of this process's mm.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

fn main() -> ExitCode {
    tune_allocator();
    let cli = match parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let result = run(cli, &mut out).and_then(|()| out.flush().map_err(Into::into));
    // Interrupted: whatever the command returned, the signal thread removes what it
    // created and exits with 128 + the signal.
    twofold::cleanup::wait_if_interrupted();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<cmd::ConditionMet>().is_some() => {
            drop(out);
            if let Some(met) = e.downcast_ref::<cmd::ConditionMet>() {
                for line in &met.0 {
                    eprintln!("twofold: {}", twofold::render::safe::safe(line));
                }
            }
            ExitCode::from(1)
        }
        Err(e) => {
            drop(out);
            twofold::cleanup::wait_if_interrupted();
            // The chain quotes paths and values given from the outside: escaped.
            let msg = format!("{e:#}");
            eprintln!("twofold: error: {}", twofold::render::safe::safe(&msg));
            ExitCode::from(2)
        }
    }
}

//! `twofold man`: the man pages, one per command (clap_mangen), each with EXIT STATUS and
//! ENVIRONMENT sections. `twofold man` prints twofold(1), `twofold man scan` prints
//! twofold-scan(1), `twofold man --dir DIR` writes every page, so each page that
//! twofold(1) names exists.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use clap::CommandFactory;

use crate::cli::{Cli, ManArgs};

/// The exit statuses, for every page.
const EXIT_STATUS: &[(&str, &str)] = &[
    ("0", "Success (a closed pipe on stdout is success too)."),
    (
        "1",
        "A condition asked for with scan \\-\\-fail\\-on holds; each is named on stderr.",
    ),
    (
        "2",
        "Bad input (a usage error, a missing or wrong path, an unknown pid or cgroup, a \
         value out of range) or an error: one line on stderr naming the thing.",
    ),
    (
        "128+N",
        "Interrupted by signal N (130 for SIGINT, 143 for SIGTERM) during a campaign, after \
         removing what it created.",
    ),
];

/// The environment variables twofold reads, for every page.
const ENVIRONMENT: &[(&str, &str)] = &[
    ("NO_COLOR", "Set and not empty: top draws without colours."),
    (
        "HF_HUB_CACHE, HF_HOME, OLLAMA_MODELS, TORCH_HOME",
        "Model stores scan looks in (without paths) for files a process could hold a copy \
         of: the Hugging Face hub cache, ollama's blobs, the torch hub checkpoints.",
    ),
    (
        "TWOFOLD_MODEL_PATH",
        "More model store directories, separated by colons.",
    ),
    (
        "HOME, XDG_DATA_HOME",
        "The default store of record, replay and dump when not root \
         ($XDG_DATA_HOME/twofold/store, else ~/.local/share/twofold/store); HOME also \
         locates the default model stores.",
    ),
    (
        "XDG_RUNTIME_DIR, TWOFOLD_ATTEST_DIR",
        "Where device-copy attestations of twofold's own loaders are kept (default \
         /run/twofold/device as root, else $XDG_RUNTIME_DIR/twofold/device).",
    ),
    (
        "TWOFOLD_UPLOADS_DIR",
        "Where a resident upload tracer (serve or record with --trace or --trace-uploads) \
         keeps its upload ledger for the host's other twofold processes, and where scan, \
         top and record without tracing of their own read it (default \
         /run/twofold/uploads as root, else $XDG_RUNTIME_DIR/twofold/uploads).",
    ),
    (
        "TWOFOLD_INDEX_CACHE, XDG_CACHE_HOME",
        "Where the proof keeps the content index's points of each model file version \
         (default /var/cache/twofold/index as root, else $XDG_CACHE_HOME/twofold/index, \
         at most 256 MiB); off: read them from the files at every run.",
    ),
    (
        "TWOFOLD_LLAMA_CPU",
        "The ggml CPU variant of the llama.cpp whose repacked layouts the proof looks for \
         (haswell, sapphirerapids, armv8.2_1...: the libggml-cpu-VARIANT.so it loads); \
         unset: a build for this host.",
    ),
    (
        "TWOFOLD_FS_DEADLINE",
        "How long a file's stat, open or residency read may take before its filesystem is \
         said not to answer (seconds; default 2).",
    ),
    (
        "TWOFOLD_BPF_OBJECTS",
        "A directory of BPF objects to load instead of the built-in ones.",
    ),
    (
        "TWOFOLD_PROFILE",
        "Set: print the time of each collection phase, and each snapshot's CPU, on stderr.",
    ),
    (
        "MIMALLOC_PURGE_DELAY",
        "Milliseconds before the observing commands hand freed memory back (mimalloc's option; default here 10000).",
    ),
    (
        "NODE_NAME",
        "serve: the node label of every series (the DaemonSet sets it from the pod's node).",
    ),
    (
        "TWOFOLD_LIBCUDA",
        "Paths (:-separated) of CUDA driver libraries to put the upload probes on, beside \
         those the processes map and /etc/ld.so.cache names.",
    ),
    (
        "TWOFOLD_LIBCUFILE",
        "Paths (:-separated) of GPUDirect Storage libraries (libcufile.so*) to put the \
         cuFileRead probes on, beside those the processes map, /etc/ld.so.cache names and \
         CUDA's install paths.",
    ),
    (
        "TWOFOLD_NO_PAGEMAP_SCAN",
        "Set: find present pages with /proc/PID/pagemap, not PAGEMAP_SCAN (the benchmarks \
         compare the two).",
    ),
    (
        "TWOFOLD_NO_TASK_ITER",
        "Set: live views (top, serve, record) read every process's statm, io and schedstat \
         from /proc, not one read of the BPF task iterator (the benchmarks compare the two).",
    ),
    (
        "LD_LIBRARY_PATH",
        "Where probe's GPU jobs find the Vulkan and CUDA drivers.",
    ),
];

/// Escapes text for roff: backslashes and hyphens, and a leading control character.
fn roff(s: &str) -> String {
    let s = s.replace('\\', "\\\\").replace('-', "\\-");
    // Already-escaped `\-` in the tables above came in as `\\-`: undo the doubling.
    let s = s.replace("\\\\\\-", "\\-");
    match s.chars().next() {
        Some('.') | Some('\'') => format!("\\&{s}"),
        _ => s,
    }
}

fn section(w: &mut dyn Write, title: &str, items: &[(&str, &str)]) -> std::io::Result<()> {
    writeln!(w, ".SH \"{title}\"")?;
    for (k, v) in items {
        writeln!(w, ".TP")?;
        writeln!(w, "\\fB{}\\fR", roff(k))?;
        writeln!(w, "{}", roff(v))?;
    }
    Ok(())
}

/// One page: clap_mangen's sections, then EXIT STATUS, ENVIRONMENT and SEE ALSO.
pub fn render(cmd: clap::Command, w: &mut dyn Write) -> std::io::Result<()> {
    let top = cmd.get_name() == "twofold";
    let has_subcommands = cmd.get_subcommands().any(|s| !s.is_hide_set());
    let extra = cmd.get_after_help().is_some() || cmd.get_after_long_help().is_some();
    let cmd_name = cmd.get_name().to_string();
    let synopsis = synopsis(&cmd);
    let man = clap_mangen::Man::new(cmd);
    man.render_title(w)?;
    man.render_name_section(w)?;
    writeln!(w, ".SH SYNOPSIS")?;
    writeln!(w, "{synopsis}")?;
    man.render_description_section(w)?;
    man.render_options_section(w)?;
    if has_subcommands {
        man.render_subcommands_section(w)?;
    }
    if extra {
        man.render_extra_section(w)?;
    }
    let name = cmd_name.as_str();
    let statuses: Vec<(&str, &str)> = EXIT_STATUS
        .iter()
        .copied()
        .filter(|(code, _)| match *code {
            "1" => top || name == "scan",
            "128+N" => top || CAMPAIGNS.contains(&name),
            _ => true,
        })
        .collect();
    section(w, "EXIT STATUS", &statuses)?;
    section(w, "ENVIRONMENT", ENVIRONMENT)?;
    writeln!(w, ".SH \"SEE ALSO\"")?;
    if top {
        writeln!(
            w,
            "The page of each command above, and https://github.com/twofold/twofold"
        )?;
    } else {
        writeln!(w, "twofold(1)")?;
    }
    man.render_version_section(w)?;
    Ok(())
}

/// The commands that run campaigns (and exit 128+N when interrupted).
const CAMPAIGNS: [&str; 3] = ["run", "compare", "pressure"];

/// The SYNOPSIS line: each option with its value's name (`[--pid PID]...`), flags bare,
/// then the positional arguments.
fn synopsis(cmd: &clap::Command) -> String {
    let bin = match cmd.get_name() {
        "twofold" => "twofold".to_string(),
        other => format!("twofold {other}"),
    };
    let mut parts = vec![format!("\\fB{}\\fR", roff(&bin))];
    let many = |a: &clap::Arg| matches!(a.get_action(), clap::ArgAction::Append);
    for a in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
        if a.is_positional() {
            continue;
        }
        let flag = match (a.get_long(), a.get_short()) {
            (Some(l), _) => format!("\\fB\\-\\-{}\\fR", roff(l)),
            (None, Some(c)) => format!("\\fB\\-{c}\\fR"),
            _ => continue,
        };
        let takes = a.get_num_args().is_some_and(|n| n.takes_values())
            && !matches!(
                a.get_action(),
                clap::ArgAction::SetTrue
                    | clap::ArgAction::SetFalse
                    | clap::ArgAction::Count
                    | clap::ArgAction::Help
                    | clap::ArgAction::Version
            );
        let value = if takes {
            let names = a
                .get_value_names()
                .map(|v| {
                    v.iter()
                        .map(|n| n.to_string())
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_else(|| a.get_id().as_str().to_uppercase());
            if a.get_num_args().is_some_and(|n| n.min_values() == 0) {
                format!(" [\\fI{}\\fR]", roff(&names))
            } else {
                format!(" \\fI{}\\fR", roff(&names))
            }
        } else {
            String::new()
        };
        let dots = if many(a) { "..." } else { "" };
        let body = format!("{flag}{value}");
        parts.push(if a.is_required_set() {
            format!("{body}{dots}")
        } else {
            format!("[{body}]{dots}")
        });
    }
    for a in cmd.get_positionals().filter(|a| !a.is_hide_set()) {
        let name = a
            .get_value_names()
            .and_then(|v| v.first().map(|n| n.to_string()))
            .unwrap_or_else(|| a.get_id().as_str().to_uppercase());
        let dots = if a.get_num_args().is_some_and(|n| n.max_values() > 1) {
            "..."
        } else {
            ""
        };
        let body = format!("\\fI{}\\fR", roff(&name));
        parts.push(if a.is_required_set() {
            format!("{body}{dots}")
        } else {
            format!("[{body}]{dots}")
        });
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        parts.push("\\fICOMMAND\\fR".to_string());
    }
    parts.join(" ")
}

/// `cmd` and every command under it without clap's `help` subcommand (it has no page).
fn without_help(cmd: clap::Command) -> clap::Command {
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    names
        .iter()
        .fold(cmd.disable_help_subcommand(true), |c, n| {
            c.mut_subcommand(n, without_help)
        })
}

/// The commands that get a page of their own: every one twofold(1) lists.
pub fn commands() -> Vec<clap::Command> {
    top()
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(|s| s.clone().version(env!("CARGO_PKG_VERSION")))
        .collect()
}

/// The built top-level command, without clap's `help` subcommands.
fn top() -> clap::Command {
    let mut cli = without_help(Cli::command());
    cli.build();
    cli
}

fn write_page(dir: &Path, cmd: clap::Command) -> anyhow::Result<()> {
    let name = cmd.get_display_name().unwrap_or(cmd.get_name()).to_string();
    let path = dir.join(format!("{name}.1"));
    let mut buf = Vec::new();
    render(cmd, &mut buf)?;
    std::fs::write(&path, buf).with_context(|| format!("cannot write '{}'", path.display()))
}

pub fn run(args: &ManArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    if let Some(dir) = &args.dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create '{}'", dir.display()))?;
        write_page(dir, top())?;
        let mut n = 1;
        for c in commands() {
            write_page(dir, c)?;
            n += 1;
        }
        writeln!(
            out,
            "twofold man: {n} pages in '{}'",
            crate::render::safe::safe_path(dir)
        )?;
        return Ok(());
    }
    let mut page = Vec::new();
    match &args.command {
        None => render(top(), &mut page)?,
        Some(name) => {
            let Some(c) = commands().into_iter().find(|c| c.get_name() == name) else {
                let names: Vec<String> = commands()
                    .iter()
                    .map(|c| c.get_name().to_string())
                    .collect();
                anyhow::bail!("no command '{name}' (one of: {})", names.join(", "));
            };
            render(c, &mut page)?;
        }
    }
    // On a terminal the page is read, not its roff: through man(1) and its pager, as `git
    // help` does; anywhere else (a pipe, a file) the roff itself.
    use std::io::IsTerminal;
    if std::io::stdout().is_terminal() && show_with_man(&page) {
        return Ok(());
    }
    out.write_all(&page)?;
    Ok(())
}

/// Shows a page with `man -l -` (its formatter and pager); false if man(1) cannot run.
fn show_with_man(page: &[u8]) -> bool {
    use std::process::{Command, Stdio};
    let Ok(mut child) = Command::new("man")
        .args(["-l", "-"])
        .stdin(Stdio::piped())
        .spawn()
    else {
        return false;
    };
    if let Some(mut stdin) = child.stdin.take() {
        // A pager quit early closes the pipe: that is not an error.
        let _ = stdin.write_all(page);
    }
    child.wait().is_ok_and(|s| s.success())
}

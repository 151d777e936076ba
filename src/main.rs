use std::io::Write;
use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use twofold::cli::{Cli, Command};
use twofold::cmd;

fn run(cli: Cli, out: &mut dyn Write) -> anyhow::Result<()> {
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
        Command::Child(a) => cmd::child::run(&a),
        Command::Bench(a) => cmd::bench::run(&a, out),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "twofold", out);
            Ok(())
        }
        Command::Man => {
            clap_mangen::Man::new(Cli::command()).render(out)?;
            Ok(())
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let result = run(cli, &mut out).and_then(|()| out.flush().map_err(Into::into));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
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

//! The `hystall` binary: parses the command line and runs a subcommand. Errors
//! end here as one line on stderr (anyhow at the edge, thiserror inside).

use clap::Parser;
use hystall::cli::{Cli, Command};
use hystall::commands;

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("HYSTALL_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let res = match cli.command {
        Command::Watch(args) => runtime().and_then(|rt| rt.block_on(commands::watch::run(args))),
        Command::Top(args) => runtime().and_then(|rt| rt.block_on(commands::top::run(args))),
        Command::Doctor(args) => commands::doctor::run(args),
        Command::Lab(args) => hystall::lab::run(args),
        Command::Pcap(args) => commands::pcap::run(args),
        Command::Record(args) => runtime().and_then(|rt| rt.block_on(commands::record::run(args))),
    };
    if let Err(e) = res {
        eprintln!("hystall: {}", one_line(&e));
        std::process::exit(1);
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?)
}

/// "context: cause: cause" on one line.
fn one_line(e: &anyhow::Error) -> String {
    e.chain().map(|c| c.to_string()).collect::<Vec<_>>().join(": ")
}

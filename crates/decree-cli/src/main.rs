//! The `decree` command.
//!
//! One module per subcommand, each with its clap arguments (`Args`) and a `run` function;
//! `main` only parses and dispatches, so adding a subcommand is a new module, one enum
//! variant and one match arm. Errors are printed once, as `decree: <what went wrong>`, with
//! exit status 1; usage errors are clap's (exit status 2).

mod bench;
mod bench_log;
mod common;
mod pair;
mod recover;
mod serve;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// `decree --version`: the version and the optional features this binary was built with, so
/// that an operator (and the crash tests, which need `crash-points`) can tell whether a
/// binary elects its primary on etcd before configuring a pair that way.
#[cfg(all(feature = "etcd", feature = "crash-points"))]
const LONG_VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\nfeatures: etcd crash-points");
#[cfg(all(feature = "etcd", not(feature = "crash-points")))]
const LONG_VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\nfeatures: etcd");
#[cfg(all(not(feature = "etcd"), feature = "crash-points"))]
const LONG_VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\nfeatures: crash-points");
#[cfg(all(not(feature = "etcd"), not(feature = "crash-points")))]
const LONG_VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\nfeatures: none");

/// decree: a fast, crash-safe XA two-phase-commit transaction manager.
#[derive(Debug, Parser)]
#[command(name = "decree", version, long_version = LONG_VERSION, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Measure the transaction manager with the LIXA workload (open, begin, commit, close).
    // Boxed: its arguments are several times the size of the other subcommands'.
    Bench(Box<bench::Args>),
    /// Measure the log engines' durable appends against raw pwrite + fdatasync.
    BenchLog(bench_log::Args),
    /// Run the state server (owns the decision log; clients connect over a Unix socket or TCP).
    Serve(serve::Args),
    /// Inspect and resolve in-doubt transactions by hand (the log's owner must be stopped).
    Recover(recover::Args),
    /// Make a backup member of a pair its primary (the operator says the peer is down).
    Promote(pair::PromoteArgs),
    /// Show a pair member's role, epoch and catch-up state (JSON).
    Status(pair::StatusArgs),
    /// Hand a pair's lead to its in-sync backup (a planned switchover; a pair elected on etcd).
    Switchover(pair::SwitchoverArgs),
    /// Pause a pair's automatic failover (recorded in etcd) to restart members for maintenance.
    Pause(pair::PauseArgs),
    /// Resume a pair's automatic failover after `decree pause`.
    Resume(pair::PauseArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_) | Command::Bench(_)) {
        // Printing to a closed pipe (`decree recover list | head`) should end the program
        // quietly, as other command-line tools do, rather than panic inside `println!`.
        // Never for the commands that run a server: with the default disposition, a peer
        // that closes its socket while the server writes to it would kill the server.
        // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    // `decree bench` is a client: the standard OTEL_* variables give it spans (kept until
    // the end, when the exporter sends what is left). The server has `[tracing]` instead.
    let _exporter = match &cli.command {
        Command::Bench(_) => match decree_otel::install_from_env("decree-bench") {
            Ok(exporter) => exporter,
            Err(e) => {
                eprintln!("decree: {e}");
                return ExitCode::FAILURE;
            }
        },
        _ => None,
    };
    let outcome = match cli.command {
        Command::Bench(args) => bench::run(*args),
        Command::BenchLog(args) => bench_log::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Recover(args) => recover::run(args),
        Command::Promote(args) => pair::promote(args),
        Command::Status(args) => pair::status(args),
        Command::Switchover(args) => pair::switchover(args),
        Command::Pause(args) => pair::pause(args, true),
        Command::Resume(args) => pair::pause(args, false),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("decree: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Parses a command line as the binary does, for the subcommands' tests.
#[cfg(test)]
fn parse_command(line: &str) -> Command {
    try_parse_command(line).unwrap_or_else(|e| panic!("{line}: {e}"))
}

/// Parses a command line as the binary does, returning clap's refusal.
#[cfg(test)]
fn try_parse_command(line: &str) -> Result<Command, clap::Error> {
    Cli::try_parse_from(line.split_whitespace()).map(|cli| cli.command)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}

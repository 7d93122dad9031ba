//! `decree promote` and `decree status`: the operator's two requests to a member of a
//! primary + backup pair, over the control socket in its log directory.
//!
//! Promotion is the operator's statement that the other member is down (as `pg_ctl
//! promote` is): a backup that has caught up since it started becomes the primary of a
//! new epoch; `--force` promotes one that has not (the first promotion of a new pair, or a
//! member whose peer's disk is lost), at the risk of losing what only the peer held, and
//! is recorded in the member's `PAIR` file.

use crate::common::CliResult;
use decree_server::ServerConfig;
use std::path::PathBuf;

/// Arguments of `decree promote`.
#[derive(Debug, clap::Args)]
pub struct PromoteArgs {
    /// The member's TOML configuration (its `log_dir` holds the control socket).
    #[arg(long, short = 'c')]
    pub config: PathBuf,
    /// Promote although this member has not caught up since it started (recorded).
    #[arg(long)]
    pub force: bool,
}

/// Arguments of `decree status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The member's TOML configuration (its `log_dir` holds the control socket).
    #[arg(long, short = 'c')]
    pub config: PathBuf,
}

/// Asks the member to lead; prints its answer, fails when it refused.
pub fn promote(args: PromoteArgs) -> CliResult {
    let config = ServerConfig::from_toml_file(&args.config)?;
    let request = if args.force { "promote --force" } else { "promote" };
    let answer = decree_server::control_request(&config.log_dir, request)?;
    if let Some(why) = answer.strip_prefix("refused: ") {
        return Err(format!("promotion refused: {why}").into());
    }
    println!("{answer}");
    Ok(())
}

/// Prints the member's role, epoch and whether it caught up or is strict, as JSON.
pub fn status(args: StatusArgs) -> CliResult {
    let config = ServerConfig::from_toml_file(&args.config)?;
    println!("{}", decree_server::control_request(&config.log_dir, "status")?);
    Ok(())
}

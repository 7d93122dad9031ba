//! `decree recover`: inspect and resolve in-doubt transactions by hand.
//!
//! It opens the log directory named in the configuration (refused while a server or an
//! application owns it) without running automatic recovery, asks every configured
//! resource manager for decree's prepared branches, and lists or resolves them. A choice
//! that contradicts the logged decision (or presumed abort) needs `--force` and is
//! recorded in `heuristics.log` in the log directory before any branch is touched.

use crate::common::{CliResult, Format};
use decree_server::admin::{factories_for, parse_xid, Inspector};
use decree_server::ServerConfig;
use std::path::PathBuf;

/// Arguments of `decree recover`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The TOML configuration of the server or application owning the log (see decree.example.toml).
    #[arg(long, short = 'c')]
    pub config: PathBuf,
    /// Commit or roll back on the log of a pair member anyway (the other member may lead
    /// and act on the transaction itself; recorded in the heuristics file). Not needed for
    /// a member elected on etcd when etcd shows nobody leading, no other member running and
    /// this member in sync for the pair's latest epoch.
    #[arg(long, global = true)]
    pub pair_override: bool,
    /// What to do.
    #[command(subcommand)]
    pub action: Action,
}

/// The recover actions.
#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// List in-doubt transactions: Xid, state, age, branches and their state per RM.
    List {
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
    },
    /// Commit every prepared branch of XID (needs a logged decision, or --force).
    Commit {
        /// The transaction, as `list` prints it (decree:...).
        xid: String,
        /// Commit even without a logged decision (recorded as a heuristic decision).
        #[arg(long)]
        force: bool,
    },
    /// Roll back every prepared branch of XID (refused when a commit is logged, unless --force).
    Rollback {
        /// The transaction, as `list` prints it (decree:...).
        xid: String,
        /// Roll back even though a commit decision is logged (recorded as a heuristic decision).
        #[arg(long)]
        force: bool,
    },
}

/// Runs `decree recover`.
pub fn run(args: Args) -> CliResult {
    let config = ServerConfig::from_toml_file(&args.config)?;
    let factories = factories_for(&config)?;
    let mut inspector = Inspector::open(&config, factories)?;
    if args.pair_override {
        inspector.allow_on_pair_member();
    }
    // A member elected on etcd: etcd tells whether another member leads (then resolve
    // through it) or nobody else can act (then this log may resolve without the override).
    if let Some(etcd) = config.pair.as_ref().and_then(|p| p.etcd.as_ref()) {
        inspector.consult_etcd(decree_server::etcd_cluster(&config), &etcd.pair);
    }
    match args.action {
        Action::List { format } => {
            let listing = inspector.list();
            match format {
                Format::Table => print!("{}", listing.to_table()),
                Format::Json => println!("{}", listing.to_json()),
            }
        }
        Action::Commit { xid, force } => {
            let resolution = inspector.commit(&parse_xid(&xid)?, force)?;
            println!("{resolution}");
        }
        Action::Rollback { xid, force } => {
            let resolution = inspector.rollback(&parse_xid(&xid)?, force)?;
            println!("{resolution}");
        }
    }
    Ok(())
}

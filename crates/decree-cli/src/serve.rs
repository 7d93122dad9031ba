//! `decree serve`: run the state server until SIGTERM or SIGINT.
//!
//! The configuration is a TOML file (see `decree.example.toml` at the repository root for
//! every field), with command-line flags overriding single fields; the result is validated
//! once, after the overrides, so a flag can fix what the file lacks (a listener, a
//! directory). Each `[[rm]]` entry becomes a connection factory (postgres and mariadb
//! through `decree-rm`, `dummy` for benchmarks), which the server uses to finish the phase
//! two of clients that died and to roll back their undecided prepared branches.
//!
//! Logging goes to stderr through `tracing`: warnings and errors only by default, `-v` for
//! info (start, stop, recovery), `-vv` for debug; `RUST_LOG` overrides both.

use crate::common::CliResult;

use decree_log::EngineKind;
use decree_server::ServerConfig;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Arguments of `decree serve`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Stops on SIGTERM or SIGINT: stops accepting, answers what is in flight, syncs the \
log, exits 0. The Unix socket is created with mode 0600. A non-loopback --tcp address needs \
--allow-remote.")]
pub struct Args {
    /// The TOML configuration file (see decree.example.toml); without it, --dir and a
    /// listener (--unix or --tcp) are needed.
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
    /// The log directory (overrides `log_dir`).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The log engine (overrides `engine`).
    #[arg(long)]
    pub engine: Option<EngineKind>,
    /// Recovery point objective in milliseconds, 0 to sync before acknowledging (overrides `rpo_ms`).
    #[arg(long)]
    pub rpo: Option<u64>,
    /// Listen on this Unix socket path (overrides `unix`).
    #[arg(long)]
    pub unix: Option<PathBuf>,
    /// Listen on this TCP address, e.g. 127.0.0.1:7411 (overrides `tcp`).
    #[arg(long)]
    pub tcp: Option<SocketAddr>,
    /// Accept a non-loopback TCP address (overrides `allow_remote`).
    #[arg(long)]
    pub allow_remote: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics, loopback only (overrides `metrics`).
    #[arg(long)]
    pub metrics: Option<SocketAddr>,
    /// The node id minted into every Xid, at least 1 (overrides `node`).
    #[arg(long)]
    pub node: Option<u32>,
    /// More log output on stderr: -v for info, -vv for debug (RUST_LOG overrides).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

impl Args {
    /// The configuration: the file's (or defaults when there is none) with the flags
    /// applied, validated.
    pub fn config(&self) -> Result<ServerConfig, Box<dyn std::error::Error>> {
        let mut config = match (&self.config, &self.dir) {
            (Some(path), _) => read_config(path)?,
            (None, Some(dir)) => ServerConfig::new(dir, EngineKind::Journal),
            (None, None) => return Err("decree serve needs --config FILE or --dir DIR".into()),
        };
        if let Some(dir) = &self.dir {
            config.log_dir = dir.clone();
        }
        if let Some(engine) = self.engine {
            config.engine = engine.name().to_string();
        }
        if let Some(rpo) = self.rpo {
            config.rpo_ms = rpo;
        }
        if let Some(path) = &self.unix {
            config.unix = Some(path.clone());
        }
        if let Some(addr) = self.tcp {
            config.tcp = Some(addr);
        }
        if self.allow_remote {
            config.allow_remote = true;
        }
        if let Some(addr) = self.metrics {
            config.metrics = Some(addr);
        }
        if let Some(node) = self.node {
            config.node = node;
        }
        config.validate()?;
        Ok(config)
    }
}

/// Reads the file without validating it: the flags may still complete it.
fn read_config(path: &PathBuf) -> Result<ServerConfig, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read configuration {}: {e}", path.display()))?;
    let config: ServerConfig = toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(config)
}

/// Installs the stderr logger: warnings by default, more with `-v`, `RUST_LOG` first.
fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // A second installation (tests calling `run` twice) is refused; the first one stays.
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// Runs the server until SIGTERM or SIGINT.
pub fn run(args: Args) -> CliResult {
    init_tracing(args.verbose);
    let config = args.config()?;
    let factories = config.rm_factories()?;
    decree_server::run_with(config, factories)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Args {
        match crate::parse_command(line) {
            crate::Command::Serve(args) => args,
            other => panic!("{line}: parsed as {other:?}"),
        }
    }

    #[test]
    fn flags_override_the_file_and_complete_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("decree.toml");
        std::fs::write(
            &file,
            "log_dir = \"/var/lib/decree\"\nrpo_ms = 5\n[[rm]]\nname = \"d\"\nkind = \"dummy\"\n",
        )
        .unwrap();
        // The file has no listener: refused alone, completed by --unix.
        let alone = parse(&format!("decree serve --config {}", file.display())).config();
        assert!(alone.err().map(|e| e.to_string()).unwrap_or_default().contains("no listener"));
        let args = parse(&format!(
            "decree serve --config {} --unix /tmp/x.sock --engine volatile --rpo 0 --node 3 \
             --metrics 127.0.0.1:0 --dir /d",
            file.display()
        ));
        let config = args.config().unwrap();
        assert_eq!(config.unix, Some(PathBuf::from("/tmp/x.sock")));
        assert_eq!((config.engine.as_str(), config.rpo_ms, config.node), ("volatile", 0, 3));
        assert_eq!(config.log_dir, PathBuf::from("/d"));
        let names: Vec<String> =
            config.rm_factories().unwrap().iter().map(|f| f.name().to_string()).collect();
        assert_eq!(names, ["d"]);
    }

    #[test]
    fn the_example_file_parses_and_validates() {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../decree.example.toml");
        let config = read_config(&path).unwrap();
        config.validate().unwrap();
        assert_eq!(config, ServerConfig::from_toml_file(&path).unwrap());
        assert_eq!(config.unix, Some(PathBuf::from("/run/decree/decree.sock")));
        assert_eq!(config.limits, decree_server::Limits::default());
        assert_eq!(
            config.recovery,
            decree_server::RecoveryConfig::default(),
            "the example shows the defaults"
        );
    }

    #[test]
    fn remote_addresses_need_allow_remote_and_kinds_are_checked() {
        let refused = parse("decree serve --dir /d --tcp 0.0.0.0:7411").config();
        assert!(refused.err().map(|e| e.to_string()).unwrap_or_default().contains("allow_remote"));
        // --allow-remote passes the first gate; since TLS came in (3f2c3cd) the second wants
        // a [tls] section or plaintext said out loud, which only the file can give.
        let without_tls = parse("decree serve --dir /d --tcp 0.0.0.0:7411 --allow-remote").config();
        assert!(without_tls.err().map(|e| e.to_string()).unwrap_or_default().contains("insecure_plaintext"));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plaintext.toml");
        std::fs::write(&file, "log_dir = \"/d\"\ninsecure_plaintext = true\n").unwrap();
        let line = format!("decree serve -c {} --tcp 0.0.0.0:7411 --allow-remote", file.display());
        assert!(parse(&line).config().is_ok());
        assert!(parse("decree serve").config().is_err());
        let mut config = ServerConfig::new("/d", EngineKind::Volatile);
        config.rm.push(decree_server::RmConfig {
            name: "o".into(),
            kind: "oracle".into(),
            dsn: String::new(),
        });
        let message = config.rm_factories().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("unknown kind \"oracle\""), "{message}");
    }
}

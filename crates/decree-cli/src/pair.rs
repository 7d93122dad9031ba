//! `decree promote` and `decree status`: the operator's two requests to a member of a
//! primary + backup pair, over the control socket in its log directory.
//!
//! Promotion is the operator's statement that the other member is down (as `pg_ctl
//! promote` is): a backup that has caught up since it started becomes the primary of a
//! new epoch; `--force` promotes one that has not (the first promotion of a new pair, or a
//! member whose peer's disk is lost), at the risk of losing what only the peer held, and
//! is recorded in the member's `PAIR` file.

use crate::common::{CliResult, Format};
use decree_server::ServerConfig;
use std::path::PathBuf;

/// Arguments of `decree promote`.
#[derive(Debug, clap::Args)]
pub struct PromoteArgs {
    /// The member's TOML configuration (its `log_dir` holds the control socket).
    #[arg(long, short = 'c')]
    pub config: PathBuf,
    /// Promote although this member has not caught up since it started (recorded). Only
    /// when the other member is certainly stopped (killed, powered off, its disk lost): if
    /// it may still run (paused, cut off), forcing can lose decisions it acknowledged alone,
    /// and both may acknowledge until it learns of the new epoch. Without --force the
    /// promotion needs a caught-up member.
    #[arg(long)]
    pub force: bool,
}

/// Arguments of `decree status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The member's TOML configuration (its `log_dir` holds the control socket).
    #[arg(long, short = 'c')]
    pub config: PathBuf,
    /// `table`: a few lines for people; `json`: the member's answer, one JSON line.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
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

/// Prints the member's role, epoch, whether its peer is in sync, its link, lag and
/// promotion: as lines for people, or as the member's JSON line (`--format json`).
pub fn status(args: StatusArgs) -> CliResult {
    let config = ServerConfig::from_toml_file(&args.config)?;
    let answer = decree_server::control_request(&config.log_dir, "status")?;
    match args.format {
        Format::Json => println!("{answer}"),
        Format::Table => {
            let status: serde_json::Value = serde_json::from_str(&answer).map_err(|e| {
                format!("the member answered something that is not its status ({e}): {answer}")
            })?;
            print!("{}", status_text(&status));
        }
    }
    Ok(())
}

/// The status for people: what the member is, then one line per fact.
fn status_text(s: &serde_json::Value) -> String {
    let yes_no = |v: &serde_json::Value| if v.as_bool() == Some(true) { "yes" } else { "no" };
    let role = s["role"].as_str().unwrap_or("unknown");
    if role == "changing" {
        return "the member is changing role (being promoted); ask again\n".to_string();
    }
    let epoch = match s["epoch_raw"].as_u64() {
        Some(0) => "no epoch yet (never led, never followed)".to_string(),
        _ => format!("epoch {} (raw {})", text(&s["epoch"]), s["epoch_raw"]),
    };
    let mut out = format!("member {}: {role} of {epoch}\n", s["member"]);
    let link = &s["link"];
    let connected = if link["connected"].as_bool() == Some(true) { "connected" } else { "not connected" };
    let last_end =
        link["last_end"].as_str().map(|why| format!("\n  the last link ended: {why}")).unwrap_or_default();
    if role == "primary" {
        let strict = if s["strict"].as_bool() == Some(true) {
            "yes: acknowledges only what its backup holds"
        } else {
            "no: runs alone, acknowledges on its own write, until a backup catches up"
        };
        out += &format!("  backup in sync (strict): {strict}\n  link to the backup: {connected}{last_end}\n");
        let lag = &s["lag"];
        let oldest = lag["oldest_ms"].as_f64().map(|ms| format!(" (the oldest waiting {ms:.1} ms)"));
        out += &format!(
            "  records not acknowledged by the backup: {}{}\n  decisions waiting for the backup: {}\n",
            lag["records"],
            oldest.unwrap_or_default(),
            lag["decisions_waiting"]
        );
        let p = &s["promotion"];
        let ago_s = p["at_unix_ms"].as_u64().map(|at| now_unix_ms().saturating_sub(at) / 1000);
        out += &format!(
            "  promoted {} s ago, in {:.1} ms{}\n",
            ago_s.map_or_else(|| "?".to_string(), |s| s.to_string()),
            p["took_ms"].as_f64().unwrap_or(0.0),
            if p["forced"].as_bool() == Some(true) { ", forced" } else { "" }
        );
    } else {
        out += &format!(
            "  caught up with the primary: {} (promotion without --force needs it)\n",
            yes_no(&s["caught_up"])
        );
        out += &format!("  link from the primary: {connected}{last_end}\n");
        out +=
            &format!("  acknowledges: {}\n  live decisions held: {}\n", text(&s["ack"]), s["live_decisions"]);
        if let Some(us) = s["busy_poll_us"].as_u64().filter(|&us| us > 0) {
            out += &format!("  busy poll: {us} us after each batch ({} turns awake)\n", s["busy_poll_turns"]);
        }
    }
    let etcd = &s["etcd"];
    if etcd.is_object() {
        out += &format!(
            "  elected on etcd ({}): leads {}, lease alive {}, run {}, {} etcd requests\n",
            text(&etcd["leader_key"]),
            yes_no(&etcd["leads"]),
            yes_no(&etcd["lease_alive"]),
            text(&etcd["run"]),
            etcd["requests"]
        );
        // What keeps this member out of the election: etcd unreachable, or refusing it.
        if let Some(error) = etcd["error"].as_str() {
            out += &format!("  etcd {}: {error}\n", text(&etcd["state"]));
        }
    }
    out
}

/// A JSON string without its quotes (anything else as JSON).
fn text(v: &serde_json::Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_elected_members_status_says_whether_it_leads_on_etcd_and_its_lease_lives() {
        let status = serde_json::json!({
            "role": "backup", "member": 2, "epoch": "3.1", "epoch_raw": 769, "caught_up": true,
            "ack": "durable", "live_decisions": 4, "link": {"connected": true, "last_end": null},
            "etcd": {"leader_key": "/decree/orders/leader", "leads": false, "lease_alive": true,
                     "run": "00000000000000ff", "requests": 12},
        });
        let text = status_text(&status);
        assert!(
            text.contains("elected on etcd (/decree/orders/leader): leads no, lease alive yes, run 00000000000000ff, 12 etcd requests"),
            "{text}"
        );
        assert!(!text.contains("etcd ok"), "{text}");
        let mut refused = status.clone();
        refused["etcd"]["state"] = "refused".into();
        refused["etcd"]["error"] = "etcd refused user decree's password: check [pair.etcd] user".into();
        let text = status_text(&refused);
        assert!(
            text.contains("  etcd refused: etcd refused user decree's password: check [pair.etcd] user\n"),
            "{text}"
        );
        let without = status_text(&serde_json::json!({"role": "backup", "member": 2, "epoch_raw": 0}));
        assert!(!without.contains("etcd"), "{without}");
    }
}

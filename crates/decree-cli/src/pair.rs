//! `decree promote`, `decree status` and `decree switchover`: the operator's requests to a
//! member of a primary + backup pair, over the control socket in its log directory.
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

/// Arguments of `decree switchover`.
#[derive(Debug, clap::Args)]
pub struct SwitchoverArgs {
    /// The primary's TOML configuration (its `log_dir` holds the control socket).
    #[arg(long, short = 'c')]
    pub config: PathBuf,
    /// How long to wait, in seconds, for this member to be back as the backup of the new
    /// primary's epoch (0: do not wait).
    #[arg(long, default_value_t = 30)]
    pub wait_s: u64,
}

/// Arguments of `decree pause` and `decree resume`.
#[derive(Debug, clap::Args)]
pub struct PauseArgs {
    /// A member's TOML configuration (its `log_dir` holds the control socket): either
    /// member of the pair may take the request, which it writes to etcd.
    #[arg(long, short = 'c')]
    pub config: PathBuf,
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
    /// Every pair under the member's etcd prefix instead (who leads which epoch, who is in
    /// sync, the members registered, the pause), read straight from etcd with the
    /// configuration's `[pair.etcd]` (no member needs to run).
    #[arg(long)]
    pub etcd: bool,
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

/// Asks the primary to hand the lead to its in-sync backup (a pair elected on etcd), then
/// waits until it is back as the backup of the new epoch; fails when refused or not back
/// in time.
pub fn switchover(args: SwitchoverArgs) -> CliResult {
    let config = ServerConfig::from_toml_file(&args.config)?;
    let before: serde_json::Value =
        serde_json::from_str(&decree_server::control_request(&config.log_dir, "status")?)
            .map_err(|e| format!("the member's status does not parse: {e}"))?;
    let started = std::time::Instant::now();
    let answer = decree_server::control_request(&config.log_dir, "switchover")?;
    if let Some(why) = answer.strip_prefix("refused: ") {
        return Err(format!("switchover refused: {why}").into());
    }
    println!("{answer}");
    let old = before["epoch_raw"].as_u64().unwrap_or(0);
    let deadline = started + std::time::Duration::from_secs(args.wait_s);
    if args.wait_s == 0 {
        return Ok(());
    }
    loop {
        // The control socket is away while the member restarts as the backup.
        let now = decree_server::control_request(&config.log_dir, "status").ok();
        let now = now.and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok());
        let me = before["member"].as_u64();
        let newer = now.as_ref().and_then(|s| s["epoch_raw"].as_u64()).filter(|&epoch| epoch > old);
        if let Some(epoch) = newer {
            let (count, leader) = (epoch >> 8, epoch & 0xff);
            if Some(leader) == me {
                // The backup never campaigned (dead since its last acknowledgement): once
                // its turn was over, this member, which holds every decision too, won.
                return Err(format!(
                    "the backup did not take the lead: this member leads again, epoch {count}.{leader} ({:.0} ms)",
                    started.elapsed().as_secs_f64() * 1e3
                )
                .into());
            }
            if now.as_ref().is_some_and(|s| s["role"] == "backup") {
                println!(
                    "member {leader} leads epoch {count}.{leader}; this member follows it ({:.0} ms)",
                    started.elapsed().as_secs_f64() * 1e3
                );
                return Ok(());
            }
        }
        if std::time::Instant::now() >= deadline {
            return Err(format!(
                "this member is not back as the backup of a newer epoch after {} s",
                args.wait_s
            )
            .into());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Pauses (`paused`) or resumes the pair's automatic failover through a member, which
/// records it in etcd; prints the answer, fails when refused.
pub fn pause(args: PauseArgs, paused: bool) -> CliResult {
    let config = ServerConfig::from_toml_file(&args.config)?;
    let answer = decree_server::control_request(&config.log_dir, if paused { "pause" } else { "resume" })?;
    if let Some(why) = answer.strip_prefix("refused: ") {
        return Err(format!("{} refused: {why}", if paused { "pause" } else { "resume" }).into());
    }
    println!("{answer}");
    Ok(())
}

/// Prints the member's role, epoch, whether its peer is in sync, its link, lag and
/// promotion: as lines for people, or as the member's JSON line (`--format json`).
pub fn status(args: StatusArgs) -> CliResult {
    let config = ServerConfig::from_toml_file(&args.config)?;
    if args.etcd {
        // Straight from etcd: it answers while every member is down.
        let cluster = decree_server::etcd_cluster(&config)
            .map_err(|e| format!("cannot read the pairs on etcd: {e}"))?;
        match args.format {
            Format::Table => print!("{}", cluster_text(&cluster)),
            Format::Json => println!("{cluster}"),
        }
        return Ok(());
    }
    let answer = decree_server::control_request(&config.log_dir, "status")?;
    if let Some(why) = answer.strip_prefix("refused: ") {
        return Err(format!("status refused: {why}").into());
    }
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
        out += &match etcd["paused"].as_bool() {
            Some(true) => {
                format!("  automatic failover: PAUSED (by member {}): decree resume\n", etcd["paused_by"])
            }
            Some(false) => "  automatic failover: on\n".to_string(),
            None => format!("  automatic failover: unknown ({})\n", text(&etcd["paused_unknown"])),
        };
        // What keeps this member out of the election: etcd unreachable, or refusing it.
        if let Some(error) = etcd["error"].as_str() {
            out += &format!("  etcd {}: {error}\n", text(&etcd["state"]));
        }
    }
    out
}

/// etcd's view of every pair for people: one block per pair.
fn cluster_text(c: &serde_json::Value) -> String {
    let epoch =
        |raw: &serde_json::Value| raw.as_u64().map_or("?".into(), |r| format!("{}.{}", r >> 8, r & 0xff));
    let mut out = String::new();
    for p in c["pairs"].as_array().into_iter().flatten() {
        out += &format!("pair {} (epoch count {})\n", text(&p["pair"]), p["epoch_count"]);
        out += &match p["leader"].as_object() {
            Some(l) => format!(
                "  leader: member {} in epoch {} (run {})\n",
                l["member"],
                epoch(&l["epoch"]),
                text(&l["run"])
            ),
            None => "  leader: none (nobody leads now)\n".into(),
        };
        out += &last_change_text(&p["last_change"], now_unix_ms());
        out += &lag_text(&p["lag"], now_unix_ms());
        let in_sync: Vec<String> = p["sync"]["members"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| format!("member {} (run {})", m["member"], text(&m["run"])))
            .collect();
        out += &format!("  in sync for epoch {}: {}\n", epoch(&p["sync"]["epoch"]), in_sync.join(", "));
        for (id, r) in p["members"].as_object().into_iter().flatten() {
            out += &format!(
                "  member {id} registered: run {}, clients {}\n",
                text(&r["run"]),
                text(&r["clients"])
            );
        }
        out += &match p["pause"].as_object() {
            Some(pause) => format!("  automatic failover: PAUSED (by member {})\n", pause["by"]),
            None => "  automatic failover: on\n".into(),
        };
        for e in p["unreadable"].as_array().into_iter().flatten() {
            out += &format!("  unreadable: {}\n", text(e));
        }
    }
    if c["truncated"] == true {
        out += "(more keys than were read: the list is cut)\n";
    }
    if out.is_empty() {
        out = format!("no pair under {} on etcd\n", text(&c["prefix"]));
    }
    out
}

/// The last change of leader a pair recorded, as a line (none before a leader recorded one).
fn last_change_text(change: &serde_json::Value, now_unix_ms: u64) -> String {
    let (Some(member), Some(epoch), Some(at)) =
        (change["member"].as_u64(), change["epoch"].as_u64(), change["at_unix_ms"].as_u64())
    else {
        return String::new();
    };
    let ago = now_unix_ms.saturating_sub(at) as f64 / 1e3;
    let vacant = match change["vacant_ms"].as_u64() {
        Some(ms) => format!(", after {ms} ms without a leader as it saw it"),
        None => String::new(),
    };
    format!(
        "  last change of leader: member {member} took epoch {}.{} {ago:.0} s ago{vacant}\n",
        epoch >> 8,
        epoch & 0xff
    )
}

/// The leader's lag as it last reported it, as a line (none without a report).
fn lag_text(lag: &serde_json::Value, now_unix_ms: u64) -> String {
    let (Some(records), Some(waiting), Some(at)) =
        (lag["records"].as_u64(), lag["decisions_waiting"].as_u64(), lag["at_unix_ms"].as_u64())
    else {
        return String::new();
    };
    let age = now_unix_ms.saturating_sub(at) as f64 / 1e3;
    let oldest =
        lag["oldest_ms"].as_u64().map(|ms| format!(", the oldest waiting {ms} ms")).unwrap_or_default();
    let link = if lag["linked"] == true { "linked" } else { "NOT linked" };
    let mode = if lag["strict"] == true { "strict" } else { "alone" };
    format!(
        "  lag (the leader's report {age:.0} s ago, sent on change): {records} records and {waiting} decisions waiting for the backup{oldest}; {link}, {mode}\n"
    )
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
        assert!(text.contains("automatic failover: unknown"), "no pause read: {text}");
        let mut paused = status.clone();
        paused["etcd"]["paused"] = true.into();
        paused["etcd"]["paused_by"] = 1.into();
        let text = status_text(&paused);
        assert!(text.contains("automatic failover: PAUSED (by member 1)"), "{text}");
        let cluster = serde_json::json!({"prefix": "/decree/", "truncated": false, "pairs": [{
            "pair": "orders", "epoch_count": 3,
            "leader": {"member": 2, "run": "r2", "epoch": 770},
            "sync": {"epoch": 770, "members": [{"member": 2, "run": "r2"}, {"member": 1, "run": "r1"}]},
            "members": {"1": {"run": "r1", "link": "l", "clients": "unix:/a"}}, "pause": null, "unreadable": [],
            "last_change": {"member": 2, "epoch": 770, "at_unix_ms": now_unix_ms() - 5_000, "vacant_ms": 640},
            "lag": {"member": 2, "epoch": 770, "linked": false, "strict": true, "records": 12,
                    "decisions_waiting": 7, "oldest_ms": 340, "at_unix_ms": now_unix_ms() - 1_000}}]});
        let text = cluster_text(&cluster);
        assert!(
            text.contains(
                "last change of leader: member 2 took epoch 3.2 5 s ago, after 640 ms without a leader"
            ),
            "{text}"
        );
        assert!(text.contains("leader: member 2 in epoch 3.2 (run r2)"), "{text}");
        assert!(text.contains("in sync for epoch 3.2: member 2 (run r2), member 1 (run r1)"), "{text}");
        assert!(text.contains("member 1 registered: run r1, clients unix:/a"), "{text}");
        assert!(text.contains("automatic failover: on"), "{text}");
        assert!(
            text.contains(
                "lag (the leader's report 1 s ago, sent on change): 12 records and 7 decisions waiting for the backup, the oldest waiting 340 ms; NOT linked, strict"
            ),
            "{text}"
        );
        let without = status_text(&serde_json::json!({"role": "backup", "member": 2, "epoch_raw": 0}));
        assert!(!without.contains("etcd"), "{without}");
    }
}

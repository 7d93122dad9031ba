//! `[pair.etcd]`: the pair elects its primary on etcd (issue 33; docs/replication.md,
//! "Automatic failover on etcd"). Without it a pair is promoted by `decree promote`.

use crate::config::ConfigError;
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

/// Where the pair's election lives and how this member reaches it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairEtcdConfig {
    /// Every member of the etcd cluster (`http://host:port`, `https://` with `tls`), so
    /// that the member goes on when one is down.
    pub endpoints: Vec<String>,
    /// The prefix of every key decree writes (each pair under `{prefix}/{pair}/`).
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// The pair's name, the same on both members (letters, digits, `-`, `_`, `.`).
    pub pair: String,
    /// Seconds a member's lease lives without a keepalive (etcd counts in seconds): the
    /// longest a dead primary holds the lead, and the floor of a failover's time.
    #[serde(default = "default_lease_ttl_s")]
    pub lease_ttl_s: u64,
    /// Milliseconds taken off the lease when the member judges it alive: they cover the
    /// drift between this machine's clock and etcd's and the time etcd took to act on a
    /// keepalive (docs/replication.md, "Self-fencing").
    #[serde(default = "default_margin_ms")]
    pub margin_ms: u64,
    /// Off by default: a strict primary whose backup stops confirming waits for it, as
    /// without etcd. With a value, once decisions have waited that many milliseconds for
    /// the backup, the primary records the backup out of sync in etcd (by a transaction
    /// that requires its own lease on the leader key) and only then acknowledges alone,
    /// until a backup catches up again and is recorded; an out-of-sync backup never takes
    /// over, so availability is kept at the price of the backup's copy.
    #[serde(default)]
    pub alone_after_ms: Option<u64>,
    /// The deadline of each etcd request, in milliseconds.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// Mutual TLS with etcd: required when an endpoint is not on loopback (unless
    /// `insecure_plaintext`).
    #[serde(default)]
    pub tls: Option<EtcdTlsConfig>,
    /// etcd's user, when etcd has authentication on; its password is in `password_file`.
    #[serde(default)]
    pub user: Option<String>,
    /// A file (mode 0600) holding the etcd user's password.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// A watchdog device (`/dev/watchdog`, Linux's softdog or a hardware one), off by
    /// default: the primary feeds it only while its lease provably lives, so that a
    /// process that hangs past its lease gets its machine reset; its timeout must exceed
    /// the lease's TTL (docs/replication.md, "Watchdog").
    #[serde(default)]
    pub watchdog: Option<PathBuf>,
}

/// PEM files for mutual TLS with etcd.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdTlsConfig {
    /// The CA that signed etcd's server certificates.
    pub ca: PathBuf,
    /// This member's client certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

fn default_prefix() -> String {
    "/decree".into()
}
fn default_lease_ttl_s() -> u64 {
    5
}
fn default_margin_ms() -> u64 {
    200
}
fn default_request_timeout_ms() -> u64 {
    1000
}

/// The longest lease accepted.
pub const LEASE_TTL_S_MAX: u64 = 3600;
/// The most etcd endpoints accepted.
pub const ENDPOINTS_MAX: usize = 16;

impl PairEtcdConfig {
    /// The lease's time to live.
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_secs(self.lease_ttl_s)
    }

    /// The margin taken off the lease.
    pub fn margin(&self) -> Duration {
        Duration::from_millis(self.margin_ms)
    }

    /// Refuses a setting that cannot work, naming it.
    pub fn validate(&self, insecure_plaintext: bool) -> Result<(), ConfigError> {
        let bad = |why: String| Err(ConfigError(format!("[pair.etcd] {why}")));
        if self.endpoints.is_empty() {
            return bad("endpoints is empty: list every member of the etcd cluster, e.g. \
                        endpoints = [\"http://127.0.0.1:2379\"]"
                .into());
        }
        if self.endpoints.len() > ENDPOINTS_MAX {
            return bad(format!("has {} endpoints, at most {ENDPOINTS_MAX}", self.endpoints.len()));
        }
        for endpoint in &self.endpoints {
            let Some((scheme, rest)) = endpoint.split_once("://") else {
                return bad(format!(
                    "endpoint {endpoint:?} has no scheme: write http://host:port or https://host:port"
                ));
            };
            let host = rest.rsplit_once(':').map_or(rest, |(host, _)| host);
            let loopback = matches!(host, "localhost" | "[::1]") || host.starts_with("127.");
            match scheme {
                "https" if self.tls.is_none() => {
                    return bad(format!(
                        "endpoint {endpoint} is https: add [pair.etcd.tls] with ca, cert and key"
                    ))
                }
                "http" if self.tls.is_some() => {
                    return bad(format!(
                        "endpoint {endpoint} is http while [pair.etcd.tls] is set: write https"
                    ))
                }
                "http" if !loopback && !insecure_plaintext => {
                    return bad(format!(
                        "endpoint {endpoint} is not on loopback and has no TLS: add [pair.etcd.tls] with ca, \
                         cert and key (etcd's --client-cert-auth), or set insecure_plaintext = true on a \
                         network you trust entirely"
                    ))
                }
                "http" | "https" => {}
                other => return bad(format!("endpoint {endpoint} has scheme {other:?}: http or https")),
            }
        }
        let name_ok = |s: &str| {
            !s.is_empty()
                && s.len() <= 64
                && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        if !name_ok(&self.pair) {
            return bad(format!(
                "pair = {:?}: name the pair with 1 to 64 letters, digits, '-', '_' or '.'",
                self.pair
            ));
        }
        if !self.prefix.starts_with('/') || self.prefix.contains("//") {
            return bad(format!("prefix = {:?} must start with '/' (e.g. \"/decree\")", self.prefix));
        }
        if self.lease_ttl_s == 0 || self.lease_ttl_s > LEASE_TTL_S_MAX {
            return bad(format!(
                "lease_ttl_s = {} must be between 1 and {LEASE_TTL_S_MAX}",
                self.lease_ttl_s
            ));
        }
        if self.margin_ms * 2 > self.lease_ttl_s * 1000 {
            return bad(format!(
                "margin_ms = {} is more than half the lease ({} s): the member would fence itself most of the time",
                self.margin_ms, self.lease_ttl_s
            ));
        }
        if self.alone_after_ms == Some(0) {
            return bad("alone_after_ms = 0: leave it out to wait for the backup, or give the milliseconds decisions may wait".into());
        }
        if self.request_timeout_ms == 0 {
            return bad("request_timeout_ms = 0: give etcd requests a deadline".into());
        }
        if self.password_file.is_some() != self.user.is_some() {
            return bad("user and password_file go together".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &str) -> PairEtcdConfig {
        toml::from_str(&format!("endpoints = [\"http://127.0.0.1:2379\"]\npair = \"p1\"\n{extra}")).unwrap()
    }

    #[test]
    fn defaults_hold_and_each_wrong_setting_is_named() {
        let config = parse("");
        assert_eq!((config.prefix.as_str(), config.lease_ttl_s, config.margin_ms), ("/decree", 5, 200));
        config.validate(false).unwrap();
        let cases: &[(&str, &str)] = &[
            ("lease_ttl_s = 0", "lease_ttl_s = 0"),
            ("lease_ttl_s = 1\nmargin_ms = 600", "margin_ms = 600"),
            ("prefix = \"decree\"", "prefix"),
            ("user = \"decree\"", "user and password_file"),
            ("request_timeout_ms = 0", "request_timeout_ms"),
        ];
        for (extra, needle) in cases {
            let e = parse(extra).validate(false).unwrap_err().to_string();
            assert!(e.contains(needle) && e.contains("[pair.etcd]"), "{extra}: {e}");
        }
        let named = |text: &str| toml::from_str::<PairEtcdConfig>(text).unwrap().validate(false).unwrap_err();
        let e = named("endpoints = []\npair = \"p\"").to_string();
        assert!(e.contains("endpoints is empty"), "{e}");
        let e = named("endpoints = [\"10.0.0.1:2379\"]\npair = \"p\"").to_string();
        assert!(e.contains("no scheme"), "{e}");
        let e = named("endpoints = [\"http://10.0.0.1:2379\"]\npair = \"p\"").to_string();
        assert!(e.contains("not on loopback") && e.contains("[pair.etcd.tls]"), "{e}");
        let e = named("endpoints = [\"https://127.0.0.1:2379\"]\npair = \"p\"").to_string();
        assert!(e.contains("add [pair.etcd.tls]"), "{e}");
        let e = named("endpoints = [\"http://127.0.0.1:2379\"]\npair = \"a/b\"").to_string();
        assert!(e.contains("name the pair"), "{e}");
        let remote: PairEtcdConfig =
            toml::from_str("endpoints = [\"http://10.0.0.1:2379\"]\npair = \"p\"").unwrap();
        remote.validate(true).expect("insecure_plaintext allows it, as for every listener");
        assert!(
            toml::from_str::<PairEtcdConfig>("endpoints = []\npair = \"p\"\nttl = 1").is_err(),
            "unknown key"
        );
    }
}

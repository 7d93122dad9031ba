//! Resource managers described in configuration (`[[rm]]` entries of decree.toml).
//!
//! The server and the CLI read a list of [`RmConfig`] and turn each into a factory with
//! [`factory_from_config`]. DSNs are checked here, without connecting, so that a typo is
//! reported at start-up with the RM's name; reachability is checked on first use.

use std::sync::Arc;

use decree_core::{RmError, RmFactory, RM_NAME_BYTES_MAX};
use serde::{Deserialize, Serialize};

use crate::mariadb::MariaDbFactory;
use crate::postgres::PgFactory;

/// Which kind of database a resource manager is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RmKind {
    /// PostgreSQL, through `PREPARE TRANSACTION` (needs `max_prepared_transactions > 0`).
    #[serde(alias = "postgresql", alias = "pg")]
    Postgres,
    /// MariaDB (10.5 or later) or MySQL, through the XA statements.
    #[serde(alias = "mysql")]
    Mariadb,
}

/// One `[[rm]]` entry: a named database that takes part in transactions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RmConfig {
    /// The RM's name, unique in the configuration; used in reports and errors.
    pub name: String,
    /// `postgres` or `mariadb`.
    pub kind: RmKind,
    /// PostgreSQL: `host=... port=... user=... dbname=...` or a `postgresql://` URL;
    /// MariaDB: `mysql://user:password@host:port/database`.
    pub dsn: String,
}

/// Builds the connection factory an `[[rm]]` entry describes (no connection is made).
pub fn factory_from_config(config: &RmConfig) -> Result<Arc<dyn RmFactory>, RmError> {
    check_name(&config.name)?;
    Ok(match config.kind {
        RmKind::Postgres => Arc::new(PgFactory::new(&config.name, &config.dsn)?),
        RmKind::Mariadb => Arc::new(MariaDbFactory::new(&config.name, &config.dsn)?),
    })
}

/// Builds every factory of a configuration, refusing duplicate names.
pub fn factories_from_config(configs: &[RmConfig]) -> Result<Vec<Arc<dyn RmFactory>>, RmError> {
    let mut factories: Vec<Arc<dyn RmFactory>> = Vec::with_capacity(configs.len());
    for config in configs {
        if factories.iter().any(|f| f.name() == config.name) {
            return Err(RmError::Protocol(format!("resource manager name '{}' is used twice", config.name)));
        }
        factories.push(factory_from_config(config)?);
    }
    Ok(factories)
}

fn check_name(name: &str) -> Result<(), RmError> {
    let valid = !name.is_empty()
        && name.len() <= RM_NAME_BYTES_MAX
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if valid {
        Ok(())
    } else {
        Err(RmError::Protocol(format!(
            "resource manager name {name:?} is invalid: use 1 to RM_NAME_BYTES_MAX = {RM_NAME_BYTES_MAX} letters, \
             digits, '-', '_' or '.'"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct File {
        rm: Vec<RmConfig>,
    }

    #[test]
    fn rm_entries_parse_from_toml_and_build_factories() {
        let text = r#"
            [[rm]]
            name = "ledger"
            kind = "postgres"
            dsn = "host=127.0.0.1 port=55432 user=decree dbname=decree_a"

            [[rm]]
            name = "orders"
            kind = "mariadb"
            dsn = "mysql://decree@127.0.0.1:53306/decree_m"
        "#;
        let file: File = toml::from_str(text).expect("valid toml");
        assert_eq!(file.rm[0].kind, RmKind::Postgres);
        assert_eq!(file.rm[1].kind, RmKind::Mariadb);
        let factories = factories_from_config(&file.rm).expect("valid entries");
        let names: Vec<&str> = factories.iter().map(|f| f.name()).collect();
        assert_eq!(names, ["ledger", "orders"]);
    }

    #[test]
    fn bad_entries_are_refused_with_the_reason() {
        let unknown_kind = toml::from_str::<File>("[[rm]]\nname='x'\nkind='oracle'\ndsn=''\n");
        let message = unknown_kind.err().expect("unknown kind refused").to_string();
        assert!(message.contains("oracle"), "{message}");
        let twice = RmConfig { name: "a".into(), kind: RmKind::Postgres, dsn: "host=h".into() };
        let err = factories_from_config(&[twice.clone(), twice]).err().expect("duplicate refused");
        assert!(matches!(err, RmError::Protocol(ref m) if m.contains("twice")), "{err:?}");
        let bad_name = RmConfig { name: "a b".into(), kind: RmKind::Mariadb, dsn: "mysql://h/d".into() };
        assert!(factory_from_config(&bad_name).is_err());
        let bad_dsn = RmConfig { name: "m".into(), kind: RmKind::Mariadb, dsn: "host=h".into() };
        let err = factory_from_config(&bad_dsn).err().expect("bad DSN refused");
        assert!(matches!(err, RmError::Protocol(ref m) if m.contains("m: invalid MariaDB DSN")), "{err:?}");
    }
}

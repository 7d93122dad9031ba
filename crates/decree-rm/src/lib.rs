//! Real resource managers for decree: PostgreSQL and MariaDB.
//!
//! Each implements [`decree_core::ResourceManager`] over one database connection that the
//! application also uses for its own SQL, so that its statements form the branch the
//! coordinator prepares and commits. The coordinator takes the RM as a
//! `Box<dyn ResourceManager>`; the application keeps a handle ([`PgHandle`],
//! [`MariaDbHandle`]) on the same connection and runs its SQL through `handle.client()`
//! between `begin` and `commit`. A client guard must be dropped before calling the
//! coordinator: RM calls refuse (with an error, never a deadlock) while one is alive. Factories ([`RmFactory`] implementations)
//! open further connections for recovery and phase-two retries, and [`config`] builds them
//! from decree.toml's `[[rm]]` entries. Everything here is synchronous, like the
//! coordinator's interface; each module's documentation lists the SQL it sends and why.
//!
//! [`RmFactory`]: decree_core::RmFactory

mod branch;
pub mod config;
pub mod detached;
pub mod mariadb;
pub mod pg_client;
pub mod postgres;
pub mod shared;
pub mod xa_name;

pub use config::{factories_from_config, factory_from_config, RmConfig, RmKind};
pub use mariadb::{MariaDbClient, MariaDbFactory, MariaDbHandle, MariaDbRm};
pub use postgres::{PgClient, PgFactory, PgHandle, PgRm};

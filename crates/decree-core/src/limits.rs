//! The limits of a decision record, each in one constant.
//!
//! A decision record ([`crate::Decision`]) names every branch's resource manager and
//! carries the number of branches; the log stores it and the wire protocol's `Decide`
//! carries the same bytes. Both fields have fixed widths (one byte for a name's length,
//! two for the count), so a value past them could only be written truncated, and a
//! truncated record commits different branches than the ones that voted. These constants
//! are the one limit every layer uses: a resource manager's name is checked when it is
//! registered (the coordinator, decree-rm's and the state server's `[[rm]]` entries), the
//! branch count when branches are enlisted (`TmConfig::branches_max` and the session's
//! branch numbers stay within [`BRANCHES_MAX`]) and when a store is handed a decision,
//! both are asserted when a record is written, and a record read back (from the log or the
//! wire) that breaks them is refused as malformed. A record never silently changes what it
//! stores.
//!
//! Not here: the Xid's own limits (gtrid and bqual of at most 64 bytes each,
//! [`crate::xid::PART_BYTES_MAX`]), which the [`crate::Xid`] type keeps by construction.

use crate::trace::TRACE_CONTEXT_BYTES;
use crate::xid::XID_ENCODED_BYTES_MAX;

/// Longest resource-manager name, in bytes. 64 is the limit decree-rm always applied to
/// the PostgreSQL and MariaDB entries, so every configuration that could name a real
/// database stays valid; names appear in every error and log line, and in every decision
/// record once per branch, so a short bound keeps both readable and small.
pub const RM_NAME_BYTES_MAX: usize = 64;

/// Most branches of one transaction, and so of one decision record; a session's branch
/// numbers (the bqual) are `0..BRANCHES_MAX`. The largest power of two for which a
/// decision at every limit ([`DECISION_BYTES_MAX`]) fits in one frame of the wire
/// protocol (64 KiB, decree-proto asserts it) and in one log record under the default
/// record limit: 512 branches of 64-byte names need 34,444 bytes, 1,024 would not fit.
pub const BRANCHES_MAX: usize = 512;

/// Bytes of one branch of a decision record at the longest name: branch number (2), name
/// length (1), name.
pub const BRANCH_ENCODED_BYTES_MAX: usize = 2 + 1 + RM_NAME_BYTES_MAX;

/// Longest encoded decision record: magic (4), the longest Xid, the branch count (2), and
/// [`BRANCHES_MAX`] branches of [`RM_NAME_BYTES_MAX`]-byte names.
pub const DECISION_BYTES_MAX: usize = 4 + XID_ENCODED_BYTES_MAX + 2 + BRANCHES_MAX * BRANCH_ENCODED_BYTES_MAX;

/// Longest decision record in the log: the longest [`DECISION_BYTES_MAX`] body in its
/// traced form (`DCD2`, which only the log holds), followed by the client's trace context.
/// The wire's `Decide` body stays within [`DECISION_BYTES_MAX`]; the context travels in
/// the frame's trailer there, so a log record never outgrows the frame that brought it.
pub const DECISION_RECORD_BYTES_MAX: usize = DECISION_BYTES_MAX + TRACE_CONTEXT_BYTES;

const _: () = assert!(RM_NAME_BYTES_MAX > 0 && BRANCHES_MAX > 0);
const _: () = assert!(RM_NAME_BYTES_MAX <= u8::MAX as usize, "a record stores a name's length in one byte");
const _: () = assert!(BRANCHES_MAX <= u16::MAX as usize, "a record stores the branch count in two bytes");
const _: () = assert!(
    DECISION_RECORD_BYTES_MAX <= decree_log::config::RECORD_BYTES_MAX_DEFAULT as usize,
    "a decision at every limit, with its trace context, fits in one log record under the default record limit"
);

/// A value past one of the limits above; the message names the value and the limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// A resource-manager name longer than [`RM_NAME_BYTES_MAX`].
    #[error(
        "resource manager name of {bytes} bytes exceeds RM_NAME_BYTES_MAX = {} (it starts {start:?})",
        RM_NAME_BYTES_MAX
    )]
    RmNameTooLong {
        /// The name's length in bytes.
        bytes: usize,
        /// The name's first characters (at most [`RM_NAME_BYTES_MAX`] bytes), to find it.
        start: String,
    },
    /// More branches than [`BRANCHES_MAX`] (in a decision, a configuration or a
    /// transaction whose failed starts used up the branch numbers).
    #[error("{count} branches exceed BRANCHES_MAX = {}", BRANCHES_MAX)]
    TooManyBranches {
        /// How many branches were asked for.
        count: usize,
    },
}

/// Checks a resource manager's name against [`RM_NAME_BYTES_MAX`].
pub fn check_rm_name(name: &str) -> Result<(), LimitError> {
    if name.len() <= RM_NAME_BYTES_MAX {
        return Ok(());
    }
    let mut end = RM_NAME_BYTES_MAX;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    Err(LimitError::RmNameTooLong { bytes: name.len(), start: name[..end].to_string() })
}

/// Checks a number of branches against [`BRANCHES_MAX`].
pub fn check_branch_count(count: usize) -> Result<(), LimitError> {
    if count <= BRANCHES_MAX {
        Ok(())
    } else {
        Err(LimitError::TooManyBranches { count })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_value_and_the_limit() {
        let name = "é".repeat(150);
        let err = check_rm_name(&name).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("name of 300 bytes exceeds RM_NAME_BYTES_MAX = 64"), "{text}");
        let LimitError::RmNameTooLong { start, .. } = err else { panic!("{err:?}") };
        assert_eq!(start, "é".repeat(32), "cut on a character boundary");
        assert!(check_rm_name(&"x".repeat(RM_NAME_BYTES_MAX)).is_ok());
        assert_eq!(check_branch_count(BRANCHES_MAX), Ok(()));
        let text = check_branch_count(70_000).unwrap_err().to_string();
        assert_eq!(text, "70000 branches exceed BRANCHES_MAX = 512");
    }
}

//! Fault-injecting storage for crash tests (to be written).

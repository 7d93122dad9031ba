//! decree-bench (to be written).

//! decree-proto (to be written).

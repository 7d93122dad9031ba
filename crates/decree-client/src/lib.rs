//! decree-client (to be written).

//! decree-server (to be written).

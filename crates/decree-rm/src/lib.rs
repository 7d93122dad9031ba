//! decree-rm (to be written).

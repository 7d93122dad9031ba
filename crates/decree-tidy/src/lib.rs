//! Nothing but a home for `tests/tidy.rs`, the tidy test of the workspace.
//!
//! The test reads every crate's `src/` and fails on a function longer than 100 lines
//! (older ones are listed and may only shrink), on `dbg!` anywhere and on `print!`-style
//! output in library crates, and on a module that does not open with its `//!` paragraph.
//! This crate holds no product code and depends on nothing beyond `std`.

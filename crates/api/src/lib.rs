//! cozyplane API types, validation and claim names. No I/O.
pub mod kinds;

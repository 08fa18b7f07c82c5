//! The cozyplane datapath.

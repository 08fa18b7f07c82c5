//! The cozyplane API server.

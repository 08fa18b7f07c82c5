//! The cozyplane CNI plugin library.

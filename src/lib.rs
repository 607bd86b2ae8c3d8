//! pgfence
pub mod embedded;

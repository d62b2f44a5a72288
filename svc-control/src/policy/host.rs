//! Host patterns as policy speaks of them: the value types live in the leaf [`crate::hosts`]
//! (configuration parses them too); policy's rules over them are in `policy::destination`,
//! `policy::request` and `policy::dns`.

pub use crate::hosts::*;

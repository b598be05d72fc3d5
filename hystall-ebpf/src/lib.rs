//! Empty library target: lets `hystall` declare a build-dependency on this crate
//! so that changes here rebuild the embedded object (the programs are the bin).
#![no_std]

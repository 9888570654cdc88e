//! PURE: what a Job or JobSet does when one of its pods fails, by the Job and JobSet
//! controllers' own rules: the engine of the coming `gpu-guard simulate`.

pub mod job;
pub mod jobset;
pub mod object;

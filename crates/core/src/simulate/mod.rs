//! PURE: what a Job or JobSet does when one of its pods fails, by the Job and JobSet
//! controllers' own rules (the `gpu-guard simulate` command's engine).

pub mod job;

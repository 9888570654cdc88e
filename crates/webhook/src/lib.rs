//! The admission webhook: AdmissionReview bytes in, AdmissionReview bytes out ([`admission`],
//! no transport), and the TLS server that carries them ([`server`]).

pub mod admission;
pub mod server;

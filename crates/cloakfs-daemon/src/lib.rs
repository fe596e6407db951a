//! cloakfs multi-user daemon (NCryptfs sections 3-4, CFS section 2): one FUSE tree of
//! attaches, each guarded by authorizations and active sessions with timeouts and
//! revocation, and the control protocol every user command speaks.

pub mod protocol;

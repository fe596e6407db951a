//! I/O on backing files: plaintext reads and writes of one file, streaming, and the xattrs of
//! backing entries.

pub mod file;
pub mod header;
pub mod lease;
pub mod long_targets;
pub mod plain_list;
pub mod retired;
pub mod reverse;
pub mod shared;
pub(crate) mod stream;
pub mod xattrs;

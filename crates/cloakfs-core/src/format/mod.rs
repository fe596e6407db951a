//! The on-disk format, byte for byte as docs/FORMAT.md specifies it: the config, file headers
//! and block layout, content blocks, names, and symlink and xattr blobs.

pub mod config;
pub mod content;
pub mod dir_ids;
pub mod filekey;
pub mod layout;
pub mod meta;
pub mod names;
pub mod reverse;

//! cloakfs core: everything that defines a cloakfs volume, with no FUSE in it.
//!
//! - [`config`]: the volume config file, key slots and the config MAC;
//! - [`keys`], [`kdf`], [`secret`]: the key hierarchy and secret handling;
//! - [`content`], [`layout`], [`file`]: file content encryption and plaintext I/O;
//! - [`names`], [`meta`]: name, symlink and xattr encryption;
//! - [`volume`], [`paths`]: an unlocked volume and offline path translation.
//!
//! The on-disk format is specified byte for byte in `docs/FORMAT.md`.

#![warn(missing_docs)]

pub mod config;
pub mod content;
pub mod encoding;
pub mod error;
pub mod file;
pub mod kdf;
pub mod keys;
pub mod layout;
pub mod meta;
pub mod names;
pub mod paths;
pub mod random;
pub mod secret;
pub mod volume;

pub use error::{Error, Result};
pub use volume::Volume;

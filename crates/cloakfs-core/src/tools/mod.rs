//! Offline tools that work on a cipher directory without a mount: walking it, translating
//! paths, reading files block by block, checking, exporting, rekeying and writing entries.

pub mod blocks;
pub mod dir_id_merge;
pub mod export;
pub mod fsck;
pub mod mounts;
pub mod paths;
pub mod rekey;
pub mod share;
pub mod translate;
pub mod upgrade;
pub mod walk;
pub mod writer;

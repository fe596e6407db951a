//! Cryptographic building blocks: the key hierarchy, passphrase KDF, the content AEAD's key,
//! locked secret memory and the one randomness source.

pub(crate) mod gcm;
pub mod kdf;
pub mod keys;
pub mod random;
pub mod secret;

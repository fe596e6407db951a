//! The multi-user attach tree: one FUSE mount (normally `/crypt`) whose root is a virtual,
//! read-only directory and whose entries are *attaches*, each the plaintext view of one
//! cipher directory (NCryptfs section 3.3, CFS's /crypt).
//!
//! This module only routes requests and switches credentials; who may do what is decided
//! by a [`Gate`] supplied by the daemon, before anything is decrypted.
//!
//! API contract (implemented by the FUSE helper; used by `cloakfs-daemon`):
//! - [`mount_tree`] mounts the tree (allow_other, no default_permissions, no writeback
//!   cache) and returns the unserved mount plus a cloneable [`TreeHandle`];
//! - [`TreeHandle::attach`] / [`TreeHandle::detach`] add and remove attaches at run time;
//! - [`TreeHandle::invalidate`] drops the kernel's cached attributes and pages of every node
//!   of one attach (after a revocation or timeout), so the next access reaches the gate.

use cloakfs_core::Volume;
use rustix::fd::OwnedFd;
use std::io;
use std::path::Path;
use std::sync::Arc;

/// Identifies one attach for the life of the daemon (never reused).
pub type AttachId = u64;

/// Who sent a FUSE request, from the request header (the kernel fills it in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// The kind of access a request needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// See that an entry exists and its attributes: lookup, getattr, statfs, access(F_OK).
    Look,
    /// Plaintext content or names: open for reading, read, readdir, readlink, getxattr,
    /// listxattr, access(R_OK).
    Read,
    /// Any change: create, mkdir, mknod, symlink, link, unlink, rmdir, rename, setattr,
    /// open for writing, write, fallocate, setxattr, removexattr, access(W_OK).
    Write,
    /// Open for execution (`__FMODE_EXEC` in the open flags), access(X_OK).
    Exec,
}

/// What one request needs from the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    pub access: Access,
    /// The request works on an already open file or directory handle (read, write, fsync,
    /// readdir, getattr with a handle, ...), as opposed to reaching something new. Timeouts
    /// with the `fail-new` and `sleep-new` behaviours let these through.
    pub on_open_handle: bool,
}

/// The gate's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Go ahead. With `bypass`, the backing files are used with the attach owner's
    /// credentials; otherwise with the caller's (so lower-level permission checks apply to
    /// the caller).
    Allow { bypass: bool },
    /// Refuse with EACCES.
    Deny,
}

/// Decides every request on an attach. Called on a FUSE worker thread before any backing
/// file is touched; may block (sleeping timeouts) for a bounded time.
pub trait Gate: Send + Sync + 'static {
    fn check(&self, attach: AttachId, caller: &Caller, need: Need) -> Verdict;
}

/// One attach to add.
pub struct AttachSpec {
    /// Entry name under the tree root (a single path component).
    pub name: String,
    pub volume: Volume,
    /// `O_PATH | O_DIRECTORY` descriptor of the cipher directory (opened with the
    /// attaching user's credentials).
    pub cipherdir: OwnedFd,
    /// The attaching user: the attach root shows as theirs, mode 0700, and `bypass` uses
    /// their credentials.
    pub owner_uid: u32,
    pub owner_gid: u32,
    pub owner_groups: Vec<u32>,
    /// Left out of root listings, still reachable by its exact name.
    pub hidden: bool,
    pub read_only: bool,
}

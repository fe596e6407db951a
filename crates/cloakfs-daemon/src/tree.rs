//! What the daemon needs from the attach tree, as a trait so the control logic can be
//! tested without FUSE (the real one is `cloakfs_fuse::tree::TreeHandle`).

use cloakfs_fuse::tree::{AttachId, AttachSpec, TreeHandle};
use std::io;

/// The attach tree, seen from the daemon. Never called from a FUSE worker thread, and never
/// with the registry locked.
pub trait Tree: Clone + Send + Sync + 'static {
    /// Adds an attach (`AlreadyExists` if the name is taken).
    fn attach(&self, spec: AttachSpec) -> io::Result<AttachId>;
    /// Removes an attach; its keys go with it.
    fn detach(&self, id: AttachId) -> io::Result<()>;
    /// Drops the kernel's caches of an attach, so the next access reaches the gate.
    fn invalidate(&self, id: AttachId);
    /// The tree mount's device (major, minor), if known: a cipher directory there is refused.
    fn device(&self) -> Option<(u32, u32)> {
        None
    }
    /// Detaches the tree from the name space (lazily: what is open stays served).
    fn unmount(&self) {}
    /// Ends the tree's FUSE connection: every request on it fails, the serving loop returns.
    fn abort(&self) -> io::Result<()> {
        Err(io::Error::other("this tree cannot be aborted"))
    }
}

impl Tree for TreeHandle {
    fn attach(&self, spec: AttachSpec) -> io::Result<AttachId> {
        TreeHandle::attach(self, spec)
    }
    fn detach(&self, id: AttachId) -> io::Result<()> {
        TreeHandle::detach(self, id)
    }
    fn invalidate(&self, id: AttachId) {
        TreeHandle::invalidate(self, id)
    }
    fn device(&self) -> Option<(u32, u32)> {
        TreeHandle::device(self)
    }
    fn unmount(&self) {
        TreeHandle::unmount(self)
    }
    fn abort(&self) -> io::Result<()> {
        TreeHandle::abort(self)
    }
}

use bitflags::bitflags;

bitflags! {
    /// Setxattr flags (sent only once FUSE_SETXATTR_EXT is negotiated).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct SetXAttrFlags: u32 {
        /// Clear the set-group-ID bit when setting system.posix_acl_access: the caller is
        /// neither in the file's group nor has CAP_FSETID.
        const FUSE_SETXATTR_ACL_KILL_SGID = 1 << 0;
    }
}

//! Directory entries: lookup, creation of every kind of node, removal, rename and hard
//! links. Every plaintext name is encrypted with its parent's directory ID; a long name's
//! sidecar is written before its entry appears and removed after it is gone.

use crate::dir::chown;
use crate::fs::CloakFs;
use crate::inode::{Inode, Kind};
use crate::plain::Resolved;
use crate::sys::{self, errno, Res};
use cloakfs_core::format::meta::SealedTarget;
use cloakfs_core::format::names::StoredName;
use cloakfs_core::io::long_targets;
use fuser::{Errno, FileAttr, INodeNo, RenameFlags, Request};
use rustix::fd::BorrowedFd;
use rustix::fs::{AtFlags, Mode, OFlags};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

/// Backing size from which unlinking a file's last name frees its data before the reply
/// (smaller files are freed soon after by the node's close, at little cost to anyone).
const FREE_ON_UNLINK: u64 = 1 << 20;

impl CloakFs {
    pub(crate) fn do_lookup(&self, parent: INodeNo, name: &OsStr) -> Res<FileAttr> {
        let p = self.node(parent)?;
        let found = self.lookup_in(&p, name);
        // A miss may come from an ID file the sync client replaced: once more under the new ID.
        // Or the name is one of a sync conflict's losing side, under an ID-file copy's ID.
        if found == Err(Errno::ENOENT) && (self.reload_dir_id(&p) || self.learn_dir_id_copies(&p)) {
            return self.lookup_in(&p, name);
        }
        found
    }

    fn lookup_in(&self, p: &Inode, name: &OsStr) -> Res<FileAttr> {
        match self.resolve(p, name)? {
            Resolved::Encrypted(stored) => self.lookup_backing(p, stored.backing(), name, None),
            Resolved::Plain(backing) => self.lookup_plain(p, &backing, None),
            Resolved::Absent => Err(Errno::ENOENT),
        }
        .map(|(_, a)| a)
    }

    /// Gives just-created entry `name` to its creator if needed, and looks it up for the
    /// kernel.
    pub(crate) fn finish_create(
        &self,
        req: &Request,
        p: &Inode,
        backing: &str,
        name: &OsStr,
    ) -> Res<FileAttr> {
        if let Some((uid, gid)) = self.new_owner(req, p) {
            chown(p.fd(), backing, uid, gid)?;
        }
        self.lookup_backing(p, backing, name, None).map(|(_, a)| a)
    }

    pub(crate) fn do_readlink(&self, ino: INodeNo) -> Res<Vec<u8>> {
        let inode = self.node(ino)?;
        if inode.kind != Kind::Symlink {
            return Err(Errno::EINVAL);
        }
        let stored = rustix::fs::readlinkat(inode.fd(), "", Vec::new()).map_err(errno)?;
        if inode.is_plain() {
            return Ok(stored.into_bytes());
        }
        let root = self.node(INodeNo(self.inodes.root()))?;
        long_targets::read_target(self.volume.meta(), root.fd(), stored.as_bytes())
            .map_err(|e| self.fail(&e, inode.fd(), Some("symlink target")))
    }

    pub(crate) fn do_mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Res<FileAttr> {
        self.writable()?;
        sys::exact_modes();
        let p = self.node(parent)?;
        let stored = self.name_for_new(&p, name)?;
        let created = self.write_sidecar(p.fd(), &stored)?;
        // Shared, a regular file has its header before its name appears, as in a create.
        let header = if mode & libc::S_IFMT == libc::S_IFREG && self.coherence.sharing.is_shared() {
            cloakfs_core::io::file::new_file_header(&self.codec, &self.default_recipients(&p))
                .map_err(|e| Errno::from_i32(e.errno()))?
        } else {
            None
        };
        let oflags = OFlags::CREATE | OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let made = sys::with_umask(umask, |mask| {
            let perm = Mode::from_raw_mode(mode & 0o7777 & mask);
            let with_header = match &header {
                Some(h) => {
                    crate::file::create_with_header(p.fd(), stored.backing(), oflags, perm, h)
                }
                None => Ok(None),
            };
            match with_header {
                Ok(Some(_)) => Ok(()),
                Ok(None) => rustix::fs::mknodat(
                    p.fd(),
                    stored.backing(),
                    rustix::fs::FileType::from_raw_mode(mode),
                    perm,
                    u64::from(rdev),
                ),
                Err(e) => Err(e),
            }
        })
        .map_err(|e| crate::file::exclusive_failure(p.fd(), stored.backing(), e));
        if let Err(e) = made {
            if created {
                self.remove_sidecar(p.fd(), &stored);
            }
            return Err(errno(e));
        }
        self.finish_create(req, &p, stored.backing(), name)
    }

    pub(crate) fn do_mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> Res<FileAttr> {
        self.writable()?;
        sys::exact_modes();
        let p = self.node(parent)?;
        let stored = self.name_for_new(&p, name)?;
        let owner = self.new_owner(req, &p);
        let (dfd, id) = self.make_dir(&p, name, &stored, mode & 0o7777, umask, owner)?;
        let fd = self.hold_dir(dfd)?;
        let (inode, attr) = self.lookup_fd(fd, &p, name)?;
        inode.dir_id.get_or_init(id);
        Ok(attr)
    }

    pub(crate) fn do_unlink(&self, parent: INodeNo, name: &OsStr) -> Res<()> {
        self.writable()?;
        let p = self.node(parent)?;
        let stored = match self.resolve(&p, name)? {
            Resolved::Encrypted(stored) => stored,
            Resolved::Plain(backing) => {
                rustix::fs::unlinkat(p.fd(), backing.as_str(), AtFlags::empty()).map_err(errno)?;
                self.retire_plain(&p, backing.as_bytes());
                return Ok(());
            }
            Resolved::Absent => return Err(Errno::ENOENT),
        };
        let (last_link, long_target) = self.last_link(p.fd(), stored.backing());
        rustix::fs::unlinkat(p.fd(), stored.backing(), AtFlags::empty()).map_err(errno)?;
        self.remove_sidecar(p.fd(), &stored);
        if let Some(inode) = last_link {
            inode.free_unlinked_data();
        }
        self.remove_long_target(long_target);
        Ok(())
    }

    /// Removes the long target of a symlink whose last name is gone (see
    /// `cloakfs_core::io::long_targets`).
    fn remove_long_target(&self, name: Option<String>) {
        if let (Some(name), Ok(root)) = (name, self.node(INodeNo(self.inodes.root()))) {
            long_targets::remove(root.fd(), &name);
        }
    }

    /// What goes with backing entry `backing` of `dir` if that name is its object's last
    /// link, found by one `lstat` before the name is removed or replaced: the node of a large
    /// file, so that its data can be freed before the reply ([`Inode::free_unlinked_data`]),
    /// and a symlink's long target.
    fn last_link(
        &self,
        dir: BorrowedFd<'_>,
        backing: &str,
    ) -> (Option<Arc<Inode>>, Option<String>) {
        let Ok(st) = rustix::fs::statat(dir, backing, AtFlags::SYMLINK_NOFOLLOW) else {
            return (None, None);
        };
        let large = st.st_nlink == 1
            && st.st_mode & libc::S_IFMT == libc::S_IFREG
            && st.st_size as u64 >= FREE_ON_UNLINK;
        let node = if large {
            self.inodes.by_key(st.st_dev, st.st_ino)
        } else {
            None
        };
        (node, long_targets::last_link_target(dir, backing, &st))
    }

    pub(crate) fn do_rmdir(&self, parent: INodeNo, name: &OsStr) -> Res<()> {
        self.writable()?;
        let p = self.node(parent)?;
        match self.resolve(&p, name)? {
            Resolved::Encrypted(stored) => self.remove_dir(&p, &stored),
            Resolved::Plain(backing) => {
                self.remove_dir(&p, &StoredName::Short(backing.clone()))?;
                self.retire_plain(&p, backing.as_bytes());
                Ok(())
            }
            Resolved::Absent => Err(Errno::ENOENT),
        }
    }

    pub(crate) fn do_symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        target: &Path,
    ) -> Res<FileAttr> {
        self.writable()?;
        sys::exact_modes();
        let p = self.node(parent)?;
        let stored = self.name_for_new(&p, name)?;
        let enc = self
            .volume
            .meta()
            .encrypt_symlink(target.as_os_str().as_bytes())
            .map_err(|e| Errno::from_i32(e.errno()))?;
        let root = self.node(INodeNo(self.inodes.root()))?;
        // A long target is durable before the symlink that points to it exists.
        long_targets::store(root.fd(), &enc).map_err(|e| self.fail(&e, root.fd(), None))?;
        let created = self.write_sidecar(p.fd(), &stored)?;
        let backing_target = enc.backing_target();
        if let Err(e) = rustix::fs::symlinkat(backing_target.as_str(), p.fd(), stored.backing()) {
            if created {
                self.remove_sidecar(p.fd(), &stored);
            }
            if let SealedTarget::Long { name, .. } = enc {
                long_targets::remove(root.fd(), &name);
            }
            return Err(errno(e));
        }
        self.finish_create(req, &p, stored.backing(), name)
    }

    pub(crate) fn do_rename(
        &self,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Res<()> {
        self.writable()?;
        // It may move old entries into a directory whose ID is not yet durable.
        self.syncer.drain()?;
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            return Err(Errno::EINVAL);
        }
        let exchange = flags.contains(RenameFlags::RENAME_EXCHANGE);
        let p = self.node(parent)?;
        let np = self.node(newparent)?;
        let from = match self.resolve(&p, name)? {
            Resolved::Encrypted(stored) => stored,
            Resolved::Plain(_) if self.encrypts_to_rename() => {
                let stored = self.encrypt_to_rename(&p, name)?;
                // The kernel's node of the name is the plaintext object's.
                self.forget_name_later(np.nodeid, newname);
                stored
            }
            Resolved::Plain(backing) => {
                return self.rename_plain(&p, &backing, &np, newname, flags)
            }
            Resolved::Absent => return Err(Errno::ENOENT),
        };
        let (to, plain_target) = if self.adopted() {
            self.rename_target(&p, &from, &np, newname, flags)?
        } else {
            (self.stored_name(&np, newname)?, None)
        };
        // After an exchange both names still exist, each with its own sidecar.
        let created = if exchange {
            false
        } else {
            self.write_sidecar(np.fd(), &to)?
        };
        let (replaced, replaced_target) = if exchange {
            (None, None)
        } else {
            self.last_link(np.fd(), to.backing())
        };
        let mut rflags = rustix::fs::RenameFlags::empty();
        if exchange {
            rflags |= rustix::fs::RenameFlags::EXCHANGE;
        }
        if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            rflags |= rustix::fs::RenameFlags::NOREPLACE;
        }
        let rename = || {
            if rflags.is_empty() {
                rustix::fs::renameat(p.fd(), from.backing(), np.fd(), to.backing())
            } else {
                rustix::fs::renameat_with(p.fd(), from.backing(), np.fd(), to.backing(), rflags)
            }
        };
        let moved = match rename() {
            // The target directory is empty in the plaintext view but holds its ID.
            Err(rustix::io::Errno::NOTEMPTY | rustix::io::Errno::EXIST) if rflags.is_empty() => {
                self.emptied_then(&np, &to, rename)
            }
            r => r.map_err(errno),
        };
        if let Err(e) = moved {
            if created {
                self.remove_sidecar(np.fd(), &to);
            }
            return Err(e);
        }
        let same_entry = p.nodeid == np.nodeid && from.backing() == to.backing();
        if !exchange && !same_entry {
            self.remove_sidecar(p.fd(), &from);
        }
        if let Some(inode) = replaced {
            inode.free_unlinked_data();
        }
        if !same_entry {
            self.remove_long_target(replaced_target);
        }
        if let Some(plain) = plain_target {
            // Replaced: from here the encrypted entry is the one shown (the collision rule).
            if let Err(e) = rustix::fs::unlinkat(np.fd(), plain.as_str(), AtFlags::empty()) {
                if e != rustix::io::Errno::NOENT {
                    tracing::warn!(
                        "{}: a replaced plaintext entry stays, hidden: {e}",
                        crate::sys::describe(np.fd())
                    );
                }
            }
            self.retire_plain(&np, plain.as_bytes());
        }
        Ok(())
    }

    pub(crate) fn do_link(
        &self,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
    ) -> Res<FileAttr> {
        self.writable()?;
        self.syncer.drain()?;
        let inode = self.node(ino)?;
        if inode.kind == Kind::Dir {
            return Err(Errno::EPERM);
        }
        if inode.is_plain() {
            // A second name would be an encrypted name of plaintext contents.
            return Err(Errno::EXDEV);
        }
        let np = self.node(newparent)?;
        let stored = self.name_for_new(&np, newname)?;
        let created = self.write_sidecar(np.fd(), &stored)?;
        // The /proc link reaches exactly this object (also an unlinked or a symlink one).
        let linked = rustix::fs::linkat(
            rustix::fs::CWD,
            sys::proc_path(inode.fd()),
            np.fd(),
            stored.backing(),
            AtFlags::SYMLINK_FOLLOW,
        );
        if let Err(e) = linked {
            if created {
                self.remove_sidecar(np.fd(), &stored);
            }
            return Err(errno(e));
        }
        self.lookup_backing(&np, stored.backing(), newname, None)
            .map(|(_, a)| a)
    }
}

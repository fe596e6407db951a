//! Extended attributes: `user.*` names and values are encrypted by the core library; POSIX
//! ACLs, `security.capability` and `trusted.*` pass through as they are, since the kernel and
//! the backing file system interpret them (the kernel enforces the ACLs: see `init`).
//! Security-module labels (`security.selinux`, `security.SMACK64`, `security.ima`, ...) are
//! not supported: a backing file's label is the ciphertext's, and the kernel labels FUSE files
//! by mount, never by xattr. Saying so (EOPNOTSUPP) lets `ls -l` stop asking for them after one
//! file, where ENODATA costs one round trip per file listed.

use crate::fs::CloakFs;
use crate::inode::{Inode, Kind};
use crate::sys::{self, errno, Res};
use fuser::{Errno, INodeNo, ReplyXattr, SetXAttrFlags};
use rustix::fd::BorrowedFd;
use rustix::fs::XattrFlags;
use std::cell::RefCell;
use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;

/// Names of the requests a mount of a sharing volume answers about a file's recipients.
const SHARE_PREFIX: &[u8] = b"user.cloakfs.share.";

/// Linux's largest xattr value and largest name list.
const XATTR_MAX: usize = 65536;

thread_local! {
    /// Buffer for backing values and name lists, reused by this worker thread.
    static XBUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Where the xattr calls reach a node's backing object: its descriptor if that is open for
/// reading, else the `/proc` path of its `O_PATH` handle (see `sys::NodeFd`).
enum Backing<'a> {
    Fd(BorrowedFd<'a>),
    Path(String),
}

impl<'a> Backing<'a> {
    fn of(inode: &'a Inode) -> Self {
        match inode.xattr_fd() {
            Some(fd) => Self::Fd(fd),
            None => Self::Path(sys::proc_path(inode.fd())),
        }
    }

    fn get_query(&self, name: &OsStr) -> rustix::io::Result<usize> {
        match self {
            Self::Fd(fd) => rustix::fs::fgetxattr_query(fd, name),
            Self::Path(p) => rustix::fs::getxattr_query(p.as_str(), name),
        }
    }

    fn get(&self, name: &OsStr, buf: &mut [u8]) -> rustix::io::Result<usize> {
        match self {
            Self::Fd(fd) => rustix::fs::fgetxattr(fd, name, buf),
            Self::Path(p) => rustix::fs::getxattr(p.as_str(), name, buf),
        }
    }

    fn list_query(&self) -> rustix::io::Result<usize> {
        match self {
            Self::Fd(fd) => rustix::fs::flistxattr_query(fd),
            Self::Path(p) => rustix::fs::listxattr_query(p.as_str()),
        }
    }

    fn list(&self, buf: &mut [u8]) -> rustix::io::Result<usize> {
        match self {
            Self::Fd(fd) => rustix::fs::flistxattr(fd, buf),
            Self::Path(p) => rustix::fs::listxattr(p.as_str(), buf),
        }
    }

    fn set(&self, name: &OsStr, value: &[u8], flags: XattrFlags) -> rustix::io::Result<()> {
        match self {
            Self::Fd(fd) => rustix::fs::fsetxattr(fd, name, value, flags),
            Self::Path(p) => rustix::fs::setxattr(p.as_str(), name, value, flags),
        }
    }

    fn remove(&self, name: &OsStr) -> rustix::io::Result<()> {
        match self {
            Self::Fd(fd) => rustix::fs::fremovexattr(fd, name),
            Self::Path(p) => rustix::fs::removexattr(p.as_str(), name),
        }
    }
}

fn enodata() -> Errno {
    Errno::from_i32(libc::ENODATA)
}

/// Replies to getxattr/listxattr: the size when asked for it, else the data if it fits.
pub(crate) fn reply_xattr(reply: ReplyXattr, size: u32, r: Res<Vec<u8>>) {
    match r {
        Ok(data) if size == 0 => reply.size(data.len() as u32),
        Ok(data) if data.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(data) => reply.data(&data),
        Err(e) => reply.error(e),
    }
}

/// Runs `call` (a backing getxattr or listxattr) on a buffer of exactly the size the value
/// needs, asked first with `query` (the same call with size 0). The kernel allocates and
/// zeroes as much as the buffer passed, whatever the answer: a XATTR_MAX buffer made every
/// call (most are misses: security.capability before each write and chown, ACLs and SELinux
/// labels for each `ls -l`) clear 64 KiB. A value that grew in between is asked again.
fn sized(
    buf: &mut Vec<u8>,
    query: impl Fn() -> rustix::io::Result<usize>,
    call: impl Fn(&mut [u8]) -> rustix::io::Result<usize>,
) -> rustix::io::Result<usize> {
    loop {
        let want = query()?;
        if want == 0 {
            return Ok(0);
        }
        buf.resize(want.min(XATTR_MAX), 0);
        match call(&mut buf[..]) {
            Err(rustix::io::Errno::RANGE) if buf.len() < XATTR_MAX => continue,
            r => return r,
        }
    }
}

/// The one `security.*` name with a meaning for the plaintext view: file capabilities, which
/// the kernel reads through the mount on exec.
const CAPABILITY: &[u8] = b"security.capability";

/// Whether `name` is a POSIX ACL (access or default), which the kernel asks for on permission
/// checks when it enforces ACLs.
fn is_posix_acl(name: &[u8]) -> bool {
    name == b"system.posix_acl_access" || name == b"system.posix_acl_default"
}

/// Whether `name` (plaintext or stored: both keep their namespace) is a security-module label.
pub(crate) fn is_lsm_label(name: &[u8]) -> bool {
    name.starts_with(b"security.") && name != CAPABILITY
}

/// Refuses the names this file system does not keep.
fn supported(name: &OsStr) -> Res<()> {
    if is_lsm_label(name.as_bytes()) {
        Err(Errno::EOPNOTSUPP)
    } else {
        Ok(())
    }
}

impl CloakFs {
    /// The stored name of xattr `name` of `inode` (`None`: passed through unencrypted, as every
    /// xattr of an adopted plaintext entry is).
    fn stored_xattr_name(&self, inode: &Inode, name: &OsStr) -> Res<Option<Vec<u8>>> {
        if inode.is_plain() {
            return Ok(None);
        }
        self.volume
            .meta()
            .encrypt_xattr_name(name.as_bytes())
            .map_err(|e| Errno::from_i32(e.errno()))
    }

    /// A request for the sharing of a file (`user.cloakfs.share.*`, FORMAT.md section 18.4),
    /// done by this mount so open handles stay coherent: `add` grants the file to the keys in
    /// `value`, `list` returns its recipients, one per line.
    fn share_request(&self, ino: INodeNo, op: &[u8], value: Option<&[u8]>) -> Res<Vec<u8>> {
        let inode = self.node(ino)?;
        if !self.codec.key_source().is_wrapped() {
            return Err(Errno::EOPNOTSUPP);
        }
        if inode.kind == Kind::Dir && op == b"default" {
            return self.share_default(&inode, value);
        }
        if inode.kind != Kind::File {
            return Err(Errno::EISDIR);
        }
        if inode.replaced() {
            // Withdrawn meanwhile (see `do_open`): the kernel looks the name up again.
            return Err(Errno::ESTALE);
        }
        if op == b"remove" {
            return match value {
                Some(v) => self.share_remove(&inode, v),
                None => Err(enodata()),
            };
        }
        let writable = value.is_some();
        if writable {
            self.writable()?;
        }
        let f = self
            .acquire(&inode, writable)
            .map_err(|e| self.coherence.stale(self.fail(&e, inode.fd(), None)))?;
        let result = match (op, value) {
            (b"add", Some(v)) => std::str::from_utf8(v)
                .map_err(|_| cloakfs_core::Error::InvalidName)
                .and_then(cloakfs_core::format::filekey::recipient_lines)
                .and_then(|more| f.grant(&more))
                .map(|_| Vec::new()),
            (b"list", None) => f.recipients().map(|r| {
                r.iter()
                    .flat_map(|l| [l.as_bytes(), b"\n"])
                    .flatten()
                    .copied()
                    .collect()
            }),
            _ => {
                drop(f);
                inode.release();
                return Err(enodata());
            }
        };
        let out = result.map_err(|e| match e {
            cloakfs_core::Error::Refused(_) | cloakfs_core::Error::InvalidName => Errno::EINVAL,
            e => self.fail(&e, f.backing().as_fd(), Some("sharing")),
        });
        drop(f);
        inode.release();
        out
    }

    /// Withdraws file `inode` from the recipient in `value`: the core re-encrypts it under a
    /// fresh file key into a temporary next to it and renames that over it, while the node's
    /// open state is locked so nothing opens it meanwhile (EBUSY while a handle has it open:
    /// the handle would go on with the old file). The old node then leads to an unlinked file,
    /// which an open answers with ESTALE, so the kernel looks the name up again.
    fn share_remove(&self, inode: &Inode, value: &[u8]) -> Res<Vec<u8>> {
        self.writable()?;
        let text = std::str::from_utf8(value).map_err(|_| Errno::EINVAL)?;
        let (parent, name) = self.inodes.seen_as(inode.nodeid).ok_or(Errno::ESTALE)?;
        let dir = self.node(INodeNo(parent))?;
        let stored = backing_name(dir.fd(), inode.fd())?;
        let backing = std::path::PathBuf::from(sys::proc_path(dir.fd())).join(stored);
        let done = inode
            .while_closed(|| cloakfs_core::tools::share::remove(&self.volume, &backing, text))
            .ok_or(Errno::EBUSY)?;
        done.map_err(|e| match e {
            cloakfs_core::Error::Refused(_) | cloakfs_core::Error::InvalidName => Errno::EINVAL,
            e => self.fail(&e, inode.fd(), Some("sharing")),
        })?;
        // Drop the kernel's name now rather than at the next open. Not from this worker: the
        // kernel takes the directory's lock for it (see `prune`).
        let notifier = self.coherence.notifier();
        std::thread::spawn(move || {
            if let Some(n) = notifier.get() {
                let _ = n.inval_entry(INodeNo(parent), OsStr::from_bytes(&name));
            }
        });
        Ok(Vec::new())
    }

    /// A directory's default recipients: set (`value`: recipient lines, empty to clear) or get.
    fn share_default(&self, inode: &Inode, value: Option<&[u8]>) -> Res<Vec<u8>> {
        use cloakfs_core::tools::share;
        let dir = std::path::PathBuf::from(sys::proc_path(inode.fd()));
        let fail = |e: cloakfs_core::Error| match e {
            cloakfs_core::Error::Refused(_) | cloakfs_core::Error::InvalidName => Errno::EINVAL,
            e => self.fail(&e, inode.fd(), Some("default recipients")),
        };
        match value {
            Some(v) => {
                self.writable()?;
                let text = std::str::from_utf8(v).map_err(|_| Errno::EINVAL)?;
                let lines = if text.trim().is_empty() {
                    Vec::new()
                } else {
                    cloakfs_core::format::filekey::recipient_lines(text).map_err(fail)?
                };
                share::write_default(&self.volume, &dir, &lines).map_err(fail)?;
                // Set by this member: applied by their mounts on this machine.
                self.defaults.allow(&lines).map_err(fail)?;
                Ok(Vec::new())
            }
            None => {
                let (applied, shown) = self
                    .defaults
                    .split(share::read_default(&self.volume, &dir).map_err(fail)?);
                let lines = applied.into_iter().chain(
                    shown
                        .into_iter()
                        .map(|r| format!("{r}\t{}", share::NOT_APPLIED)),
                );
                Ok(lines
                    .flat_map(|l| l.into_bytes().into_iter().chain([b'\n']))
                    .collect())
            }
        }
    }

    /// The default recipients of directory `parent`, which a file made in it is granted to.
    pub(crate) fn default_recipients(&self, parent: &Inode) -> Vec<String> {
        if !self.codec.key_source().is_wrapped() {
            return Vec::new();
        }
        let dir = std::path::PathBuf::from(sys::proc_path(parent.fd()));
        let all =
            cloakfs_core::tools::share::read_default(&self.volume, &dir).unwrap_or_else(|e| {
                tracing::warn!("{}: default recipients: {e}", sys::describe(parent.fd()));
                Vec::new()
            });
        let (applied, shown) = self.defaults.split(all);
        let first = || {
            (self.defaults_noted.lock())
                .unwrap_or_else(|e| e.into_inner())
                .insert(parent.nodeid)
        };
        if !shown.is_empty() && first() {
            tracing::warn!(
                "{}: new files are not granted to its default recipients {}: {}",
                sys::describe(parent.fd()),
                shown.join(", "),
                cloakfs_core::tools::share::NOT_APPLIED
            );
        }
        applied
    }

    pub(crate) fn get_xattr(&self, ino: INodeNo, name: &OsStr) -> Res<Vec<u8>> {
        if let Some(op) = name.as_bytes().strip_prefix(SHARE_PREFIX) {
            return self.share_request(ino, op, None);
        }
        supported(name)?;
        let inode = self.node(ino)?;
        // No race-free way to reach a symlink's own xattrs, and Linux allows no user.* ones.
        if inode.kind == Kind::Symlink {
            return Err(enodata());
        }
        if name.as_bytes() == CAPABILITY && inode.capability_absent() {
            return Err(enodata());
        }
        let backing = Backing::of(&inode);
        let stored = self.stored_xattr_name(&inode, name)?;
        let backing_name = stored.as_deref().unwrap_or(name.as_bytes());
        XBUF.with_borrow_mut(|buf| {
            let name = OsStr::from_bytes(backing_name);
            let n = match sized(buf, || backing.get_query(name), |b| backing.get(name, b)) {
                // Where the kernel enforces ACLs it takes any error but "none" as a failed
                // permission check (a backing directory on a file system without ACLs).
                Err(rustix::io::Errno::NOTSUP)
                    if self.posix_acl && is_posix_acl(name.as_bytes()) =>
                {
                    return Err(enodata())
                }
                r => r.map_err(errno)?,
            };
            match &stored {
                None => Ok(buf[..n].to_vec()),
                Some(enc) => self
                    .volume
                    .meta()
                    .decrypt_xattr_value(enc, &buf[..n])
                    .map_err(|e| self.fail(&e, inode.fd(), Some("xattr value"))),
            }
        })
    }

    /// Sets xattr `name` of `ino`. `setxattr_flags` carries what the kernel asks besides:
    /// with FUSE_SETXATTR_ACL_KILL_SGID on an access ACL, the caller is neither in the file's
    /// group nor has CAP_FSETID, so the set-group-ID bit goes, as ext4 clears it then; the
    /// backing file system judges by this daemon, which may be in the group or hold
    /// CAP_FSETID, and would keep it.
    pub(crate) fn set_xattr(
        &self,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        setxattr_flags: SetXAttrFlags,
    ) -> Res<()> {
        self.writable()?;
        if position != 0 {
            return Err(Errno::EINVAL);
        }
        if let Some(op) = name.as_bytes().strip_prefix(SHARE_PREFIX) {
            return self.share_request(ino, op, Some(value)).map(drop);
        }
        supported(name)?;
        let inode = self.node(ino)?;
        if inode.kind == Kind::Symlink {
            return Err(Errno::EPERM);
        }
        if name.as_bytes() == CAPABILITY {
            inode.capability_changed();
        }
        let backing = Backing::of(&inode);
        let flags = XattrFlags::from_bits_retain(flags as u32);
        match self.stored_xattr_name(&inode, name)? {
            None => backing.set(name, value, flags),
            Some(enc) => {
                let sealed = self
                    .volume
                    .meta()
                    .encrypt_xattr_value(&enc, value)
                    .map_err(|e| Errno::from_i32(e.errno()))?;
                backing.set(OsStr::from_bytes(&enc), &sealed, flags)
            }
        }
        .map_err(errno)?;
        if setxattr_flags.contains(SetXAttrFlags::FUSE_SETXATTR_ACL_KILL_SGID)
            && name.as_bytes() == b"system.posix_acl_access"
        {
            // The mode as the ACL just set it; the kernel asks for it again after the reply
            // (it drops the attributes it cached on every ACL change).
            let mode = rustix::fs::fstat(inode.fd()).map_err(errno)?.st_mode;
            if mode & libc::S_ISGID != 0 {
                let mode = rustix::fs::Mode::from_raw_mode(mode & !libc::S_ISGID & 0o7777);
                inode.chmod(mode).map_err(errno)?;
            }
        }
        self.acl_may_have_changed_mode(ino, name);
        Ok(())
    }

    /// An access ACL set or removed changes the mode with it (its owner, group-or-mask and
    /// other entries are the mode bits). Where the kernel enforces ACLs it refreshes the mode
    /// itself; elsewhere it would show the cached one until the attribute timeout, so its
    /// attributes are dropped here.
    fn acl_may_have_changed_mode(&self, ino: INodeNo, name: &OsStr) {
        if !self.posix_acl && name.as_bytes() == b"system.posix_acl_access" {
            if let Some(n) = self.pruner.notifier() {
                let _ = n.inval_inode(ino, -1, 0);
            }
        }
    }

    /// Gives encrypted file `to` the xattrs of plaintext file `from` (`cloakfs encrypt`), each
    /// stored as if set through the mount; security-module labels stay with the old file.
    pub(crate) fn carry_xattrs(&self, from: BorrowedFd<'_>, to: BorrowedFd<'_>) -> Res<()> {
        let mut names = vec![0u8; 64 * 1024];
        let n = rustix::fs::flistxattr(from, &mut names).map_err(errno)?;
        let mut value = vec![0u8; 64 * 1024];
        for name in names[..n].split(|&b| b == 0).filter(|n| !n.is_empty()) {
            if is_lsm_label(name) {
                continue;
            }
            let len = rustix::fs::fgetxattr(from, name, &mut value).map_err(errno)?;
            let meta = self.volume.meta();
            let err = |e: cloakfs_core::Error| Errno::from_i32(e.errno());
            let (stored, sealed) = match meta.encrypt_xattr_name(name).map_err(err)? {
                None => (name.to_vec(), value[..len].to_vec()),
                Some(enc) => {
                    let sealed = meta.encrypt_xattr_value(&enc, &value[..len]).map_err(err)?;
                    (enc, sealed)
                }
            };
            rustix::fs::fsetxattr(to, stored.as_slice(), &sealed, XattrFlags::empty())
                .map_err(errno)?;
        }
        Ok(())
    }

    pub(crate) fn list_xattr(&self, ino: INodeNo) -> Res<Vec<u8>> {
        let inode = self.node(ino)?;
        if inode.kind == Kind::Symlink {
            return Ok(Vec::new());
        }
        let backing = Backing::of(&inode);
        XBUF.with_borrow_mut(|buf| {
            let n = sized(buf, || backing.list_query(), |b| backing.list(b)).map_err(errno)?;
            let mut out = Vec::with_capacity(n);
            let names = buf[..n].split(|&b| b == 0);
            let suite = self.volume.content().suite();
            for stored in
                names.filter(|s| !s.is_empty() && !is_lsm_label(s) && !suite.is_header_xattr(s))
            {
                if inode.is_plain() {
                    out.extend_from_slice(stored);
                    out.push(0);
                    continue;
                }
                match self.volume.meta().decrypt_xattr_name(stored) {
                    // A directory's default recipients are reached through `share default`.
                    Ok(plain) if plain.starts_with(SHARE_PREFIX) => {}
                    Ok(plain) => {
                        out.extend_from_slice(&plain);
                        out.push(0);
                    }
                    Err(_) => {
                        let what = [b"xattr:".as_slice(), stored].concat();
                        if self.first_report(inode.nodeid, &what) {
                            tracing::warn!(
                                "{}: xattr {} does not decrypt; not listed",
                                sys::describe(inode.fd()),
                                String::from_utf8_lossy(stored)
                            );
                        }
                    }
                }
            }
            Ok(out)
        })
    }

    pub(crate) fn remove_xattr(&self, ino: INodeNo, name: &OsStr) -> Res<()> {
        self.writable()?;
        supported(name)?;
        let inode = self.node(ino)?;
        if inode.kind == Kind::Symlink {
            return Err(Errno::EPERM);
        }
        if name.as_bytes() == CAPABILITY {
            inode.capability_changed();
        }
        let stored = self.stored_xattr_name(&inode, name)?;
        let backing_name = stored.as_deref().unwrap_or(name.as_bytes());
        Backing::of(&inode)
            .remove(OsStr::from_bytes(backing_name))
            .map_err(errno)?;
        self.acl_may_have_changed_mode(ino, name);
        Ok(())
    }
}

/// The name in backing directory `dir` of backing object `node` (found by its inode number:
/// a withdrawal is rare, and the node keeps no name of its own).
fn backing_name(dir: BorrowedFd<'_>, node: BorrowedFd<'_>) -> Res<std::ffi::OsString> {
    let ino = rustix::fs::fstat(node).map_err(errno)?.st_ino;
    let fd = sys::reopen(
        dir,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
    )
    .map_err(errno)?;
    let entries = rustix::fs::Dir::read_from(&fd).map_err(errno)?;
    for e in entries {
        let e = e.map_err(errno)?;
        if e.ino() == ino {
            let name = e.file_name().to_bytes();
            if name != b"." && name != b".." {
                return Ok(OsStr::from_bytes(name).to_os_string());
            }
        }
    }
    Err(Errno::ESTALE)
}

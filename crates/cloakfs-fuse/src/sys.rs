//! Small wrappers around the system calls the front end makes on the cipher directory, and the
//! conversions of their errors into FUSE errnos.

use fuser::Errno;
use rustix::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use rustix::fs::{AtFlags, Mode, OFlags};
use std::fs::File;
use std::io::{Read, Write};

/// Result of a request handler: the error is what the kernel gets.
pub(crate) type Res<T> = Result<T, Errno>;

/// Converts a rustix error into the errno replied to the kernel.
pub(crate) fn errno(e: rustix::io::Errno) -> Errno {
    Errno::from_i32(e.raw_os_error())
}

/// Converts a std error into the errno replied to the kernel (EIO when it carries none).
pub(crate) fn io_errno(e: &std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

/// The identity of one version of a file: a file rewritten or replaced (by a repair, a sync
/// tool) has another, and a reused inode number comes with a new ctime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct FileVersion {
    pub(crate) dev: u64,
    pub(crate) ino: u64,
    pub(crate) size: i64,
    pub(crate) mtime: (i128, i128),
    pub(crate) ctime: (i128, i128),
}

impl FileVersion {
    pub(crate) fn of(st: &rustix::fs::Stat) -> Self {
        Self {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size,
            // `.into()`: the field types differ between architectures.
            mtime: (st.st_mtime.into(), st.st_mtime_nsec.into()),
            ctime: (st.st_ctime.into(), st.st_ctime_nsec.into()),
        }
    }
}

/// `/proc/self/fd/N`: the path that reaches exactly the object behind descriptor `fd`, used to
/// reopen an `O_PATH` descriptor for I/O and for the calls that only take paths.
pub(crate) fn proc_path(fd: BorrowedFd<'_>) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// The backing path of a descriptor, for log lines only (never a plaintext name).
pub(crate) fn describe(fd: BorrowedFd<'_>) -> String {
    match rustix::fs::readlinkat(rustix::fs::CWD, proc_path(fd), Vec::new()) {
        Ok(p) => p.to_string_lossy().into_owned(),
        Err(_) => format!("<backing fd {}>", fd.as_raw_fd()),
    }
}

/// Opens `name` inside directory `dir` as an `O_PATH` handle, never following a symlink.
pub(crate) fn open_path(dir: BorrowedFd<'_>, name: &str) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// A node's hold on its backing object: a descriptor that pins it, open for reading where
/// that is as cheap as an `O_PATH` one.
///
/// Why readable: the xattr calls take no `O_PATH` descriptor, so on one they go through
/// `/proc/self/fd/N`, a four-component walk that makes a proc inode each time (84% of a
/// getxattr's cost under `ls -lR`, which asks for every file's ACL). A readable descriptor
/// takes `fgetxattr` and friends directly. Only regular files and directories are opened so
/// (opening a device or fifo has effects), and only on a local backing file system: there an
/// open sends nothing anywhere, where on NFS, SMB or sshfs it is a network request (and NFS
/// renames an open file that is unlinked).
#[derive(Debug)]
pub(crate) struct NodeFd {
    fd: OwnedFd,
    readable: bool,
}

impl NodeFd {
    /// Holds `fd`, an `O_PATH` descriptor.
    pub(crate) fn path(fd: OwnedFd) -> Self {
        Self {
            fd,
            readable: false,
        }
    }

    /// Holds `fd`, a descriptor open for reading.
    pub(crate) fn readable(fd: OwnedFd) -> Self {
        Self { fd, readable: true }
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The descriptor, if the xattr calls can take it.
    pub(crate) fn for_xattrs(&self) -> Option<BorrowedFd<'_>> {
        self.readable.then(|| self.fd.as_fd())
    }

    /// Changes the object's mode: `fchmod` where the descriptor takes it (an `O_PATH` one it
    /// refuses), else through `/proc/self/fd/N`, a walk that costs a proc inode.
    pub(crate) fn chmod(&self, mode: Mode) -> rustix::io::Result<()> {
        if self.readable {
            rustix::fs::fchmod(&self.fd, mode)
        } else {
            rustix::fs::chmod(proc_path(self.fd.as_fd()), mode)
        }
    }
}

/// Whether opening objects on the file system of `fd` for reading costs no more than an
/// `O_PATH` open: the local disk file systems and tmpfs (see [`NodeFd`]).
pub(crate) fn opens_are_local(fd: BorrowedFd<'_>) -> bool {
    /// ext4 (also ext2/3), XFS, Btrfs, tmpfs, F2FS, ZFS: the magic numbers of statfs(2).
    const LOCAL: [u32; 6] = [
        0xef53,
        0x5846_5342,
        0x9123_683e,
        0x0102_1994,
        0xf2f5_2010,
        0x2fc1_2fc1,
    ];
    // f_type is a word; the magic numbers are 32-bit.
    rustix::fs::fstatfs(fd).is_ok_and(|st| LOCAL.contains(&(st.f_type as u32)))
}

/// Opens `name` inside `dir` as a node, never following a symlink: readable when `kind` (the
/// listing's file type, a hint only) says a regular file or directory and `local`, else (or
/// if that open is refused) as an `O_PATH` handle. The caller checks the type it gets.
pub(crate) fn open_node(
    dir: BorrowedFd<'_>,
    name: &str,
    kind: Option<fuser::FileType>,
    local: bool,
) -> rustix::io::Result<NodeFd> {
    let flags = match kind {
        // Non-blocking: a lease holder is not waited for (the O_PATH handle is taken).
        Some(fuser::FileType::RegularFile) if local => {
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY
        }
        Some(fuser::FileType::Directory) if local => OFlags::RDONLY | OFlags::DIRECTORY,
        _ => return open_path(dir, name).map(NodeFd::path),
    };
    match rustix::fs::openat(
        dir,
        name,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => Ok(NodeFd::readable(fd)),
        Err(e @ rustix::io::Errno::NOENT) => Err(e),
        Err(_) => open_path(dir, name).map(NodeFd::path),
    }
}

/// Opens the directory behind the (`O_PATH`) descriptor `dir` for reading its entries or
/// syncing it.
pub(crate) fn open_dir(dir: BorrowedFd<'_>) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Opens subdirectory `name` of `dir` for reading its entries (a symlink is refused).
pub(crate) fn open_subdir_readable<P: rustix::path::Arg>(
    dir: BorrowedFd<'_>,
    name: P,
) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Reopens the object behind an `O_PATH` descriptor with real access `flags`.
pub(crate) fn reopen(fd: BorrowedFd<'_>, flags: OFlags) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        rustix::fs::CWD,
        proc_path(fd),
        flags | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// `faccessat2(/proc/self/fd/N, access, AT_EACCESS)`: whether the object behind `fd` allows
/// `access` to the thread's current file-system ids (switched per request in the tree).
/// Called directly, never emulated: an emulation would check as the real user, root.
pub(crate) fn eaccess(fd: BorrowedFd<'_>, access: rustix::fs::Access) -> rustix::io::Result<()> {
    let path = std::ffi::CString::new(proc_path(fd)).map_err(|_| rustix::io::Errno::INVAL)?;
    // SAFETY: `path` is a valid NUL-terminated string that outlives the call; the other
    // arguments are plain integers. faccessat2 only reads the path.
    let r = unsafe {
        libc::syscall(
            libc::SYS_faccessat2,
            libc::AT_FDCWD,
            path.as_ptr(),
            access.bits() as libc::c_int,
            libc::AT_EACCESS,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(rustix::io::Errno::from_raw_os_error(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        ))
    }
}

/// Opens cloakfs's own file `name` inside `dir` for reading (never through a symlink).
pub(crate) fn open_internal(dir: BorrowedFd<'_>, name: &str) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Reads a small file `name` inside `dir` (at most `max` bytes; more is an error).
pub(crate) fn read_small(dir: BorrowedFd<'_>, name: &str, max: usize) -> std::io::Result<Vec<u8>> {
    read_fd_small(open_internal(dir, name)?, max)
}

/// Reads all of open file `fd`, failing with EFBIG if it holds more than `max` bytes.
pub(crate) fn read_fd_small(fd: OwnedFd, max: usize) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(max + 1);
    File::from(fd).take(max as u64 + 1).read_to_end(&mut out)?;
    if out.len() > max {
        return Err(std::io::Error::from_raw_os_error(libc::EFBIG));
    }
    Ok(out)
}

/// Creates file `name` in `dir` with `bytes` (failing if it exists) and makes it durable.
pub(crate) fn write_new_durable(
    dir: BorrowedFd<'_>,
    name: &str,
    bytes: &[u8],
    mode: u32,
) -> std::io::Result<()> {
    write_new(dir, name, bytes, mode, true).map(drop)
}

/// Creates file `name` in `dir` with `bytes` (failing if it exists), fsynced if `sync`, and
/// returns its descriptor (open for writing, so that it can be fsynced later).
pub(crate) fn write_new(
    dir: BorrowedFd<'_>,
    name: &str,
    bytes: &[u8],
    mode: u32,
    sync: bool,
) -> std::io::Result<OwnedFd> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
    )?;
    let mut f = File::from(fd);
    let mut written = f.write_all(bytes);
    if sync {
        written = written.and_then(|()| f.sync_all());
    }
    if let Err(e) = written {
        // A partial file must not stay behind under a name that means something.
        let _ = rustix::fs::unlinkat(dir, name, AtFlags::empty());
        return Err(e);
    }
    Ok(f.into())
}

/// Syncs the directory behind `dir`.
pub(crate) fn sync_dir(dir: BorrowedFd<'_>) -> rustix::io::Result<()> {
    rustix::fs::fsync(open_dir(dir)?)
}

thread_local! {
    static OWN_UMASK: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Makes the calling worker thread create objects with exactly the modes it asks for: the
/// thread gets its own file-system context with umask 0, so the rest of the process keeps its
/// umask. Returns whether the thread has a umask of its own.
pub(crate) fn exact_modes() -> bool {
    OWN_UMASK.with(|own| {
        if let Some(done) = own.get() {
            return done;
        }
        // SAFETY: only the file-system context (cwd, root, umask) is unshared; descriptor
        // tables stay shared, so every descriptor remains usable on every thread.
        let done = match unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::FS) }
        {
            Ok(()) => {
                rustix::process::umask(Mode::empty());
                true
            }
            Err(e) => {
                tracing::warn!(
                    "cannot give a worker thread its own umask ({e}): new objects get the daemon's"
                );
                false
            }
        };
        own.set(Some(done));
        done
    })
}

/// Runs `make`, a backing create of an object for a caller whose umask is `umask`, with the
/// worker thread's umask set to it: the backing file system then gives the object the mode
/// asked for minus the umask, or, under a directory with a default ACL, that ACL and no umask
/// (as ext4 does for the caller). `make` is given the mask to apply to the mode itself: all
/// bits, unless the thread could not have a umask of its own (the umask is then applied by
/// hand and a default ACL meets the mode without it). A `umask` of 0 (the kernel applied it
/// already: no FUSE_POSIX_ACL) leaves the thread's umask alone.
pub(crate) fn with_umask<T>(umask: u32, make: impl FnOnce(u32) -> T) -> T {
    let umask = umask & 0o777;
    if !exact_modes() {
        return make(!umask & 0o7777);
    }
    if umask == 0 {
        return make(0o7777);
    }
    rustix::process::umask(Mode::from_raw_mode(umask));
    let made = make(0o7777);
    rustix::process::umask(Mode::empty());
    made
}

/// Raises the limit of open descriptors as far as allowed: every node the kernel knows holds
/// one. The soft limit goes to the hard one, and with CAP_SYS_RESOURCE (root) both go to the
/// kernel's ceiling (`fs.nr_open`), as a file server's would. Beyond the limit, nodes are
/// pruned (see `prune`).
pub(crate) fn raise_nofile_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut lim = getrlimit(Resource::Nofile);
    let ceiling = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    if let Some(c) = ceiling.filter(|&c| lim.maximum.is_some_and(|m| m < c)) {
        let raised = rustix::process::Rlimit {
            current: Some(c),
            maximum: Some(c),
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            return;
        }
    }
    if lim.current != lim.maximum {
        lim.current = lim.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, lim) {
            tracing::debug!("cannot raise RLIMIT_NOFILE: {e}");
        }
    }
}

/// Descriptors the table is grown to before the serving threads start (see
/// [`reserve_descriptor_table`]): the nodes of a large working set (Postmark's 20,000 files, a
/// source tree) fit without the table growing again.
const RESERVED_DESCRIPTORS: u64 = 65_536;

/// Grows this process's descriptor table to hold [`RESERVED_DESCRIPTORS`] (or the limit, if
/// lower) now, before the serving threads start and before any request can wait on it. The
/// kernel doubles the table as descriptors are opened, and in a process of several threads
/// each doubling waits for an RCU grace period (`expand_fdtable`), 10-25 ms here, during which
/// every thread that opens a descriptor waits too: one stalled request at the 256th, 512th,
/// 1024th... node. The table never shrinks, and a fork copies only the part in use, so this
/// is done by the serving process.
/// Costs 8 bytes of kernel memory per descriptor (512 KiB).
pub(crate) fn reserve_descriptor_table() {
    use rustix::process::{getrlimit, Resource};
    let limit = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    let top = RESERVED_DESCRIPTORS.min(limit).saturating_sub(1);
    // A duplicate at the top (closed again at once) makes the kernel size the table for it.
    if let Err(e) = rustix::io::fcntl_dupfd_cloexec(std::io::stderr(), top as i32) {
        tracing::debug!("cannot grow the descriptor table to {top}: {e}");
    }
}

/// Best-effort lazy unmount of `mountpoint` (after the daemon failed while still mounted).
pub(crate) fn detach(mountpoint: &std::path::Path) {
    let done = rustix::mount::unmount(mountpoint, rustix::mount::UnmountFlags::DETACH).is_ok();
    if !done {
        let _ = std::process::Command::new("fusermount3")
            .arg("-u")
            .arg("-z")
            .arg("--")
            .arg(mountpoint)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// Raises knobs of the kernel's backing-device info for the mount at `mountpoint` (given
/// canonical): each `(name, value)` of /sys/class/bdi/DEV/ below `value` is set to it (best
/// effort: needs root). The kernel starts FUSE mounts at conservative values and lets the
/// daemon only lower them during the handshake (see the constants in `ops`). The device comes
/// from /proc/self/mountinfo: a stat of the mount point would wait for a server that is not
/// running yet.
pub(crate) fn raise_bdi_knobs(mountpoint: &std::path::Path, knobs: &[(&str, u64)]) {
    let Some(dev) = mount_device(mountpoint) else {
        return;
    };
    for (name, value) in knobs {
        let knob = format!("/sys/class/bdi/{dev}/{name}");
        let current = std::fs::read_to_string(&knob)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok());
        if current.is_some_and(|c| c < *value) {
            if let Err(e) = std::fs::write(&knob, value.to_string()) {
                tracing::debug!("cannot raise {knob}: {e}");
            }
        }
    }
}

/// The device (major, minor) of the newest mount at `mountpoint`, from /proc/self/mountinfo
/// (nothing asks the file system, which may not be served yet, or no longer).
pub(crate) fn mount_device_numbers(mountpoint: &std::path::Path) -> Option<(u32, u32)> {
    let dev = mount_device(mountpoint)?;
    let (major, minor) = dev.split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Aborts the FUSE connection of the mount whose device is (`major`, `minor`) through the
/// fuse control file system (where it is mounted, as systemd does): every request waiting on
/// it fails and its server's reads end. `NotFound` without the control file system.
pub(crate) fn abort_connection(major: u32, minor: u32) -> std::io::Result<()> {
    // The kernel names a connection by its device number in the kernel's encoding.
    let dev = (u64::from(major) << 20) | u64::from(minor);
    std::fs::write(format!("/sys/fs/fuse/connections/{dev}/abort"), b"1")
}

/// The `major:minor` of the newest mount at `mountpoint`.
fn mount_device(mountpoint: &std::path::Path) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    let info = std::fs::read("/proc/self/mountinfo").ok()?;
    let want = mountpoint.as_os_str().as_bytes();
    info.split(|&b| b == b'\n').rev().find_map(|line| {
        let mut f = line.split(|&b| b == b' ');
        let dev = f.nth(2)?;
        let point = f.nth(1)?;
        (unescape_mountinfo(point) == want).then(|| String::from_utf8_lossy(dev).into_owned())
    })
}

/// Undoes the octal escapes (`\040` for a space, ...) of a mountinfo field.
fn unescape_mountinfo(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let oct = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match oct {
            Some(d) => {
                out.push(d.iter().fold(0u8, |v, c| v.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn mountinfo_escapes() {
        assert_eq!(super::unescape_mountinfo(b"/a\\040b\\134c"), b"/a b\\c");
        assert_eq!(super::unescape_mountinfo(b"/plain\\x"), b"/plain\\x");
    }
}

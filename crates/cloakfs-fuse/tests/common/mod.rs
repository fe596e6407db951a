//! Test harness: a fresh volume in a temporary directory, mounted for real through FUSE and
//! served on a thread, unmounted with `fusermount3 -u`.

#![allow(dead_code)]

use cloakfs_core::crypto::kdf::Argon2Params;
use cloakfs_core::crypto::secret::Passphrase;
use cloakfs_core::format::config::VolumeParams;
use cloakfs_core::Volume;
use cloakfs_fuse::MountOptions;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::JoinHandle;

/// Passphrase of every test volume.
pub const PASS: &[u8] = b"correct horse battery staple";

/// Cheap Argon2id parameters: the tests are about the file system, not the KDF.
pub fn kdf() -> Argon2Params {
    Argon2Params::LEAST
}

/// Creates a volume in `cipher` (which must be missing or empty).
pub fn create_volume(cipher: &Path) {
    create_volume_with(cipher, |_| {})
}

/// Creates a volume in `cipher` (which must be missing or empty) with parameters changed by
/// `p`.
pub fn create_volume_with(cipher: &Path, p: impl FnOnce(&mut VolumeParams)) {
    let mut params = VolumeParams::new();
    p(&mut params);
    Volume::create(cipher, params, &Passphrase::new(PASS.to_vec()), kdf()).expect("create volume");
}

/// Unlocks the volume in `cipher`.
pub fn unlock(cipher: &Path) -> Volume {
    Volume::unlock(cipher, &Passphrase::new(PASS.to_vec())).expect("unlock volume")
}

/// Whether the tests run as root (device nodes, chown, tmpfs mounts need it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A mounted test volume.
pub struct TestFs {
    pub tmp: tempfile::TempDir,
    pub cipher: PathBuf,
    pub mnt: PathBuf,
    pub opts: MountOptions,
    server: Option<JoinHandle<io::Result<()>>>,
}

impl TestFs {
    /// A new volume, mounted with default options.
    pub fn new() -> Self {
        Self::with(|_| {})
    }

    /// A new volume, mounted with options changed by `f`.
    pub fn with(f: impl FnOnce(&mut MountOptions)) -> Self {
        Self::made(|_| {}, f)
    }

    /// A new volume made with parameters changed by `p`, mounted with default options.
    pub fn with_params(p: impl FnOnce(&mut VolumeParams)) -> Self {
        Self::made(p, |_| {})
    }

    fn made(p: impl FnOnce(&mut VolumeParams), f: impl FnOnce(&mut MountOptions)) -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let cipher = tmp.path().join("cipher");
        let mnt = tmp.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        create_volume_with(&cipher, p);
        Self::mount_existing(tmp, cipher, mnt, f)
    }

    /// Mounts the volume already in `cipher` at `mnt`; `tmp` is kept alive with it.
    pub fn mount_existing(
        tmp: tempfile::TempDir,
        cipher: PathBuf,
        mnt: PathBuf,
        f: impl FnOnce(&mut MountOptions),
    ) -> Self {
        let mut opts = MountOptions::new(&cipher);
        opts.threads = 4;
        f(&mut opts);
        let mut t = Self {
            tmp,
            cipher,
            mnt,
            opts,
            server: None,
        };
        t.mount();
        t
    }

    /// Mounts (again) and starts serving on a thread.
    pub fn mount(&mut self) {
        assert!(self.server.is_none(), "already mounted");
        let volume = unlock(&self.cipher);
        let mounted =
            cloakfs_fuse::mount(volume, &self.cipher, &self.mnt, &self.opts).expect("mount");
        self.server = Some(std::thread::spawn(move || mounted.run()));
    }

    /// Unmounts with `fusermount3 -u` and waits until the server has finished.
    pub fn unmount(&mut self) {
        let status = fusermount(&["-u"], &self.mnt);
        assert!(status.is_ok(), "fusermount3 -u failed: {status:?}");
        let server = self.server.take().expect("not mounted");
        server
            .join()
            .expect("server thread panicked")
            .expect("server ended with an error");
    }

    /// Unmounts and mounts again (fresh kernel caches, fresh daemon state).
    pub fn remount(&mut self) {
        self.unmount();
        self.mount();
    }

    /// Path of `rel` inside the mount.
    pub fn p(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// The backing path of plaintext path `rel` (computed offline from the volume).
    pub fn backing(&self, rel: &str) -> PathBuf {
        cloakfs_core::tools::paths::encrypt_path(
            &unlock(&self.cipher),
            &self.cipher,
            Path::new(rel),
        )
        .expect("encrypt path")
    }
}

impl Drop for TestFs {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            if fusermount(&["-u"], &self.mnt).is_ok() {
                let _ = server.join();
            } else {
                // Something is still open (a failing test): detach, never leave a mount.
                let _ = fusermount(&["-u", "-z"], &self.mnt);
            }
        }
    }
}

/// Serializes process creation in the test binary. A child holds copies of every descriptor
/// of the process until it executes its program; if a file of another test's mount is among
/// them, that test's unmount fails as busy. So children are only created under this lock,
/// and unmounting (itself a child) holds it until done.
static SPAWN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn spawn_lock() -> std::sync::MutexGuard<'static, ()> {
    SPAWN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs fusermount3 with `args` on `mnt`.
fn fusermount(args: &[&str], mnt: &Path) -> Result<(), String> {
    let _g = spawn_lock();
    let out = Command::new("fusermount3")
        .args(args)
        .arg(mnt)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Starts `cmd` (under the spawn lock, see [`SPAWN`]).
pub fn spawn(cmd: &mut Command) -> std::process::Child {
    let _g = spawn_lock();
    cmd.spawn().expect("spawn")
}

/// Runs `cmd` to completion and returns whether it succeeded.
pub fn run(cmd: &mut Command) -> bool {
    spawn(cmd).wait().expect("wait").success()
}

/// Where a test runs in a process of its own ([`in_own_process`]): the mount it works in.
const OWN_PROCESS_DIR: &str = "CLOAKFS_TEST_OWN_PROCESS_DIR";

/// The mount to work in, when this process is a test's own (see [`in_own_process`]).
pub fn own_process_dir() -> Option<PathBuf> {
    std::env::var_os(OWN_PROCESS_DIR).map(Into::into)
}

/// Runs test `name` again in a process of its own, with `mnt` as [`own_process_dir`], and
/// fails if it fails. Pages of the mount are faulted there, not here: this process serves the
/// mount, and a thread of it may need the memory-map lock that a thread faulting a page of
/// the mount holds.
pub fn in_own_process(name: &str, mnt: &Path) {
    let ok = run(Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture"])
        .env(OWN_PROCESS_DIR, mnt));
    assert!(ok, "{name} failed in its own process (its output above)");
}

/// Every file and directory below `dir`, depth first (not following symlinks).
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if std::fs::symlink_metadata(&p).unwrap().is_dir() {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}

/// Names listed in `dir`, sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The raw OS error of an io::Error.
pub fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

/// A small deterministic generator (xorshift64*), so random tests are reproducible.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// A path as a C string.
pub fn cpath(p: &Path) -> std::ffi::CString {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// Turns a libc return value into a Result.
pub fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A new shared mapping of the first `len` bytes of `f` with protection `prot` (panics if
/// the kernel refuses it). Using it, and unmapping it, is the caller's (unsafe) part.
pub fn map_shared(f: &std::fs::File, len: usize, prot: libc::c_int) -> *mut u8 {
    use std::os::fd::AsRawFd;
    // SAFETY: a new mapping at an address the kernel chooses replaces nothing of ours.
    let m = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(m, libc::MAP_FAILED, "{}", io::Error::last_os_error());
    m.cast()
}

/// Reads `buf.len()` bytes at `off`, fewer only at the end of the file; returns the count.
pub fn read_full(f: &std::fs::File, buf: &mut [u8], off: u64) -> usize {
    use std::os::unix::fs::FileExt;
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], off + n as u64).unwrap() {
            0 => break,
            k => n += k,
        }
    }
    n
}

/// Polls `cond` until it holds or 10 s pass.
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        std::thread::yield_now();
    }
}

/// Waits until the mount, served in this process, has released every handle that could write
/// to `backing` (the cipher-directory file of a plaintext file). close(2) returns before the
/// kernel's RELEASE is served, and the serving threads take requests in no fixed order, so a
/// test that asserts what holds once a file is closed waits for this first. The daemon closes
/// a node's read-write descriptor after the release of its last handle, which is how it shows.
pub fn wait_released(backing: &Path) {
    let target = backing.canonicalize().expect("backing file");
    eventually(&format!("the release of {}", target.display()), || {
        writable_descriptors(&target) == 0
    });
}

/// This process's descriptors of `target` opened for writing.
fn writable_descriptors(target: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| l == target))
        .filter(|e| {
            // A descriptor closed meanwhile has no fdinfo: not a writer.
            let info = std::fs::read_to_string(Path::new("/proc/self/fdinfo").join(e.file_name()));
            info.ok()
                .and_then(|i| {
                    let flags = i.lines().find_map(|l| l.strip_prefix("flags:"))?;
                    i64::from_str_radix(flags.trim(), 8).ok()
                })
                .is_some_and(|f| f & i64::from(libc::O_ACCMODE) != i64::from(libc::O_RDONLY))
        })
        .count()
}

/// Every name `readdir(3)` returns for `dir`, `.` and `..` included, sorted.
pub fn raw_names(dir: &Path) -> Vec<Vec<u8>> {
    let c = cpath(dir);
    let mut out = Vec::new();
    // SAFETY: `c` is a valid C string; the DIR pointer is checked and closed below, and each
    // dirent is read before the next readdir call.
    unsafe {
        let d = libc::opendir(c.as_ptr());
        assert!(!d.is_null(), "opendir: {}", io::Error::last_os_error());
        loop {
            let e = libc::readdir(d);
            if e.is_null() {
                break;
            }
            out.push(
                std::ffi::CStr::from_ptr((*e).d_name.as_ptr())
                    .to_bytes()
                    .to_vec(),
            );
        }
        libc::closedir(d);
    }
    out.sort();
    out
}

/// `getxattr(2)` (following symlinks when `follow`).
pub fn getxattr(p: &Path, name: &str, follow: bool) -> io::Result<Vec<u8>> {
    let c = cpath(p);
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 65536];
    // SAFETY: valid C strings and a buffer of the stated length.
    let r = unsafe {
        if follow {
            libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
        } else {
            libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
        }
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(r as usize);
    Ok(buf)
}

/// `setxattr(2)`.
pub fn setxattr(p: &Path, name: &str, value: &[u8], flags: i32) -> io::Result<()> {
    let c = cpath(p);
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: valid C strings and a value buffer of the stated length.
    check(unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })
}

/// `removexattr(2)`.
pub fn removexattr(p: &Path, name: &str) -> io::Result<()> {
    let c = cpath(p);
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: valid C strings.
    check(unsafe { libc::removexattr(c.as_ptr(), n.as_ptr()) })
}

/// `llistxattr(2)`: the names, without following a symlink.
pub fn listxattr(p: &Path) -> io::Result<Vec<Vec<u8>>> {
    let c = cpath(p);
    let mut buf = vec![0u8; 65536];
    // SAFETY: a valid C string and a buffer of the stated length.
    let r = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(r as usize);
    Ok(buf
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(<[u8]>::to_vec)
        .collect())
}

/// `fallocate(2)` on an open file.
pub fn fallocate(f: &std::fs::File, mode: i32, off: i64, len: i64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fallocate on an open descriptor with integer arguments.
    check(unsafe { libc::fallocate(f.as_raw_fd(), mode, off, len) })
}

/// `renameat2(2)` with flags.
pub fn rename2(from: &Path, to: &Path, flags: u32) -> io::Result<()> {
    let (a, b) = (cpath(from), cpath(to));
    // SAFETY: valid C strings; AT_FDCWD for both directories.
    check(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    })
}

//! Extended attributes of backing entries, never following symlinks (the `l*xattr` calls).
//! Used by the offline tools (fsck, export, rekey), which see the cipher directory directly.

use std::io;
use std::path::Path;

/// Largest xattr list and value Linux hands out (XATTR_LIST_MAX, XATTR_SIZE_MAX).
const XATTR_MAX: usize = 65536;

fn unsupported(e: &rustix::io::Errno) -> bool {
    *e == rustix::io::Errno::NOTSUP || *e == rustix::io::Errno::NOSYS
}

/// The names of every extended attribute of `path` (empty where the file system has none).
pub fn list(path: &Path) -> io::Result<Vec<Vec<u8>>> {
    let mut buf = vec![0u8; XATTR_MAX];
    let n = match rustix::fs::llistxattr(path, &mut buf[..]) {
        Ok(n) => n,
        Err(e) if unsupported(&e) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    Ok(buf[..n]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(<[u8]>::to_vec)
        .collect())
}

/// The value of attribute `name` of `path`.
pub fn get(path: &Path, name: &[u8]) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; XATTR_MAX];
    let n = rustix::fs::lgetxattr(path, name, &mut buf[..])?;
    buf.truncate(n);
    Ok(buf)
}

/// Sets attribute `name` of `path` (creating or replacing it).
pub fn set(path: &Path, name: &[u8], value: &[u8]) -> io::Result<()> {
    Ok(rustix::fs::lsetxattr(
        path,
        name,
        value,
        rustix::fs::XattrFlags::empty(),
    )?)
}

/// Removes attribute `name` of `path`; a missing attribute is not an error.
pub fn remove(path: &Path, name: &[u8]) -> io::Result<()> {
    match rustix::fs::lremovexattr(path, name) {
        Err(rustix::io::Errno::NODATA) => Ok(()),
        r => Ok(r?),
    }
}

/// Whether `name` is in the encrypted `user.` namespace.
pub fn is_user(name: &[u8]) -> bool {
    name.starts_with(crate::format::meta::USER_XATTR_PREFIX.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_where_supported() {
        let t = tempfile::NamedTempFile::new().unwrap();
        match set(t.path(), b"user.cloakfs-test", b"v") {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return,
            Err(e) => panic!("{e}"),
        }
        assert!(list(t.path())
            .unwrap()
            .contains(&b"user.cloakfs-test".to_vec()));
        assert_eq!(get(t.path(), b"user.cloakfs-test").unwrap(), b"v");
        remove(t.path(), b"user.cloakfs-test").unwrap();
        remove(t.path(), b"user.cloakfs-test").unwrap();
        assert!(get(t.path(), b"user.cloakfs-test").is_err());
        assert!(is_user(b"user.x") && !is_user(b"security.selinux"));
    }
}

//! The login password while the module holds it: in memory locked against swapping, wiped
//! when dropped.

use zeroize::Zeroize;

/// Longest password kept (Linux-PAM's own limit on a conversation answer is 512 bytes).
const CAPACITY: usize = 1024;

/// Bytes in a fixed, mlocked buffer that is zeroed on drop. Never printed.
pub struct LockedBytes {
    buf: Box<[u8; CAPACITY]>,
    len: usize,
}

impl LockedBytes {
    /// A copy of `bytes` (None if longer than the buffer).
    pub fn copy_of(bytes: &[u8]) -> Option<Self> {
        if bytes.len() > CAPACITY {
            return None;
        }
        let mut buf = Box::new([0u8; CAPACITY]);
        // SAFETY: mlock on the buffer this box owns, with its exact length; failure (a low
        // RLIMIT_MEMLOCK) leaves it unlocked, which is not unsafe.
        unsafe { libc::mlock(buf.as_ptr().cast(), CAPACITY) };
        buf[..bytes.len()].copy_from_slice(bytes);
        Some(Self {
            buf,
            len: bytes.len(),
        })
    }

    pub fn expose(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for LockedBytes {
    fn drop(&mut self) {
        self.buf.zeroize();
        // SAFETY: munlock of the range locked in `copy_of`.
        unsafe { libc::munlock(self.buf.as_ptr().cast(), CAPACITY) };
    }
}

impl std::fmt::Debug for LockedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LockedBytes([redacted])")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_and_refuses_too_long() {
        let s = LockedBytes::copy_of(b"hunter2").unwrap();
        assert_eq!(s.expose(), b"hunter2");
        assert!(!format!("{s:?}").contains("hunter2"));
        assert!(LockedBytes::copy_of(&[1u8; CAPACITY + 1]).is_none());
    }
}

//! Permission sets of authorizations and sessions (NCryptfs 3.3.1), as a small bit set with
//! the protocol names of [`crate::protocol::PERMISSIONS`].

use crate::protocol::PERMISSIONS;
use std::fmt;

/// A set of permissions.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Perms(u16);

impl Perms {
    pub const NONE: Perms = Perms(0);
    pub const READ: Perms = Perms(1 << 0);
    pub const WRITE: Perms = Perms(1 << 1);
    pub const EXEC: Perms = Perms(1 << 2);
    /// May re-attach (resupply the key to) this name; carried for delegation.
    pub const ATTACH: Perms = Perms(1 << 3);
    /// Carried for delegation; `auth` itself only needs a matching, unexpired authorization.
    pub const AUTH: Perms = Perms(1 << 4);
    pub const DETACH: Perms = Perms(1 << 5);
    pub const ADD_AUTHZ: Perms = Perms(1 << 6);
    pub const LIST_AUTHZ: Perms = Perms(1 << 7);
    pub const DEL_AUTHZ: Perms = Perms(1 << 8);
    pub const REVOKE: Perms = Perms(1 << 9);
    pub const BYPASS: Perms = Perms(1 << 10);
    /// Every permission (the attach owner's session).
    pub const ALL: Perms = Perms((1 << 11) - 1);

    /// The permission called `name` in the protocol.
    pub fn from_name(name: &str) -> Option<Perms> {
        PERMISSIONS
            .iter()
            .position(|p| *p == name)
            .map(|i| Perms(1 << i))
    }

    /// Parses protocol names; `all` stands for every permission. Unknown names are an error.
    pub fn parse<S: AsRef<str>>(names: &[S]) -> Result<Perms, String> {
        let mut p = Perms::NONE;
        for n in names {
            let n = n.as_ref();
            if n == "all" {
                p |= Perms::ALL;
                continue;
            }
            match Perms::from_name(n) {
                Some(one) => p |= one,
                None => {
                    return Err(format!(
                        "unknown permission {n:?} (known: {})",
                        PERMISSIONS.join(", ")
                    ))
                }
            }
        }
        Ok(p)
    }

    /// The protocol names of the permissions in the set, in protocol order.
    pub fn names(self) -> Vec<String> {
        PERMISSIONS
            .iter()
            .enumerate()
            .filter(|(i, _)| self.0 & (1 << i) != 0)
            .map(|(_, n)| (*n).to_string())
            .collect()
    }

    /// Every permission of `other` is in `self`.
    pub fn contains(self, other: Perms) -> bool {
        self.0 & other.0 == other.0
    }

    /// At least one permission of `other` is in `self`.
    pub fn intersects(self, other: Perms) -> bool {
        self.0 & other.0 != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::ops::BitOr for Perms {
    type Output = Perms;
    fn bitor(self, rhs: Perms) -> Perms {
        Perms(self.0 | rhs.0)
    }
}

impl std::ops::BitOrAssign for Perms {
    fn bitor_assign(&mut self, rhs: Perms) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for Perms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Perms({})", self.names().join(","))
    }
}

impl fmt::Display for Perms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.names().join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for n in PERMISSIONS {
            let p = Perms::parse(&[*n]).unwrap();
            assert_eq!(p.names(), vec![n.to_string()]);
        }
        assert_eq!(Perms::parse(&["all"]).unwrap(), Perms::ALL);
        assert_eq!(Perms::ALL.names().len(), PERMISSIONS.len());
        assert!(Perms::parse(&["read", "fly"]).is_err());
        assert_eq!(Perms::from_name("add-authz"), Some(Perms::ADD_AUTHZ));
        assert_eq!(Perms::from_name("bypass"), Some(Perms::BYPASS));
    }

    #[test]
    fn subset() {
        let rw = Perms::READ | Perms::WRITE;
        assert!(rw.contains(Perms::READ));
        assert!(!Perms::READ.contains(rw));
        assert!(Perms::ALL.contains(rw));
        assert!(rw.intersects(Perms::WRITE | Perms::EXEC));
    }
}

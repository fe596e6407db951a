//! The account of the user who logs in: ids, home, groups (from the system's user database).

use std::ffi::{CStr, CString};

/// A user account.
#[derive(Debug, Clone)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
    /// Every group the user is in (primary first).
    pub gids: Vec<u32>,
}

impl Account {
    /// Looks up `name`; None if there is no such user.
    pub fn lookup(name: &str) -> Option<Account> {
        let cname = CString::new(name).ok()?;
        let mut buf = vec![0 as libc::c_char; 16 * 1024];
        // SAFETY: an all-zero passwd is a valid value for getpwnam_r to fill in.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: valid C string, out structure, buffer with its true length, out pointer.
        let r = unsafe {
            libc::getpwnam_r(
                cname.as_ptr(),
                &mut pw,
                buf.as_mut_ptr(),
                buf.len(),
                &mut found,
            )
        };
        if r != 0 || found.is_null() || pw.pw_dir.is_null() {
            return None;
        }
        // SAFETY: getpwnam_r succeeded, so pw_dir points to a C string inside `buf`.
        let home = unsafe { CStr::from_ptr(pw.pw_dir) }
            .to_str()
            .ok()?
            .to_string();
        let (uid, gid) = (pw.pw_uid, pw.pw_gid);
        Some(Account {
            gids: group_list(&cname, gid),
            name: name.to_string(),
            uid,
            gid,
            home,
        })
    }

    /// Names of the user's groups.
    pub fn group_names(&self) -> Vec<String> {
        self.gids.iter().filter_map(|&g| group_name(g)).collect()
    }
}

/// The groups of user `name` whose primary group is `gid`.
fn group_list(name: &CStr, gid: u32) -> Vec<u32> {
    let mut n: libc::c_int = 64;
    loop {
        let mut groups = vec![0 as libc::gid_t; n as usize];
        let mut count = n;
        // SAFETY: valid C string, an array of `count` gids, and `count` as its length.
        let r = unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut count) };
        if r >= 0 {
            groups.truncate(count.max(0) as usize);
            return groups;
        }
        if count <= n || n > 65536 {
            return vec![gid];
        }
        n = count;
    }
}

fn group_name(gid: u32) -> Option<String> {
    let mut buf = vec![0 as libc::c_char; 64 * 1024];
    // SAFETY: an all-zero group is a valid value for getgrgid_r to fill in.
    let mut gr: libc::group = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: out structure, buffer with its true length, out pointer.
    let r = unsafe { libc::getgrgid_r(gid, &mut gr, buf.as_mut_ptr(), buf.len(), &mut found) };
    if r != 0 || found.is_null() || gr.gr_name.is_null() {
        return None;
    }
    // SAFETY: getgrgid_r succeeded, so gr_name points to a C string inside `buf`.
    Some(
        unsafe { CStr::from_ptr(gr.gr_name) }
            .to_string_lossy()
            .into_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_exists() {
        let a = Account::lookup("root").unwrap();
        assert_eq!((a.uid, a.gid), (0, 0));
        assert!(a.gids.contains(&0));
        assert!(a.group_names().contains(&"root".to_string()));
        assert!(Account::lookup("no such user here").is_none());
    }
}

//! Attach names (NCryptfs 3.3.2): given, from the attaching entity, or random.
//!
//! A given name is drawn from a conservative set, so that no two names look alike and none
//! can be mistaken for something else in a listing, a shell or a terminal: ASCII letters,
//! digits, `.`, `_` and `-`, not starting with `.` (hidden attaches are chosen with
//! `--hidden`) or `-` (an option to every command), at most [`MAX_NAME`] bytes. No space,
//! no control or bidirectional character, no look-alike letter from another script.

use crate::protocol::Naming;

/// Longest attach name, in bytes (one path component).
pub const MAX_NAME: usize = 255;

/// Checks a name chosen by a user (see the module's rules). `u<N>` and `u<N>s<M>` are
/// entity names: only user N may pick them.
pub fn validate_given(name: &str, uid: u32) -> Result<(), String> {
    // Error messages quote the name escaped ({:?}): it may hold anything.
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(format!("attach name must be 1 to {MAX_NAME} bytes"));
    }
    if name.starts_with('.') {
        return Err(format!(
            "attach name {name:?} may not start with '.' (use --hidden to hide an attach)"
        ));
    }
    if name.starts_with('-') {
        return Err(format!("attach name {name:?} may not start with '-'"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(format!(
            "attach name {name:?} may hold only ASCII letters, digits, '.', '_' and '-'"
        ));
    }
    if let Some(owner) = entity_name_uid(name) {
        if owner != uid {
            return Err(format!(
                "attach name {name:?} is reserved for user {owner}'s entity-named attaches"
            ));
        }
    }
    Ok(())
}

/// What a name looks like: ASCII case folded, and the digits and letters that look alike in
/// common fonts made one (`0` and `O`, `1`, `l` and `I`). Two attaches never share a
/// skeleton, so no two names in `/crypt` can be told apart only by a close look.
pub fn skeleton(name: &str) -> String {
    name.chars()
        .map(|c| match c.to_ascii_lowercase() {
            '0' => 'o',
            '1' | 'i' => 'l',
            c => c,
        })
        .collect()
}

/// The uid N of an entity-style name `u<N>` or `u<N>s<M>`.
fn entity_name_uid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix('u')?;
    let (u, s) = match rest.split_once('s') {
        Some((u, s)) => (u, Some(s)),
        None => (rest, None),
    };
    let digits = |x: &str| !x.is_empty() && x.bytes().all(|b| b.is_ascii_digit());
    if !digits(u) || s.is_some_and(|s| !digits(s)) {
        return None;
    }
    u.parse().ok()
}

/// The name an attach request asks for. `sid` is the attaching process's session id.
pub fn resolve(naming: &Naming, uid: u32, sid: u32) -> Result<String, String> {
    match naming {
        Naming::Given(n) => {
            validate_given(n, uid)?;
            Ok(n.clone())
        }
        Naming::Entity { session: false } => Ok(format!("u{uid}")),
        Naming::Entity { session: true } => Ok(format!("u{uid}s{sid}")),
        Naming::Random => Ok(random_name()),
    }
}

/// 16 random lowercase hex digits (64 bits: collisions are retried by the caller).
pub fn random_name() -> String {
    let b: [u8; 8] = cloakfs_core::crypto::random::array();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_names() {
        for good in ["proj", "Proj-2.tar_x", "a", "A1", "x.", &"x".repeat(255)] {
            assert!(validate_given(good, 5).is_ok(), "{good:?}");
        }
        for bad in [
            "",
            ".",
            "..",
            ".hid",
            "-rf",
            "a/b",
            "a\0b",
            "a\nb",
            " ",
            "proja ",
            " proja",
            "my files",
            "*",
            "a?",
            "a\\b",
            "a:b",
            // Bidirectional overrides and isolates, zero-width and look-alike letters.
            "abc\u{202e}fdp.exe",
            "a\u{2066}b",
            "pro\u{200b}ja",
            "pr\u{043e}ja",
            "\u{ff50}roja",
            "caf\u{e9}",
            "a\tb",
            "a\u{7f}",
            &"x".repeat(256),
        ] {
            assert!(validate_given(bad, 5).is_err(), "{bad:?}");
        }
        assert!(validate_given("u5", 5).is_ok());
        assert!(validate_given("u5s77", 5).is_ok());
        assert!(validate_given("u6", 5).is_err());
        assert!(validate_given("u6s1", 5).is_err());
        assert!(validate_given("user", 5).is_ok());
    }

    #[test]
    fn look_alike_names_share_a_skeleton() {
        for (a, b) in [
            ("U1001", "u1001"),
            ("team1", "teaml"),
            ("TEAMI", "team1"),
            ("b0x", "bOx"),
            ("Docs", "docs"),
        ] {
            assert_eq!(skeleton(a), skeleton(b), "{a} {b}");
        }
        for (a, b) in [("team1", "team2"), ("a.b", "a_b"), ("box", "bux")] {
            assert_ne!(skeleton(a), skeleton(b), "{a} {b}");
        }
    }

    #[test]
    fn resolved_names() {
        assert_eq!(
            resolve(&Naming::Entity { session: false }, 1000, 42).unwrap(),
            "u1000"
        );
        assert_eq!(
            resolve(&Naming::Entity { session: true }, 1000, 4242).unwrap(),
            "u1000s4242"
        );
        let r = resolve(&Naming::Random, 1, 1).unwrap();
        assert_eq!(r.len(), 16);
        assert!(r.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(r, random_name());
    }
}

//! `/etc/security/cloakfs.conf`: which volumes are mounted at whose login.
//!
//! One line per rule, fields separated by blanks, `#` starts a comment:
//!
//! ```text
//! # WHO     CIPHERDIR          MOUNTPOINT   [MOUNT-OPTIONS]
//! *         ~/.Private.enc     ~/Private
//! @staff    /srv/enc/%u        /srv/plain/%u   noexec
//! alice     ~/work.enc         ~/work          ro
//! ```
//!
//! WHO is a user name, `@group` (primary or supplementary) or `*`. In the paths, a leading `~`
//! is the user's home directory and `%u` the user name (`%%` a percent sign); both must be
//! absolute once expanded. Every line that names the user applies; of two lines with one
//! mount point, the first wins. MOUNT-OPTIONS are `cloakfs mount -o` options; `bind` and
//! `foreground` are the module's to set.

use std::path::PathBuf;

/// One volume to mount for a user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub cipherdir: PathBuf,
    pub mountpoint: PathBuf,
    /// `-o` options, comma separated (empty: none).
    pub options: String,
}

/// What a rule needs to know about the user who logs in.
pub struct Who<'a> {
    pub name: &'a str,
    pub home: &'a str,
    /// Names of the user's groups (primary and supplementary).
    pub groups: &'a [String],
}

/// A line that could not be used: its number and why (one line each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLine {
    pub line: usize,
    pub why: String,
}

/// The volumes of `who` in the config text, and the lines that were broken. A broken line is
/// skipped; the others still apply.
pub fn volumes_for(text: &str, who: &Who<'_>) -> (Vec<Volume>, Vec<BadLine>) {
    let mut volumes: Vec<Volume> = Vec::new();
    let mut bad = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        match parse_line(line, who) {
            Ok(None) => {}
            Ok(Some(v)) => {
                if !volumes.iter().any(|o| o.mountpoint == v.mountpoint) {
                    volumes.push(v);
                }
            }
            Err(why) => bad.push(BadLine { line: i + 1, why }),
        }
    }
    (volumes, bad)
}

/// The volume a line gives `who`, None if the line is about someone else.
fn parse_line(line: &str, who: &Who<'_>) -> Result<Option<Volume>, String> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if !(3..=4).contains(&fields.len()) {
        return Err(format!(
            "{} fields, expected WHO CIPHERDIR MOUNTPOINT [OPTIONS]",
            fields.len()
        ));
    }
    let options = fields.get(3).copied().unwrap_or("").to_string();
    for o in options.split(',').filter(|o| !o.is_empty()) {
        let key = o.split('=').next().unwrap_or(o);
        if matches!(key, "bind" | "foreground") {
            return Err(format!("mount option {key} is set by the module"));
        }
    }
    // Checked for every line, so a mistake shows whoever logs in.
    let cipherdir = expand(fields[1], who)?;
    let mountpoint = expand(fields[2], who)?;
    let applies = match fields[0] {
        "*" => true,
        w if w.starts_with('@') => {
            let g = &w[1..];
            if g.is_empty() {
                return Err("@ without a group name".into());
            }
            who.groups.iter().any(|n| n == g)
        }
        user => user == who.name,
    };
    Ok(applies.then_some(Volume {
        cipherdir,
        mountpoint,
        options,
    }))
}

/// `path` with `~` and `%u` expanded; must then be absolute.
fn expand(path: &str, who: &Who<'_>) -> Result<PathBuf, String> {
    let mut out = String::new();
    let rest = if path == "~" || path.starts_with("~/") {
        out.push_str(who.home.trim_end_matches('/'));
        &path[1..]
    } else {
        path
    };
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('u') => out.push_str(who.name),
            Some('%') => out.push('%'),
            Some(o) => return Err(format!("unknown escape %{o} in {path}")),
            None => return Err(format!("{path} ends in %")),
        }
    }
    if !out.starts_with('/') {
        return Err(format!(
            "{path} is not an absolute path (nor starts with ~)"
        ));
    }
    Ok(PathBuf::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> (Vec<String>, &'static str) {
        (vec!["alice".into(), "staff".into()], "/home/alice")
    }

    fn run(text: &str) -> (Vec<Volume>, Vec<BadLine>) {
        let (groups, home) = alice();
        volumes_for(
            text,
            &Who {
                name: "alice",
                home,
                groups: &groups,
            },
        )
    }

    fn v(c: &str, m: &str, o: &str) -> Volume {
        Volume {
            cipherdir: c.into(),
            mountpoint: m.into(),
            options: o.into(),
        }
    }

    #[test]
    fn users_groups_and_everyone() {
        let (vols, bad) = run("# comment\n\
             \n\
             bob    /srv/bob.enc /srv/bob\n\
             alice  ~/work.enc   ~/work   ro,noexec  # trailing comment\n\
             @staff /srv/enc/%u  /srv/plain/%u\n\
             @other /srv/x       /srv/y\n\
             *      ~/.Private.enc ~/Private\n\
             *      ~/again.enc  ~/work\n");
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(
            vols,
            vec![
                v("/home/alice/work.enc", "/home/alice/work", "ro,noexec"),
                v("/srv/enc/alice", "/srv/plain/alice", ""),
                v("/home/alice/.Private.enc", "/home/alice/Private", ""),
            ]
        );
    }

    #[test]
    fn broken_lines_are_reported_and_skipped() {
        let (vols, bad) = run("alice ~/a.enc\n\
             alice relative/x ~/b\n\
             alice ~/c.enc ~/c bind=session\n\
             @ ~/d ~/e\n\
             alice /x%q /y\n\
             alice ~/ok.enc ~/ok\n");
        assert_eq!(vols, vec![v("/home/alice/ok.enc", "/home/alice/ok", "")]);
        let lines: Vec<usize> = bad.iter().map(|b| b.line).collect();
        assert_eq!(lines, vec![1, 2, 3, 4, 5]);
        assert!(bad[2].why.contains("bind"), "{:?}", bad[2]);
    }

    #[test]
    fn percent_and_tilde() {
        let (vols, _) = run("* /data/%%/%u ~\n");
        assert_eq!(vols, vec![v("/data/%/alice", "/home/alice", "")]);
    }
}

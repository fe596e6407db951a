//! Parsing of `-o` mount options, as given on the command line, by mount(8)/mount.fuse3 and
//! in /etc/fstab. Options that only mean something to mount(8) are accepted and ignored.

use crate::args::BindTo;
use crate::failure::{Failure, Result};
use std::path::PathBuf;

/// Options that the kernel takes as they are.
const KERNEL: &[&str] = &[
    "nosuid",
    "suid",
    "nodev",
    "dev",
    "noexec",
    "exec",
    "noatime",
    "atime",
    "relatime",
    "norelatime",
    "strictatime",
    "nodiratime",
    "diratime",
    "sync",
    "async",
    "dirsync",
    "lazytime",
    "nolazytime",
];

/// Options that belong to mount(8) or fstab and mean nothing to the file system.
const IGNORED: &[&str] = &[
    "rw", "defaults", "auto", "noauto", "user", "nouser", "users", "owner", "group", "_netdev",
    "nofail", "subtype", "silent", "loud",
];

/// What the `-o` options ask for.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ParsedOptions {
    pub read_only: bool,
    pub allow_other: bool,
    pub allow_root: bool,
    pub default_permissions: bool,
    pub nonempty: bool,
    pub kernel: Vec<String>,
    pub fsname: Option<String>,
    pub passfile: Option<PathBuf>,
    pub extpass: Option<String>,
    pub keyfile: Option<PathBuf>,
    pub identity: Vec<PathBuf>,
    pub threads: Option<usize>,
    pub cache_timeout: Option<f64>,
    pub log_file: Option<PathBuf>,
    pub foreground: bool,
    pub writeback_cache: bool,
    pub bind: Option<BindTo>,
    pub no_io_uring: bool,
    pub no_busy_poll: bool,
    pub shared_storage: bool,
    pub no_shared_storage: bool,
}

/// Parses every `-o` argument (each a comma-separated list).
pub fn parse(args: &[String]) -> Result<ParsedOptions> {
    let mut p = ParsedOptions::default();
    for opt in args
        .iter()
        .flat_map(|a| a.split(','))
        .filter(|o| !o.is_empty())
    {
        let (key, value) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        let need = |v: Option<&str>| {
            v.filter(|s| !s.is_empty())
                .map(str::to_string)
                .ok_or_else(|| Failure::usage(format!("mount option {key} needs a value")))
        };
        match key {
            "ro" => p.read_only = true,
            "allow_other" => p.allow_other = true,
            "allow_root" => p.allow_root = true,
            "default_permissions" => p.default_permissions = true,
            "nonempty" => p.nonempty = true,
            "fsname" => p.fsname = Some(need(value)?),
            "passfile" => p.passfile = Some(need(value)?.into()),
            "extpass" => p.extpass = Some(need(value)?),
            "keyfile" => p.keyfile = Some(need(value)?.into()),
            "identity" => p.identity.push(need(value)?.into()),
            "log_file" => p.log_file = Some(need(value)?.into()),
            "foreground" => p.foreground = true,
            "writeback_cache" => p.writeback_cache = true,
            "bind" => {
                p.bind = Some(match need(value)?.as_str() {
                    "user" => BindTo::User,
                    "session" => BindTo::Session,
                    _ => return Err(Failure::usage("bind must be user or session")),
                })
            }
            "no_io_uring" if value.is_none() => p.no_io_uring = true,
            "no_busy_poll" if value.is_none() => p.no_busy_poll = true,
            "shared_storage" if value.is_none() => p.shared_storage = true,
            "no_shared_storage" if value.is_none() => p.no_shared_storage = true,
            "no_io_uring" | "no_busy_poll" | "shared_storage" | "no_shared_storage" => {
                return Err(Failure::usage(format!("mount option {key} takes no value")))
            }
            "threads" => {
                p.threads = Some(
                    need(value)?
                        .parse()
                        .ok()
                        .filter(|&n: &usize| (1..=256).contains(&n))
                        .ok_or_else(|| Failure::usage("threads must be 1..256"))?,
                )
            }
            "cache_timeout" => {
                p.cache_timeout = Some(
                    need(value)?
                        .parse()
                        .ok()
                        .filter(|t: &f64| t.is_finite() && *t >= 0.0)
                        .ok_or_else(|| Failure::usage("cache_timeout must be seconds >= 0"))?,
                )
            }
            k if KERNEL.contains(&k) && value.is_none() => p.kernel.push(k.to_string()),
            k if IGNORED.contains(&k) || k.starts_with("x-") || k == "comment" => {}
            _ => return Err(Failure::usage(format!("unknown mount option '{opt}'"))),
        }
    }
    // As with gocryptfs: letting others in without kernel permission checks would let every
    // user act with the daemon's rights.
    if p.allow_other {
        p.default_permissions = true;
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_storage_is_a_flag() {
        assert!(parse(&["shared_storage,ro".into()]).unwrap().shared_storage);
        assert!(!parse(&["ro".into()]).unwrap().shared_storage);
        let e = parse(&["shared_storage=1".into()]).unwrap_err();
        assert_eq!(e.to_string(), "mount option shared_storage takes no value");
    }

    #[test]
    fn fstab_style() {
        let p = parse(&["rw,passfile=/etc/k,allow_other,nofail,x-systemd.automount,noexec".into()])
            .unwrap();
        assert_eq!(p.passfile, Some("/etc/k".into()));
        let q = parse(&["keyfile=/etc/k.key,identity=/a,identity=/b".into()]).unwrap();
        assert_eq!(q.keyfile, Some("/etc/k.key".into()));
        assert_eq!(q.identity, vec![PathBuf::from("/a"), PathBuf::from("/b")]);
        assert!(p.allow_other && p.default_permissions);
        assert_eq!(p.kernel, vec!["noexec".to_string()]);
        assert!(!p.read_only);
    }

    #[test]
    fn repeated_and_values() {
        let p = parse(&["ro".into(), "threads=4,cache_timeout=2.5,fsname=x".into()]).unwrap();
        assert!(p.read_only);
        assert!(!p.writeback_cache);
        assert!(parse(&["writeback_cache".into()]).unwrap().writeback_cache);
        assert!(!p.no_io_uring);
        assert!(parse(&["no_io_uring".into()]).unwrap().no_io_uring);
        assert!(!p.no_busy_poll);
        assert!(parse(&["no_busy_poll".into()]).unwrap().no_busy_poll);
        assert_eq!(p.threads, Some(4));
        assert_eq!(p.cache_timeout, Some(2.5));
        assert_eq!(p.fsname.as_deref(), Some("x"));
        assert_eq!(
            parse(&["bind=session".into()]).unwrap().bind,
            Some(BindTo::Session)
        );
    }

    #[test]
    fn errors() {
        assert!(parse(&["bogus".into()]).is_err());
        assert!(parse(&["passfile".into()]).is_err());
        assert!(parse(&["threads=0".into()]).is_err());
        assert!(parse(&["noexec=1".into()]).is_err());
        assert!(parse(&["bind=everyone".into()]).is_err());
        assert!(parse(&["bind".into()]).is_err());
    }
}

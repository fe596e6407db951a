//! Talking to the multi-user daemon: one request, one answer, errors as one line.

use crate::failure::{Failure, Result};
use clap::Args;
use cloakfs_daemon::client::Client;
use cloakfs_daemon::protocol::{Entity, Request, Response};
use std::ffi::CString;
use std::path::PathBuf;
use std::time::Duration;

/// The `--socket PATH` option of every command that talks to the daemon.
#[derive(Debug, Clone, Default, Args)]
pub struct SocketArg {
    /// The daemon's control socket (default: $CLOAKFS_SOCKET, else /run/cloakfs/control.sock).
    #[arg(long = "socket", id = "socket", value_name = "PATH")]
    path: Option<PathBuf>,
}

impl SocketArg {
    /// `--socket`, else `$CLOAKFS_SOCKET`, else the default.
    fn resolve(&self) -> PathBuf {
        self.path
            .clone()
            .or_else(|| std::env::var_os("CLOAKFS_SOCKET").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(cloakfs_daemon::protocol::DEFAULT_SOCKET))
    }
}

/// Connects to the daemon.
pub fn connect(socket: &SocketArg) -> Result<Client> {
    Client::connect(&socket.resolve()).map_err(|e| Failure::other(e.to_string()))
}

/// Sends `req` on `client` and returns the answer; a daemon-side error becomes a failure.
pub fn call_on(client: &mut Client, req: &Request) -> Result<Response> {
    match client
        .call(req)
        .map_err(|e| Failure::other(format!("talking to the cloakfs daemon: {e}")))?
    {
        Response::Error { message } => Err(Failure::other(message)),
        r => Ok(r),
    }
}

/// One request on a fresh connection.
pub fn call(socket: &SocketArg, req: &Request) -> Result<Response> {
    call_on(&mut connect(socket)?, req)
}

/// An answer the command did not expect (a daemon of another version).
pub fn unexpected(r: &Response) -> Failure {
    Failure::other(format!("unexpected answer from the cloakfs daemon: {r:?}"))
}

/// Parses a duration: `90`, `90s`, `15m`, `6h`, `2d`, `1h30m`.
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(s).map_err(|e| format!("bad duration {s:?}: {e}"))
}

/// Whole seconds, at least one (a zero timeout would be no timeout at all).
pub fn secs(d: Option<Duration>) -> Option<u64> {
    d.map(|d| d.as_secs().max(1))
}

/// A user given by name or number.
pub fn user_id(s: &str) -> Result<u32> {
    if let Ok(n) = s.parse() {
        return Ok(n);
    }
    let name = CString::new(s).map_err(|_| Failure::usage(format!("bad user name {s:?}")))?;
    let mut buf = vec![0 as libc::c_char; 16384];
    // SAFETY: an all-zero passwd is a valid out-parameter for getpwnam_r.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call and `buf.len()` is the buffer's size.
    let rc = unsafe {
        libc::getpwnam_r(
            name.as_ptr(),
            &mut pw,
            buf.as_mut_ptr(),
            buf.len(),
            &mut out,
        )
    };
    if rc != 0 || out.is_null() {
        return Err(Failure::usage(format!("no such user: {s}")));
    }
    Ok(pw.pw_uid)
}

/// A group given by name or number.
pub fn group_id(s: &str) -> Result<u32> {
    if let Ok(n) = s.parse() {
        return Ok(n);
    }
    let name = CString::new(s).map_err(|_| Failure::usage(format!("bad group name {s:?}")))?;
    let mut buf = vec![0 as libc::c_char; 16384];
    // SAFETY: an all-zero group is a valid out-parameter for getgrnam_r.
    let mut gr: libc::group = unsafe { std::mem::zeroed() };
    let mut out = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call and `buf.len()` is the buffer's size.
    let rc = unsafe {
        libc::getgrnam_r(
            name.as_ptr(),
            &mut gr,
            buf.as_mut_ptr(),
            buf.len(),
            &mut out,
        )
    };
    if rc != 0 || out.is_null() {
        return Err(Failure::usage(format!("no such group: {s}")));
    }
    Ok(gr.gr_gid)
}

/// An entity as shown to people: `pid 42`, `session 4242`, `user 1000`, `group 100`.
pub fn entity_text(e: &Entity) -> String {
    match e {
        Entity::Pid(p) => format!("pid {p}"),
        Entity::Session(s) => format!("session {s}"),
        Entity::User(u) => format!("user {u}"),
        Entity::Group(g) => format!("group {g}"),
    }
}

/// A Unix time as seconds from now (`-` when absent, `expired` when past).
pub fn until(t: Option<u64>) -> String {
    let Some(t) = t else { return "-".into() };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    if t <= now {
        "expired".into()
    } else {
        format!(
            "in {}",
            humantime::format_duration(Duration::from_secs(t - now))
        )
    }
}

/// Prints `value` as JSON on standard output.
pub fn print_json<T: serde::Serialize>(value: &T) -> Result<()> {
    let s = serde_json::to_string_pretty(value).map_err(|e| Failure::other(e.to_string()))?;
    println!("{s}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert!(parse_duration("soon").is_err());
        assert_eq!(secs(Some(Duration::from_millis(10))), Some(1));
    }

    #[test]
    fn ids() {
        assert_eq!(user_id("root").unwrap(), 0);
        assert_eq!(user_id("1234").unwrap(), 1234);
        assert_eq!(group_id("root").unwrap(), 0);
        assert!(user_id("no-such-user-cloakfs").is_err());
    }
}

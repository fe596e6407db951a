//! `cloakfs authz`, `auth`, `sessions` and `revoke`: who may use an attach, and how.
//!
//! A passphrase authorization stores only K = Argon2id(passphrase, salt) in the daemon;
//! `auth` proves knowledge of the passphrase by answering a fresh random challenge with
//! HMAC-SHA256 under K, so neither the passphrase nor a reusable answer crosses the socket.

use crate::args::NewPassArgs;
use crate::control::{self, parse_duration};
use crate::failure::{Failure, Result};
use crate::secret_input::{read_new_passphrase, read_passphrase_from, Confirm};
use clap::{Args, Subcommand};
use cloakfs_core::crypto::kdf::{Argon2Params, DEFAULT_MEMORY_KIB};
use cloakfs_core::text::{b64, unb64};
use cloakfs_daemon::protocol::{
    AuthMethod, AuthzAddRequest, Entity, OnTimeout, Request, Response, SessionInfo, PERMISSIONS,
};
use std::path::PathBuf;
use std::time::Duration;
use zeroize::Zeroizing;

#[derive(Debug, Subcommand)]
pub enum AuthzCommand {
    /// Grant an entity a subset of your permissions on an attach.
    Add(Box<AuthzAddArgs>),
    /// List an attach's authorizations (never their secrets).
    List(AuthzListArgs),
    /// Delete an authorization (its active sessions stay until revoked or timed out).
    Del(AuthzDelArgs),
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("entity").required(true).args(["pid", "session", "user", "group"])))]
pub struct AuthzAddArgs {
    /// The attach.
    pub name: String,
    /// For one process (and only while it runs as the uid it has now).
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// For one Unix session (see `ps -o sid`): its processes of the uid of its leader.
    #[arg(long, value_name = "SID")]
    pub session: Option<u32>,
    /// With --pid or --session: cover processes of any uid there, setuid programs of other
    /// users included.
    #[arg(long)]
    pub any_uid: bool,
    /// For a user (name or uid).
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,
    /// For a group (name or gid).
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,
    /// Comma-separated: read, write, exec, attach, auth, detach, add-authz, list-authz,
    /// del-authz, revoke, bypass; or `all`.
    #[arg(long, value_name = "PERMS", required = true)]
    pub perms: String,
    /// How the entity proves itself: none, or passphrase (challenge-response).
    #[arg(long, default_value = "none", value_parser = ["none", "passphrase"])]
    pub auth: String,
    /// The authorization's passphrase (for --auth passphrase; default: prompt twice).
    #[command(flatten)]
    pub secret: NewPassArgs,
    /// Argon2id memory in KiB for the passphrase (default: calibrated to ~0.5 s).
    #[arg(long, value_name = "KIB")]
    pub kdf_memory: Option<u32>,
    /// Argon2id iterations for the passphrase.
    #[arg(long, value_name = "N")]
    pub kdf_iterations: Option<u32>,
    /// The authorization admits new authentications for this long (e.g. 6h).
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub expires: Option<Duration>,
    /// Each session opened with it lasts this long.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub session_ttl: Option<Duration>,
    /// A session unused for this long times out.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub idle: Option<Duration>,
    /// What requests do after a session timed out.
    #[arg(long, default_value = "fail-all", value_parser = ["fail-all", "fail-new", "sleep-new", "sleep-all"])]
    pub on_timeout: String,
    /// Run CMD (as you, never as the session's user, with the attach name and the reason as
    /// $1 and $2) when a session of this authorization times out.
    #[arg(long, value_name = "CMD")]
    pub callback: Option<String>,
    #[command(flatten)]
    pub socket: control::SocketArg,
}

#[derive(Debug, Args)]
pub struct AuthzListArgs {
    /// The attach.
    pub name: String,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub socket: control::SocketArg,
}

#[derive(Debug, Args)]
pub struct AuthzDelArgs {
    /// The attach.
    pub name: String,
    /// The authorization's ID (see `authz list`).
    pub id: u32,
    #[command(flatten)]
    pub socket: control::SocketArg,
}

pub fn run(cmd: AuthzCommand) -> Result<()> {
    match cmd {
        AuthzCommand::Add(a) => add(*a),
        AuthzCommand::List(a) => list(a),
        AuthzCommand::Del(a) => {
            match control::call(
                &a.socket,
                &Request::AuthzDel {
                    name: a.name.clone(),
                    id: a.id,
                },
            )? {
                Response::Ok => {
                    println!("Deleted authorization {} of {}.", a.id, a.name);
                    Ok(())
                }
                r => Err(control::unexpected(&r)),
            }
        }
    }
}

/// Parses a permission list, expanding `all`.
fn parse_perms(s: &str) -> Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for p in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if p == "all" {
            out.extend(PERMISSIONS.iter().map(|p| p.to_string()));
        } else if PERMISSIONS.contains(&p) {
            out.push(p.to_string());
        } else {
            return Err(Failure::usage(format!(
                "unknown permission {p:?} (known: {}, all)",
                PERMISSIONS.join(", ")
            )));
        }
    }
    out.sort();
    out.dedup();
    if out.is_empty() {
        return Err(Failure::usage("--perms lists no permission"));
    }
    Ok(out)
}

fn on_timeout_name(t: OnTimeout) -> &'static str {
    match t {
        OnTimeout::FailAll => "fail-all",
        OnTimeout::FailNew => "fail-new",
        OnTimeout::SleepNew => "sleep-new",
        OnTimeout::SleepAll => "sleep-all",
    }
}

fn on_timeout(s: &str) -> OnTimeout {
    match s {
        "fail-new" => OnTimeout::FailNew,
        "sleep-new" => OnTimeout::SleepNew,
        "sleep-all" => OnTimeout::SleepAll,
        _ => OnTimeout::FailAll,
    }
}

fn add(a: AuthzAddArgs) -> Result<()> {
    let entity = if let Some(p) = a.pid {
        Entity::Pid(p)
    } else if let Some(s) = a.session {
        Entity::Session(s)
    } else if let Some(u) = &a.user {
        Entity::User(control::user_id(u)?)
    } else if let Some(g) = &a.group {
        Entity::Group(control::group_id(g)?)
    } else {
        return Err(Failure::usage(
            "name the entity: --pid, --session, --user or --group",
        ));
    };
    if a.any_uid && a.pid.is_none() && a.session.is_none() {
        return Err(Failure::usage("--any-uid needs --pid or --session"));
    }
    let perms = parse_perms(&a.perms)?;
    let mut client = control::connect(&a.socket)?;
    let auth = if a.auth == "passphrase" {
        let pass = read_new_passphrase(&a.secret, "Passphrase for this authorization: ")?;
        let params = match (a.kdf_memory, a.kdf_iterations) {
            (None, None) => Argon2Params::calibrate(Duration::from_millis(500)),
            (m, t) => Argon2Params {
                memory_kib: m.unwrap_or(DEFAULT_MEMORY_KIB),
                iterations: t.unwrap_or(3),
                lanes: 1,
            },
        };
        params
            .validate()
            .map_err(|e| Failure::usage(format!("KDF parameters: {e}")))?;
        let salt: [u8; 16] = cloakfs_core::crypto::random::array();
        let key = cloakfs_daemon::auth::verifier_key(&pass, &salt, &params)?;
        AuthMethod::Passphrase {
            salt: b64(&salt),
            memory_kib: params.memory_kib,
            iterations: params.iterations,
            parallelism: params.lanes,
            key: b64(key.expose()),
        }
    } else {
        if a.secret.passfile.is_some() || a.secret.extpass.is_some() {
            return Err(Failure::usage(
                "--passfile/--extpass need --auth passphrase",
            ));
        }
        AuthMethod::None
    };
    let mut req = Request::AuthzAdd(AuthzAddRequest {
        name: a.name.clone(),
        entity,
        perms,
        auth,
        expires: control::secs(a.expires),
        session_ttl: control::secs(a.session_ttl),
        idle: control::secs(a.idle),
        on_timeout: on_timeout(&a.on_timeout),
        callback: a.callback,
        any_uid: a.any_uid,
    });
    let answer = control::call_on(&mut client, &req);
    if let Request::AuthzAdd(AuthzAddRequest {
        auth: AuthMethod::Passphrase { key, .. },
        ..
    }) = &mut req
    {
        zeroize::Zeroize::zeroize(key);
    }
    match answer? {
        Response::AuthzAdded { id } => {
            println!(
                "Added authorization {id} on {} for {}.",
                a.name,
                control::entity_text(&entity)
            );
            Ok(())
        }
        r => Err(control::unexpected(&r)),
    }
}

fn list(a: AuthzListArgs) -> Result<()> {
    let r = control::call(
        &a.socket,
        &Request::AuthzList {
            name: a.name.clone(),
        },
    )?;
    let Response::Authorizations { authorizations } = &r else {
        return Err(control::unexpected(&r));
    };
    if a.json {
        return control::print_json(authorizations);
    }
    println!(
        "{:>4}  {:<16} {:<10} {:<10} {:<12} permissions",
        "ID", "entity", "auth", "expires", "on timeout"
    );
    for z in authorizations {
        println!(
            "{:>4}  {:<16} {:<10} {:<10} {:<12} {}",
            z.id,
            control::entity_text(&z.entity),
            z.method,
            control::until(z.expires),
            on_timeout_name(z.on_timeout),
            z.perms.join(",")
        );
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct AuthArgs {
    /// The attach.
    pub name: String,
    /// Use this authorization (default: the one matching you).
    #[arg(long, value_name = "ID")]
    pub authz: Option<u32>,
    /// Read the passphrase from the first line of FILE ("-" for standard input).
    #[arg(long, value_name = "FILE", conflicts_with = "extpass")]
    pub passfile: Option<PathBuf>,
    /// Run CMD with /bin/sh and use the first line it prints as the passphrase.
    #[arg(long, value_name = "CMD")]
    pub extpass: Option<String>,
    #[command(flatten)]
    pub socket: control::SocketArg,
}

pub fn run_auth(a: AuthArgs) -> Result<()> {
    let mut client = control::connect(&a.socket)?;
    let first = control::call_on(
        &mut client,
        &Request::Auth {
            name: a.name.clone(),
            authz: a.authz,
        },
    )?;
    let answer = match first {
        Response::Authenticated { session } => return authenticated(&a.name, session),
        Response::Challenge {
            authz,
            challenge,
            salt,
            memory_kib,
            iterations,
            parallelism,
        } => {
            let bad = || Failure::other("the daemon sent a malformed challenge");
            let challenge = unb64(challenge.as_bytes()).ok_or_else(bad)?;
            let salt = unb64(salt.as_bytes()).ok_or_else(bad)?;
            let params = Argon2Params {
                memory_kib,
                iterations,
                lanes: parallelism,
            };
            params
                .validate()
                .map_err(|e| Failure::other(format!("the daemon's KDF parameters: {e}")))?;
            let pass = read_passphrase_from(
                a.passfile.as_deref(),
                a.extpass.as_deref(),
                &format!("Passphrase for {}: ", a.name),
                Confirm::Once,
            )?;
            let key = cloakfs_daemon::auth::verifier_key(&pass, &salt, &params)?;
            let mac = Zeroizing::new(cloakfs_daemon::auth::challenge_answer(
                key.expose(),
                &a.name,
                authz,
                &challenge,
            ));
            b64(&mac[..])
        }
        r => return Err(control::unexpected(&r)),
    };
    match control::call_on(&mut client, &Request::AuthAnswer { answer })? {
        Response::Authenticated { session } => authenticated(&a.name, session),
        r => Err(control::unexpected(&r)),
    }
}

fn authenticated(name: &str, session: u64) -> Result<()> {
    println!("Authenticated to {name}: active session {session}.");
    Ok(())
}

#[derive(Debug, Args)]
pub struct SessionsArgs {
    /// The attach.
    pub name: String,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub socket: control::SocketArg,
}

pub fn run_sessions(a: SessionsArgs) -> Result<()> {
    let r = control::call(
        &a.socket,
        &Request::Sessions {
            name: a.name.clone(),
        },
    )?;
    let Response::Sessions { sessions } = &r else {
        return Err(control::unexpected(&r));
    };
    if a.json {
        return control::print_json(sessions);
    }
    print_sessions(sessions);
    Ok(())
}

/// The sessions table shared by `sessions` and `status`.
pub fn print_sessions(sessions: &[SessionInfo]) {
    if sessions.is_empty() {
        println!("No sessions.");
        return;
    }
    println!(
        "{:>6}  {:<16} {:<16} {:>6} {:<10} {:<14} {:>7}  permissions",
        "ID", "attach", "entity", "uid", "state", "expires", "waiting"
    );
    for s in sessions {
        println!(
            "{:>6}  {:<16} {:<16} {:>6} {:<10} {:<14} {:>7}  {}",
            s.id,
            s.attach,
            control::entity_text(&s.entity),
            s.uid,
            s.state,
            control::until(s.expires),
            s.waiting,
            s.perms.join(",")
        );
    }
}

#[derive(Debug, Args)]
pub struct RevokeArgs {
    /// The attach.
    pub name: String,
    /// The session's ID (see `cloakfs sessions`).
    pub session: u64,
    #[command(flatten)]
    pub socket: control::SocketArg,
}

pub fn run_revoke(a: RevokeArgs) -> Result<()> {
    match control::call(
        &a.socket,
        &Request::Revoke {
            name: a.name.clone(),
            session: a.session,
        },
    )? {
        Response::Ok => {
            println!(
                "Revoked session {} of {} (it cannot be re-authenticated).",
                a.session, a.name
            );
            Ok(())
        }
        r => Err(control::unexpected(&r)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perms() {
        assert_eq!(parse_perms("write, read").unwrap(), vec!["read", "write"]);
        assert_eq!(parse_perms("all").unwrap().len(), PERMISSIONS.len());
        assert!(parse_perms("fly").is_err());
        assert!(parse_perms(",").is_err());
        for t in ["fail-all", "fail-new", "sleep-new", "sleep-all"] {
            assert_eq!(on_timeout_name(on_timeout(t)), t);
        }
    }
}

//! `cloakfs attach`, `detach` and `status`: a user's volumes in the multi-user daemon's tree.
//!
//! The volume is unlocked here, as the user (the Argon2 work and every secret stay in this
//! process); the daemon receives only the master key, over its control socket.

use crate::args::UnlockArgs;
use crate::control::{self, parse_duration};
use crate::failure::{code, Failure, Result};
use clap::Args;
use cloakfs_core::format::config::VolumeConfig;
use cloakfs_core::known_volumes::Place;
use cloakfs_daemon::protocol::{AttachRequest, MemberKeys, Naming, Request, Response};
use std::path::PathBuf;
use std::time::Duration;
use zeroize::Zeroizing;

#[derive(Debug, Args)]
pub struct AttachArgs {
    #[command(flatten)]
    pub unlock: UnlockArgs,
    /// Generated name instead of NAME: `entity` (`u<uid>`), `entity-session` (`u<uid>s<sid>`) or
    /// `random`.
    #[arg(long = "name", value_name = "HOW", value_parser = ["entity", "entity-session", "random"])]
    pub naming: Option<String>,
    /// Keep the attach out of listings of the tree root (reachable by its exact name).
    #[arg(long)]
    pub hidden: bool,
    /// Attach read-only.
    #[arg(long)]
    pub read_only: bool,
    /// Detach (and wipe the key) after this long, e.g. 8h.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub key_ttl: Option<Duration>,
    /// Run CMD (as you, with the attach name and the reason as $1 and $2) on a timeout of
    /// the key or of your session.
    #[arg(long, value_name = "CMD")]
    pub callback: Option<String>,
    #[command(flatten)]
    pub socket: control::SocketArg,
    /// The volume's cipher directory.
    pub cipherdir: PathBuf,
    /// Name under the tree root (e.g. /crypt/NAME): ASCII letters, digits, '.', '_' and '-',
    /// not starting with '.' or '-'.
    #[arg(required_unless_present = "naming", conflicts_with = "naming")]
    pub name: Option<String>,
}

pub fn run_attach(args: AttachArgs) -> Result<()> {
    let cipherdir = std::fs::canonicalize(&args.cipherdir).map_err(|e| {
        Failure::new(
            code::VOLUME,
            format!("cipher directory {}: {e}", args.cipherdir.display()),
        )
    })?;
    // Fail on everything checkable before asking for a secret.
    let config = VolumeConfig::load(&cipherdir)?;
    cloakfs_core::tools::rekey::check_not_rekeying(&cipherdir)?;
    if !args.read_only {
        cloakfs_core::io::header::check_dir(config.params.content, &cipherdir)?;
    }
    let naming = match (args.naming.as_deref(), args.name) {
        (Some("entity"), _) => Naming::Entity { session: false },
        (Some("entity-session"), _) => Naming::Entity { session: true },
        (Some(_), _) => Naming::Random,
        (None, Some(n)) => {
            let uid = rustix::process::geteuid().as_raw();
            cloakfs_daemon::naming::validate_given(&n, uid).map_err(Failure::usage)?;
            Naming::Given(n)
        }
        (None, None) => return Err(Failure::usage("give a NAME or --name HOW")),
    };
    let mut client = control::connect(&args.socket)?;
    let volume = crate::unlock::unlock_at(
        &args.unlock,
        &Place::resolved(&args.cipherdir, cipherdir.clone()),
    )?;
    let master_key = Zeroizing::new(cloakfs_core::text::b64(volume.master_key().expose()));
    let member = crate::unlock::member_keys(&args.unlock, &volume)?;
    drop(volume);
    let req = Request::Attach(AttachRequest {
        cipherdir: cipherdir.to_string_lossy().into_owned(),
        naming,
        hidden: args.hidden,
        read_only: args.read_only,
        master_key: master_key.to_string(),
        key_ttl: control::secs(args.key_ttl),
        callback: args.callback,
        member: member.as_ref().map(|m| MemberKeys {
            identities: m.texts.iter().map(|t| t.to_string()).collect(),
            recipient: m.recipient.clone(),
            gpg: m.gpg,
            gnupghome: m
                .gnupghome
                .as_ref()
                .map(|g| g.to_string_lossy().into_owned()),
        }),
    });
    let answer = control::call_on(&mut client, &req);
    if let Request::Attach(mut a) = req {
        zeroize::Zeroize::zeroize(&mut a.master_key);
        if let Some(m) = &mut a.member {
            m.identities.iter_mut().for_each(zeroize::Zeroize::zeroize);
        }
    }
    match answer? {
        Response::Attached {
            name,
            path,
            session,
        } => {
            println!("Attached {name} at {path} (your session {session} has every permission).");
            Ok(())
        }
        r => Err(control::unexpected(&r)),
    }
}

#[derive(Debug, Args)]
pub struct DetachArgs {
    #[command(flatten)]
    pub socket: control::SocketArg,
    /// The attach's name.
    pub name: String,
}

pub fn run_detach(args: DetachArgs) -> Result<()> {
    match control::call(
        &args.socket,
        &Request::Detach {
            name: args.name.clone(),
        },
    )? {
        Response::Ok => {
            println!("Detached {} (its keys are wiped).", args.name);
            Ok(())
        }
        r => Err(control::unexpected(&r)),
    }
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub socket: control::SocketArg,
}

pub fn run_status(args: StatusArgs) -> Result<()> {
    let r = control::call(&args.socket, &Request::Status)?;
    let Response::Status { attaches, sessions } = &r else {
        return Err(control::unexpected(&r));
    };
    if args.json {
        return control::print_json(&serde_json::json!({
            "attaches": attaches,
            "sessions": sessions,
        }));
    }
    if attaches.is_empty() {
        println!("No attaches of yours.");
    } else {
        println!("Attaches:");
        for a in attaches {
            let mut flags = Vec::new();
            if a.hidden {
                flags.push("hidden");
            }
            if a.read_only {
                flags.push("read-only");
            }
            println!(
                "  {:<20} {} <- {}{}{}",
                a.name,
                a.path,
                a.cipherdir,
                if flags.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", flags.join(", "))
                },
                a.key_expires
                    .map(|t| format!(", key expires {}", control::until(Some(t))))
                    .unwrap_or_default()
            );
        }
    }
    super::authz::print_sessions(sessions);
    Ok(())
}

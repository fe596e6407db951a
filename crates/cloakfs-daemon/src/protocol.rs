//! The control protocol between `cloakfs` commands and the daemon.
//!
//! Transport: a Unix stream socket (default [`DEFAULT_SOCKET`], mode 0666; the daemon learns
//! each peer's uid, gid and pid from the kernel with `SO_PEERCRED`, and a pidfd of it with
//! `SO_PEERPIDFD`, when it connects, and never trusts the client about who it is).
//! Framing: one JSON object per line (UTF-8, `\n`-terminated, at most [`MAX_MESSAGE`]
//! bytes). The client sends a [`Request`], the daemon answers with one [`Response`]; only
//! `auth` takes two round trips (challenge, then answer) on the same connection. A
//! connection may carry several requests in sequence, all from the process that connected:
//! once it has exited, the connection is refused.
//!
//! Secrets on the wire (the master key at attach, the passphrase verifier at `authz add`)
//! are base64url without padding; both sides zeroize them after use. The passphrase itself
//! never leaves the client.

use serde::{Deserialize, Serialize};

/// Where the daemon listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/cloakfs/control.sock";
/// Default root of the attach tree.
pub const DEFAULT_ROOT: &str = "/crypt";
/// Longest accepted message line, in bytes.
pub const MAX_MESSAGE: usize = 64 * 1024;
/// Domain separation for challenge answers.
pub const AUTH_CONTEXT: &[u8] = b"cloakfs auth v1";

/// Permissions of an authorization or session (NCryptfs 3.3.1), by their protocol names.
pub const PERMISSIONS: &[&str] = &[
    "read",
    "write",
    "exec",
    "attach",
    "auth",
    "detach",
    "add-authz",
    "list-authz",
    "del-authz",
    "revoke",
    "bypass",
];

/// Parses one message (a line without its newline) as a request. The daemon's only entry
/// point for untrusted bytes; the error never quotes the input.
pub fn parse_request(msg: &[u8]) -> Result<Request, String> {
    let text = std::str::from_utf8(msg).map_err(|_| "message is not UTF-8".to_string())?;
    serde_json::from_str(text).map_err(|e| {
        // serde_json's messages name positions and expected tokens, never the input.
        format!("malformed request: {e}")
    })
}

/// A request from a client.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    Attach(AttachRequest),
    Detach {
        name: String,
    },
    Status,
    AuthzAdd(AuthzAddRequest),
    AuthzList {
        name: String,
    },
    AuthzDel {
        name: String,
        id: u32,
    },
    /// Start authenticating the caller to attach `name`. The daemon picks the authorization
    /// matching the caller (or `authz` if given) and answers [`Response::Challenge`] for a
    /// passphrase authorization, or [`Response::Authenticated`] directly for one without
    /// authentication.
    Auth {
        name: String,
        #[serde(default)]
        authz: Option<u32>,
    },
    /// The answer to the challenge last sent on this connection: base64url of
    /// HMAC-SHA256(K, AUTH_CONTEXT || u32be(len(name)) || name || u32be(authz id) ||
    /// challenge), K = Argon2id(passphrase, salt, params) as in the challenge. A challenge
    /// is good for one answer only.
    AuthAnswer {
        answer: String,
    },
    Sessions {
        name: String,
    },
    Revoke {
        name: String,
        session: u64,
    },
}

/// How the attach is named under the tree root.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Naming {
    /// The given name.
    Given(String),
    /// From the attaching entity, as NCryptfs does: `u<uid>` or `u<uid>s<sid>`
    /// (`session: true`).
    Entity { session: bool },
    /// A fresh random name that collides with nothing.
    Random,
}

/// What happens to requests once a session (or the key) has timed out (NCryptfs 3.5).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum OnTimeout {
    /// Everything fails with EACCES.
    #[default]
    FailAll,
    /// Open files keep working; anything new fails.
    FailNew,
    /// Open files keep working; anything new blocks until re-authentication (then fails
    /// after the daemon's maximum wait).
    SleepNew,
    /// Everything blocks until re-authentication (same maximum wait).
    SleepAll,
}

#[derive(Clone, Serialize, Deserialize)]
pub struct AttachRequest {
    /// Absolute path of the cipher directory (the daemon opens it as the caller).
    pub cipherdir: String,
    pub naming: Naming,
    #[serde(default)]
    pub hidden: bool,
    #[serde(default)]
    pub read_only: bool,
    /// The volume's master key, base64url (32 bytes).
    pub master_key: String,
    /// Key lifetime in seconds: the attach is detached (keys wiped) when it ends, and the
    /// callback runs.
    #[serde(default)]
    pub key_ttl: Option<u64>,
    /// Command run (as the owner, who sets it, through /bin/sh, with the attach name and the
    /// reason as `$1` and `$2`) when the key or the owner's session times out.
    #[serde(default)]
    pub callback: Option<String>,
    /// On a sharing volume, the member the attach opens files as (FORMAT.md section 18).
    #[serde(default)]
    pub member: Option<MemberKeys>,
}

/// Everything but the key, so that no debug line can carry it.
impl std::fmt::Debug for AttachRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachRequest")
            .field("cipherdir", &self.cipherdir)
            .field("naming", &self.naming)
            .field("hidden", &self.hidden)
            .field("read_only", &self.read_only)
            .field("key_ttl", &self.key_ttl)
            .field("callback", &self.callback)
            .field("member", &self.member)
            .finish_non_exhaustive()
    }
}

/// A sharing volume's member, handed to the daemon with an attach: the texts of its identity
/// files (age identities or ssh private keys without a passphrase), which unwrap file keys,
/// and its public key, to which the files it creates are granted.
#[derive(Serialize, Deserialize, Clone)]
pub struct MemberKeys {
    pub identities: Vec<String>,
    pub recipient: String,
    /// `attach --gpg`: the member also opens its files' gpg entries, with its own keyring
    /// (gpg runs as the attaching user). Without identities, `recipient` is `gpg:FPR`.
    #[serde(default)]
    pub gpg: bool,
    /// The attaching user's `GNUPGHOME`, if set (else their `~/.gnupg`).
    #[serde(default)]
    pub gnupghome: Option<String>,
}

impl std::fmt::Debug for MemberKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemberKeys")
            .field("recipient", &self.recipient)
            .finish_non_exhaustive()
    }
}

/// Who an authorization is for.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", content = "id", rename_all = "kebab-case")]
pub enum Entity {
    Pid(u32),
    Session(u32),
    User(u32),
    Group(u32),
}

/// How an authorization's entity proves itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "method", rename_all = "kebab-case")]
pub enum AuthMethod {
    None,
    /// Challenge-response with K = Argon2id(passphrase, salt, params). `key` is K,
    /// base64url, computed by the granting client; the daemon keeps it in locked memory.
    Passphrase {
        salt: String,
        memory_kib: u32,
        iterations: u32,
        parallelism: u32,
        key: String,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AuthzAddRequest {
    pub name: String,
    pub entity: Entity,
    pub perms: Vec<String>,
    pub auth: AuthMethod,
    /// Seconds until the authorization stops admitting new authentications.
    #[serde(default)]
    pub expires: Option<u64>,
    /// Lifetime in seconds of each session opened with it.
    #[serde(default)]
    pub session_ttl: Option<u64>,
    /// A session left unused this many seconds times out.
    #[serde(default)]
    pub idle: Option<u64>,
    #[serde(default)]
    pub on_timeout: OnTimeout,
    /// Command run when a session of this authorization times out: as the user who adds
    /// the authorization, never as the session's user.
    #[serde(default)]
    pub callback: Option<String>,
    /// A pid or session authorization covers only processes of the uid of that process (or
    /// session leader) unless this is set: then processes of any uid in it.
    #[serde(default)]
    pub any_uid: bool,
}

/// The daemon's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "kebab-case")]
pub enum Response {
    /// Success without data (detach, authz del, revoke).
    Ok,
    Error {
        message: String,
    },
    Attached {
        name: String,
        path: String,
        session: u64,
    },
    Status {
        attaches: Vec<AttachInfo>,
        sessions: Vec<SessionInfo>,
    },
    AuthzAdded {
        id: u32,
    },
    Authorizations {
        authorizations: Vec<AuthzInfo>,
    },
    Challenge {
        authz: u32,
        challenge: String,
        salt: String,
        memory_kib: u32,
        iterations: u32,
        parallelism: u32,
    },
    Authenticated {
        session: u64,
    },
    Sessions {
        sessions: Vec<SessionInfo>,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct AttachInfo {
    pub name: String,
    pub path: String,
    pub cipherdir: String,
    pub owner: u32,
    pub hidden: bool,
    pub read_only: bool,
    /// Unix time (seconds) when the key expires.
    pub key_expires: Option<u64>,
}

/// An authorization as listed: never its secret.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct AuthzInfo {
    pub id: u32,
    pub entity: Entity,
    pub perms: Vec<String>,
    /// "none" or "passphrase".
    pub method: String,
    pub expires: Option<u64>,
    pub session_ttl: Option<u64>,
    pub idle: Option<u64>,
    pub on_timeout: OnTimeout,
    pub granted_by: u32,
    /// The only uid whose processes a pid or session authorization covers (None: any).
    #[serde(default)]
    pub only_uid: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SessionInfo {
    pub id: u64,
    pub attach: String,
    pub authz: u32,
    pub entity: Entity,
    /// The user who authenticated.
    pub uid: u32,
    /// "active", "timed-out" or "revoked".
    pub state: String,
    /// Unix time (seconds) when it times out, if it does.
    pub expires: Option<u64>,
    pub perms: Vec<String>,
    /// Requests currently blocked waiting for this session to be re-authenticated.
    pub waiting: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attach_request_s_debug_form_shows_no_secret() {
        let r = AttachRequest {
            cipherdir: "/srv/c".into(),
            naming: Naming::Random,
            hidden: false,
            read_only: false,
            master_key: "MASTER-KEY-BYTES".into(),
            key_ttl: None,
            callback: None,
            member: Some(MemberKeys {
                identities: vec!["AGE-SECRET-KEY-1XYZ".into()],
                recipient: "age1pub".into(),
                gpg: false,
                gnupghome: None,
            }),
        };
        let shown = format!("{r:?}");
        assert!(
            shown.contains("/srv/c") && shown.contains("age1pub"),
            "{shown}"
        );
        assert!(
            !shown.contains("MASTER-KEY") && !shown.contains("SECRET-KEY"),
            "{shown}"
        );
    }
}

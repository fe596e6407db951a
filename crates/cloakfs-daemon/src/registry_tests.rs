use super::*;
use crate::protocol::AuthMethod;

const T0: u64 = 1_000_000;
const ATT: AttachId = 7;

/// A fake caller.
#[derive(Clone)]
struct Who {
    uid: u32,
    gid: u32,
    pid: u32,
    tgid: u32,
    sid: u32,
    groups: Vec<u32>,
}

fn who(uid: u32, sid: u32) -> Who {
    Who {
        uid,
        gid: uid,
        pid: sid + 1,
        tgid: sid + 1,
        sid,
        groups: vec![],
    }
}

impl Ids for Who {
    fn uid(&self) -> u32 {
        self.uid
    }
    fn gid(&self) -> u32 {
        self.gid
    }
    fn pid(&self) -> u32 {
        self.pid
    }
    fn tgid(&mut self) -> Option<u32> {
        Some(self.tgid)
    }
    fn sid(&mut self) -> Option<u32> {
        Some(self.sid)
    }
    fn in_group(&mut self, gid: u32) -> bool {
        self.groups.contains(&gid)
    }
}

fn owner() -> Who {
    who(1000, 100)
}

fn setup() -> Registry {
    setup_with(None, None)
}

fn setup_with(key_ttl: Option<u64>, callback: Option<&str>) -> Registry {
    let mut r = Registry::new();
    r.reserve_name("proj", &mut owner()).unwrap();
    assert!(
        r.reserve_name("proj", &mut owner()).is_err(),
        "reserved name is taken"
    );
    let s = r.insert_attach(
        ATT,
        NewAttach {
            name: "proj".into(),
            path: "/crypt/proj".into(),
            cipherdir: "/home/a/enc".into(),
            owner_uid: 1000,
            owner_gid: 1000,
            owner_sid: 100,
            hidden: false,
            read_only: false,
            key_ttl,
            callback: callback.map(str::to_string),
        },
        T0,
    );
    assert_eq!(s, 1);
    r
}

fn need(access: Access) -> Need {
    Need {
        access,
        on_open_handle: false,
    }
}

fn open(access: Access) -> Need {
    Need {
        access,
        on_open_handle: true,
    }
}

fn grant(entity: Entity, perms: &[&str]) -> AuthzAddRequest {
    AuthzAddRequest {
        name: "proj".into(),
        entity,
        perms: perms.iter().map(|p| p.to_string()).collect(),
        auth: AuthMethod::None,
        expires: None,
        session_ttl: None,
        idle: None,
        on_timeout: OnTimeout::FailAll,
        callback: None,
        any_uid: false,
    }
}

fn auth_none(r: &mut Registry, w: &mut Who, now: u64) -> OpResult<u64> {
    match r.auth_start("proj", None, w, now)? {
        AuthStart::Authenticated(s) => Ok(s),
        AuthStart::Challenge { .. } => panic!("unexpected challenge"),
    }
}

const ALLOW: Decision = Decision::Allow { bypass: false };
const ALLOW_BYPASS: Decision = Decision::Allow { bypass: true };

#[test]
fn owner_session_has_every_permission() {
    let mut r = setup();
    let mut o = owner();
    for a in [Access::Look, Access::Read, Access::Write, Access::Exec] {
        assert_eq!(r.decide(ATT, &mut o, need(a), T0), ALLOW_BYPASS);
    }
    assert_eq!(
        r.decide(ATT + 1, &mut o, need(Access::Read), T0),
        Decision::Deny
    );
    let (atts, sess) = r.status(&mut o, T0);
    assert_eq!(atts.len(), 1);
    assert_eq!(atts[0].name, "proj");
    assert_eq!(sess.len(), 1);
    assert_eq!(sess[0].state, "active");
    assert_eq!(sess[0].entity, Entity::Session(100));
    assert_eq!(sess[0].perms.len(), crate::protocol::PERMISSIONS.len());
}

#[test]
fn other_user_and_other_session_denied() {
    let mut r = setup();
    let mut other = who(1001, 200);
    assert_eq!(
        r.decide(ATT, &mut other, need(Access::Look), T0),
        Decision::Deny
    );
    // The owner from another terminal (another session) is not authorized either.
    let mut owner2 = who(1000, 300);
    assert_eq!(
        r.decide(ATT, &mut owner2, need(Access::Read), T0),
        Decision::Deny
    );
    assert!(r.detach("proj", &mut other, T0).is_err());
    assert!(r.auth_start("proj", None, &mut owner2, T0).is_err());
    // status: no attaches of theirs for 1001, the owner's attach for the owner elsewhere.
    let (a, s) = r.status(&mut other, T0);
    assert!(a.is_empty() && s.is_empty());
    let (a, s) = r.status(&mut owner2, T0);
    assert_eq!(a.len(), 1);
    assert!(s.is_empty());
}

#[test]
fn read_only_grant_reads_but_does_not_write() {
    let mut r = setup();
    let id = r
        .authz_add(
            &grant(Entity::User(1001), &["read"]),
            &mut owner(),
            T0,
            None,
        )
        .unwrap();
    assert_eq!(id, 2);
    let mut bob = who(1001, 200);
    // Not before authenticating.
    assert_eq!(
        r.decide(ATT, &mut bob, need(Access::Read), T0),
        Decision::Deny
    );
    let s = auth_none(&mut r, &mut bob, T0).unwrap();
    assert!(s > 1);
    assert_eq!(r.decide(ATT, &mut bob, need(Access::Look), T0), ALLOW);
    assert_eq!(r.decide(ATT, &mut bob, need(Access::Read), T0), ALLOW);
    assert_eq!(
        r.decide(ATT, &mut bob, need(Access::Write), T0),
        Decision::Deny
    );
    assert_eq!(
        r.decide(ATT, &mut bob, need(Access::Exec), T0),
        Decision::Deny
    );
    // A User session covers every session of that user.
    let mut bob2 = who(1001, 201);
    assert_eq!(r.decide(ATT, &mut bob2, need(Access::Read), T0), ALLOW);
    // Re-authenticating reuses the session.
    assert_eq!(auth_none(&mut r, &mut bob2, T0).unwrap(), s);
    // No management rights.
    assert!(r.authz_list("proj", &mut bob, T0).is_err());
    assert!(r.sessions("proj", &mut bob, T0).is_err());
    assert!(r.detach("proj", &mut bob, T0).is_err());
}

#[test]
fn session_bound_grant_denies_other_sessions_of_same_user() {
    let mut r = setup();
    r.authz_add(
        &grant(Entity::Session(300), &["read", "write"]),
        &mut owner(),
        T0,
        None,
    )
    .unwrap();
    let mut in_session = who(1001, 300);
    let mut elsewhere = who(1001, 301);
    assert!(auth_none(&mut r, &mut elsewhere, T0).is_err());
    auth_none(&mut r, &mut in_session, T0).unwrap();
    assert_eq!(
        r.decide(ATT, &mut in_session, need(Access::Write), T0),
        ALLOW
    );
    assert_eq!(
        r.decide(ATT, &mut elsewhere, need(Access::Read), T0),
        Decision::Deny
    );
}

#[test]
fn group_and_pid_entities() {
    let mut r = setup();
    r.authz_add(&grant(Entity::Group(50), &["read"]), &mut owner(), T0, None)
        .unwrap();
    r.authz_add(
        &grant(Entity::Pid(4000), &["write"]),
        &mut owner(),
        T0,
        None,
    )
    .unwrap();
    let mut member = who(1002, 400);
    member.groups = vec![50];
    auth_none(&mut r, &mut member, T0).unwrap();
    let mut other_member = who(1003, 500);
    other_member.gid = 50;
    assert_eq!(
        r.decide(ATT, &mut other_member, need(Access::Read), T0),
        ALLOW
    );
    let mut nonmember = who(1004, 600);
    assert_eq!(
        r.decide(ATT, &mut nonmember, need(Access::Read), T0),
        Decision::Deny
    );

    // A thread of process 4000 (FUSE reports the thread id) matches Pid(4000).
    let mut proc_main = who(1005, 700);
    proc_main.pid = 4000;
    proc_main.tgid = 4000;
    assert_eq!(
        r.auth_start("proj", Some(3), &mut proc_main, T0)
            .map(|_| ()),
        Ok(())
    );
    let mut thread = proc_main.clone();
    thread.pid = 4001;
    assert_eq!(r.decide(ATT, &mut thread, need(Access::Write), T0), ALLOW);
    let mut other_proc = who(1005, 700);
    assert_eq!(
        r.decide(ATT, &mut other_proc, need(Access::Write), T0),
        Decision::Deny
    );

    // The process exits: its authorization and session end, a recycled pid gets nothing.
    let ev = r.process_exited(4000);
    assert_eq!(ev, vec![Event::Invalidate(ATT)]);
    assert_eq!(
        r.decide(ATT, &mut proc_main, need(Access::Write), T0),
        Decision::Deny
    );
    assert!(r.auth_start("proj", Some(3), &mut proc_main, T0).is_err());
    // The owner's session leader exiting ends the owner's session.
    r.process_exited(100);
    assert_eq!(
        r.decide(ATT, &mut owner(), need(Access::Read), T0),
        Decision::Deny
    );
}

#[test]
fn add_authz_grants_only_a_subset_of_what_is_held() {
    let mut r = setup();
    r.authz_add(
        &grant(Entity::User(1001), &["read", "add-authz"]),
        &mut owner(),
        T0,
        None,
    )
    .unwrap();
    r.authz_add(
        &grant(Entity::User(1002), &["read", "write"]),
        &mut owner(),
        T0,
        None,
    )
    .unwrap();
    let mut bob = who(1001, 200);
    let mut carol = who(1002, 300);
    // Holding the authorization is not enough: an active session is.
    assert!(r
        .authz_add(&grant(Entity::User(1003), &["read"]), &mut bob, T0, None)
        .is_err());
    auth_none(&mut r, &mut bob, T0).unwrap();
    assert!(r
        .authz_add(&grant(Entity::User(1003), &["read"]), &mut bob, T0, None)
        .is_ok());
    let e = r
        .authz_add(
            &grant(Entity::User(1003), &["read", "write"]),
            &mut bob,
            T0,
            None,
        )
        .unwrap_err();
    assert!(e.contains("only grant"), "{e}");
    assert!(r
        .authz_add(&grant(Entity::User(1003), &["bypass"]), &mut bob, T0, None)
        .is_err());
    // Without add-authz at all.
    auth_none(&mut r, &mut carol, T0).unwrap();
    assert!(r
        .authz_add(&grant(Entity::User(1003), &["read"]), &mut carol, T0, None)
        .unwrap_err()
        .contains("add-authz"));
    // Unknown permission names are refused.
    assert!(r
        .authz_add(&grant(Entity::User(1003), &["fly"]), &mut owner(), T0, None)
        .is_err());
    let list = r.authz_list("proj", &mut owner(), T0).unwrap();
    assert_eq!(list.len(), 4);
    assert_eq!(list[3].granted_by, 1001);
    assert_eq!(list[3].perms, vec!["read".to_string()]);
}

#[test]
fn revoked_session_cannot_reauthenticate() {
    let mut r = setup();
    r.authz_add(
        &grant(Entity::User(1001), &["read"]),
        &mut owner(),
        T0,
        None,
    )
    .unwrap();
    let mut bob = who(1001, 200);
    let s = auth_none(&mut r, &mut bob, T0).unwrap();
    // Bob cannot revoke (no permission), the owner can.
    assert!(r.revoke("proj", s, &mut bob, T0).is_err());
    assert_eq!(
        r.revoke("proj", s, &mut owner(), T0).unwrap(),
        vec![Event::Invalidate(ATT)]
    );
    assert_eq!(
        r.decide(ATT, &mut bob, need(Access::Read), T0),
        Decision::Deny
    );
    let e = auth_none(&mut r, &mut bob, T0).unwrap_err();
    assert!(e.contains("revoked"), "{e}");
    let sess = r.sessions("proj", &mut owner(), T0).unwrap();
    assert_eq!(sess.iter().find(|x| x.id == s).unwrap().state, "revoked");
    assert!(r.revoke("proj", s, &mut owner(), T0).is_err());
    assert!(r.revoke("proj", 999, &mut owner(), T0).is_err());
}

fn timed(on_timeout: OnTimeout) -> (Registry, Who, u64) {
    let mut r = setup();
    let mut g = grant(Entity::User(1001), &["read", "write"]);
    g.session_ttl = Some(10);
    g.on_timeout = on_timeout;
    g.callback = Some("notify-send".into());
    r.authz_add(&g, &mut owner(), T0, None).unwrap();
    let mut bob = who(1001, 200);
    let s = auth_none(&mut r, &mut bob, T0).unwrap();
    assert_eq!(r.next_deadline(), Some(T0 + 10));
    assert!(r.tick(T0 + 9).is_empty());
    (r, bob, s)
}

#[test]
fn timed_out_session_can_reauthenticate() {
    let (mut r, mut bob, s) = timed(OnTimeout::FailAll);
    assert_eq!(r.decide(ATT, &mut bob, need(Access::Read), T0 + 9), ALLOW);
    // Past the deadline the session is refused even before the timer runs.
    assert_eq!(
        r.decide(ATT, &mut bob, need(Access::Read), T0 + 10),
        Decision::Deny
    );
    let ev = r.tick(T0 + 10);
    assert_eq!(
        ev,
        vec![
            // As the owner, who set it: never as bob, whose session it is.
            Event::Callback {
                uid: 1000,
                cmd: "notify-send".into(),
                name: "proj".into(),
                reason: "session-expired".into()
            },
            Event::Invalidate(ATT)
        ]
    );
    assert_eq!(r.next_deadline(), None);
    let (_, st) = r.status(&mut bob, T0 + 11);
    assert_eq!(st[0].state, "timed-out");
    assert_eq!(auth_none(&mut r, &mut bob, T0 + 20).unwrap(), s);
    assert_eq!(r.decide(ATT, &mut bob, need(Access::Read), T0 + 20), ALLOW);
    assert_eq!(r.next_deadline(), Some(T0 + 30));
}

#[test]
fn on_timeout_behaviours() {
    use Access::Read;
    let cases = [
        (OnTimeout::FailAll, Decision::Deny, Decision::Deny, true),
        (OnTimeout::FailNew, Decision::Deny, ALLOW, false),
        (OnTimeout::SleepNew, Decision::Wait(2), ALLOW, false),
        (
            OnTimeout::SleepAll,
            Decision::Wait(2),
            Decision::Wait(2),
            true,
        ),
    ];
    for (behaviour, new, on_handle, invalidates) in cases {
        let (mut r, mut bob, s) = timed(behaviour);
        assert_eq!(s, 2);
        let ev = r.tick(T0 + 10);
        assert_eq!(
            ev.contains(&Event::Invalidate(ATT)),
            invalidates,
            "{behaviour:?}"
        );
        assert_eq!(
            r.decide(ATT, &mut bob, need(Read), T0 + 11),
            new,
            "{behaviour:?}"
        );
        assert_eq!(
            r.decide(ATT, &mut bob, open(Read), T0 + 11),
            on_handle,
            "{behaviour:?}"
        );
        // Never for another user, and never for what the session could not do anyway.
        let mut eve = who(1009, 900);
        assert_eq!(r.decide(ATT, &mut eve, open(Read), T0 + 11), Decision::Deny);
        assert_eq!(
            r.decide(ATT, &mut bob, open(Access::Exec), T0 + 11),
            Decision::Deny
        );
        // Waiters are counted per session and shown.
        r.add_waiting(s, 1);
        let (_, st) = r.status(&mut bob, T0 + 11);
        assert_eq!(st[0].waiting, 1);
        r.add_waiting(s, -1);
        // Revoked: nothing more, no waiting.
        r.revoke("proj", s, &mut owner(), T0 + 11).unwrap();
        assert_eq!(r.decide(ATT, &mut bob, open(Read), T0 + 11), Decision::Deny);
        assert_eq!(r.decide(ATT, &mut bob, need(Read), T0 + 11), Decision::Deny);
    }
}

#[test]
fn idle_timeout_follows_use() {
    let mut r = setup();
    let mut g = grant(Entity::User(1001), &["read"]);
    g.idle = Some(5);
    r.authz_add(&g, &mut owner(), T0, None).unwrap();
    let mut bob = who(1001, 200);
    auth_none(&mut r, &mut bob, T0).unwrap();
    assert_eq!(r.next_deadline(), Some(T0 + 5));
    assert_eq!(r.decide(ATT, &mut bob, need(Access::Read), T0 + 4), ALLOW);
    assert_eq!(r.next_deadline(), Some(T0 + 9));
    assert!(r.tick(T0 + 5).is_empty());
    assert_eq!(r.decide(ATT, &mut bob, need(Access::Read), T0 + 8), ALLOW);
    // A denied request does not count as use.
    assert_eq!(
        r.decide(ATT, &mut bob, need(Access::Write), T0 + 12),
        Decision::Deny
    );
    assert_eq!(r.tick(T0 + 13), vec![Event::Invalidate(ATT)]);
    assert_eq!(
        r.decide(ATT, &mut bob, need(Access::Read), T0 + 13),
        Decision::Deny
    );
}

#[test]
fn expired_authorization_refuses_auth_but_keeps_sessions() {
    let mut r = setup();
    let mut g = grant(Entity::User(1001), &["read"]);
    g.expires = Some(60);
    r.authz_add(&g, &mut owner(), T0, None).unwrap();
    let mut bob = who(1001, 200);
    let mut bob2 = who(1001, 201);
    auth_none(&mut r, &mut bob, T0 + 59).unwrap();
    let e = auth_none(&mut r, &mut bob2, T0 + 60).unwrap_err();
    assert!(e.contains("expired"), "{e}");
    assert_eq!(
        r.decide(ATT, &mut bob, need(Access::Read), T0 + 1000),
        ALLOW
    );
    // Zero-length timeouts are refused.
    g.expires = Some(0);
    assert!(r.authz_add(&g, &mut owner(), T0, None).is_err());
}

#[test]
fn deleting_an_authorization_keeps_its_sessions() {
    let mut r = setup();
    let id = r
        .authz_add(
            &grant(Entity::User(1001), &["read"]),
            &mut owner(),
            T0,
            None,
        )
        .unwrap();
    let mut bob = who(1001, 200);
    auth_none(&mut r, &mut bob, T0).unwrap();
    assert!(r.authz_del("proj", id, &mut bob, T0).is_err());
    r.authz_del("proj", id, &mut owner(), T0).unwrap();
    assert!(r.authz_del("proj", id, &mut owner(), T0).is_err());
    assert_eq!(r.decide(ATT, &mut bob, need(Access::Read), T0), ALLOW);
    assert!(auth_none(&mut r, &mut bob, T0).is_err());
}

fn passphrase_grant(key: &[u8; 32]) -> AuthzAddRequest {
    let mut g = grant(Entity::User(1001), &["read"]);
    g.auth = AuthMethod::Passphrase {
        salt: B64.encode([3u8; 16]),
        memory_kib: 64,
        iterations: 1,
        parallelism: 1,
        key: B64.encode(key),
    };
    g
}

fn challenge(r: &mut Registry, w: &mut Who, c: u8) -> PendingChallenge {
    match r.auth_start("proj", None, w, T0).unwrap() {
        AuthStart::Challenge {
            attach,
            authz,
            salt,
            params,
        } => {
            assert_eq!(salt, vec![3u8; 16]);
            assert_eq!(params.memory_kib, 64);
            PendingChallenge {
                attach,
                name: "proj".into(),
                authz,
                challenge: [c; 32],
            }
        }
        AuthStart::Authenticated(_) => panic!("no challenge"),
    }
}

#[test]
fn passphrase_challenge_response() {
    let key = [42u8; 32];
    let mut r = setup();
    let id = r
        .authz_add(&passphrase_grant(&key), &mut owner(), T0, None)
        .unwrap();
    let list = r.authz_list("proj", &mut owner(), T0).unwrap();
    assert_eq!(list[1].method, "passphrase");
    let mut bob = who(1001, 200);

    // Forged answer (wrong key) fails, and opens nothing.
    let p = challenge(&mut r, &mut bob, 1);
    let forged = auth::challenge_answer(&[41u8; 32], "proj", id, &p.challenge);
    assert_eq!(
        r.auth_finish(&p, &forged, &mut bob, T0).unwrap_err(),
        "authentication failed"
    );
    assert!(r.auth_finish(&p, b"short", &mut bob, T0).is_err());
    assert_eq!(
        r.decide(ATT, &mut bob, need(Access::Read), T0),
        Decision::Deny
    );

    // The right answer works.
    let p1 = challenge(&mut r, &mut bob, 1);
    let good = auth::challenge_answer(&key, "proj", id, &p1.challenge);
    let s = r.auth_finish(&p1, &good, &mut bob, T0).unwrap();
    assert_eq!(r.decide(ATT, &mut bob, need(Access::Read), T0), ALLOW);

    // Replayed against a fresh challenge, the old answer is worthless.
    assert!(s > 1);
    let mut r = setup();
    r.authz_add(&passphrase_grant(&key), &mut owner(), T0, None)
        .unwrap();
    let p2 = challenge(&mut r, &mut bob, 2);
    assert!(r.auth_finish(&p2, &good, &mut bob, T0).is_err());
    // Someone else cannot answer a challenge of an authorization that is not theirs.
    let mut eve = who(1009, 900);
    let good2 = auth::challenge_answer(&key, "proj", id, &p2.challenge);
    assert!(r.auth_finish(&p2, &good2, &mut eve, T0).is_err());

    // Bad verifier parameters are refused at grant time.
    let mut g = passphrase_grant(&key);
    if let AuthMethod::Passphrase { key, .. } = &mut g.auth {
        *key = B64.encode([1u8; 31]);
    }
    assert!(r.authz_add(&g, &mut owner(), T0, None).is_err());
    let mut g = passphrase_grant(&key);
    if let AuthMethod::Passphrase { memory_kib, .. } = &mut g.auth {
        *memory_kib = 1;
    }
    assert!(r.authz_add(&g, &mut owner(), T0, None).is_err());
}

#[test]
fn key_lifetime_detaches_with_callback() {
    let mut r = setup_with(Some(30), Some("echo $1 $2"));
    assert_eq!(r.next_deadline(), Some(T0 + 30));
    let (a, _) = r.status(&mut owner(), T0);
    assert_eq!(a[0].key_expires, Some(T0 + 30));
    assert!(r.tick(T0 + 29).is_empty());
    let ev = r.tick(T0 + 30);
    assert_eq!(
        ev,
        vec![
            Event::Detach(ATT),
            Event::Callback {
                uid: 1000,
                cmd: "echo $1 $2".into(),
                name: "proj".into(),
                reason: "key-expired".into()
            }
        ]
    );
    assert_eq!(r.attach_id("proj"), None);
    assert_eq!(
        r.decide(ATT, &mut owner(), need(Access::Read), T0),
        Decision::Deny
    );
    assert_eq!(r.next_deadline(), None);
}

#[test]
fn owner_uid_may_always_detach() {
    let mut r = setup();
    // Not the owner's uid, no session: refused.
    assert!(r.detach("proj", &mut who(2000, 300), T0).is_err());
    // The owner from a terminal whose session holds nothing (the attaching one ended).
    assert_eq!(r.detach("proj", &mut who(1000, 301), T0), Ok(ATT));
}

#[test]
fn detach_needs_the_permission_and_frees_the_name() {
    let mut r = setup();
    r.authz_add(
        &grant(Entity::User(2000), &["read", "detach"]),
        &mut owner(),
        T0,
        None,
    )
    .unwrap();
    // Another user, once granted and authenticated.
    let mut other = who(2000, 300);
    assert!(r.detach("proj", &mut other, T0).is_err());
    auth_none(&mut r, &mut other, T0).unwrap();
    assert_eq!(r.detach("proj", &mut other, T0), Ok(ATT));
    assert!(r.detach("proj", &mut owner(), T0).is_err());
    assert!(r.reserve_name("proj", &mut owner()).is_ok());
}

#[test]
fn a_session_grant_covers_only_processes_of_its_uid() {
    let mut r = setup();
    // A setuid program of another user (or of root), run in the owner's session.
    for uid in [2000, 0] {
        let mut setuid = who(uid, 100);
        assert_eq!(
            r.decide(ATT, &mut setuid, need(Access::Read), T0),
            Decision::Deny,
            "uid {uid}"
        );
        assert!(r.authz_list("proj", &mut setuid, T0).is_err());
        assert!(r
            .authz_add(&grant(Entity::User(uid), &["read"]), &mut setuid, T0, None)
            .is_err());
    }
    // Bob's session, granted for bob's uid: a setuid program of carol's there gets nothing.
    let bob_sid = 300;
    let z = r
        .authz_add(
            &grant(Entity::Session(bob_sid), &["read"]),
            &mut owner(),
            T0,
            Some(1001),
        )
        .unwrap();
    let mut carol_in_bobs_session = who(1002, bob_sid);
    assert!(auth_none(&mut r, &mut carol_in_bobs_session, T0).is_err());
    let mut bob = who(1001, bob_sid);
    auth_none(&mut r, &mut bob, T0).unwrap();
    assert_eq!(r.decide(ATT, &mut bob, need(Access::Read), T0), ALLOW);
    assert_eq!(
        r.decide(ATT, &mut carol_in_bobs_session, need(Access::Read), T0),
        Decision::Deny
    );
    let list = r.authz_list("proj", &mut owner(), T0).unwrap();
    assert_eq!(list[0].only_uid, Some(1000));
    assert_eq!(
        list.iter().find(|x| x.id == z).unwrap().only_uid,
        Some(1001)
    );
    // Unless the grant says otherwise.
    let mut g = grant(Entity::Session(bob_sid), &["read"]);
    g.any_uid = true;
    r.authz_add(&g, &mut owner(), T0, None).unwrap();
    auth_none(&mut r, &mut carol_in_bobs_session, T0).unwrap();
    assert_eq!(
        r.decide(ATT, &mut carol_in_bobs_session, need(Access::Read), T0),
        ALLOW
    );
    let mut g = grant(Entity::User(1001), &["read"]);
    g.any_uid = true;
    assert!(r
        .authz_add(&g, &mut owner(), T0, None)
        .unwrap_err()
        .contains("--any-uid"));
}

#[test]
fn callbacks_run_as_who_set_them() {
    let mut r = setup_with(None, Some("owner-cb"));
    // The owner grants root a session with a callback: it runs as the owner, not as root.
    let mut g = grant(Entity::User(0), &["read"]);
    g.session_ttl = Some(5);
    g.callback = Some("cat /etc/shadow".into());
    r.authz_add(&g, &mut owner(), T0, None).unwrap();
    auth_none(&mut r, &mut who(0, 9), T0).unwrap();
    let ev = r.tick(T0 + 5);
    let callbacks: Vec<_> = ev
        .iter()
        .filter_map(|e| match e {
            Event::Callback { uid, cmd, .. } => Some((*uid, cmd.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(callbacks, vec![(1000, "cat /etc/shadow")]);
}

fn hidden_setup() -> Registry {
    let mut r = Registry::new();
    r.reserve_name("ghost", &mut owner()).unwrap();
    r.insert_attach(
        ATT,
        NewAttach {
            name: "ghost".into(),
            path: "/crypt/ghost".into(),
            cipherdir: "/home/a/enc".into(),
            owner_uid: 1000,
            owner_gid: 1000,
            owner_sid: 100,
            hidden: true,
            read_only: false,
            key_ttl: None,
            callback: None,
        },
        T0,
    );
    r
}

/// Every answer about `name` a caller can get by name.
fn answers(r: &mut Registry, name: &str, w: &mut Who) -> Vec<String> {
    let mut g = grant(Entity::User(w.uid), &["read"]);
    g.name = name.into();
    vec![
        r.auth_start(name, None, w, T0).map(|_| ()).unwrap_err(),
        r.auth_start(name, Some(1), w, T0).map(|_| ()).unwrap_err(),
        r.sessions(name, w, T0).map(|_| ()).unwrap_err(),
        r.authz_list(name, w, T0).map(|_| ()).unwrap_err(),
        r.authz_del(name, 1, w, T0).unwrap_err(),
        r.revoke(name, 1, w, T0).map(|_| ()).unwrap_err(),
        r.detach(name, w, T0).map(|_| ()).unwrap_err(),
        r.check_authz_add(&g, w, T0).unwrap_err(),
    ]
}

#[test]
fn a_hidden_attach_answers_like_a_missing_one() {
    let mut r = hidden_setup();
    let mut eve = who(1009, 900);
    let hidden = answers(&mut r, "ghost", &mut eve);
    let missing = answers(&mut r, "nosuch", &mut eve);
    for (h, m) in hidden.iter().zip(&missing) {
        assert_eq!(h.replace("ghost", "NAME"), m.replace("nosuch", "NAME"));
    }
    assert!(hidden.iter().all(|e| e == "no attach named \"ghost\""));
    // Taking the name: the answer is that of any taken name, but the daemon learns it was
    // a hidden one (and counts a guess).
    assert_eq!(r.reserve_name("ghost", &mut eve), Err(NameTaken::Hidden));
    assert_eq!(
        NameTaken::Hidden.message("ghost"),
        NameTaken::Known.message("ghost")
    );
    assert_eq!(r.reserve_name("ghost", &mut owner()), Err(NameTaken::Known));
    // Once an authorization names eve, she is entitled to know.
    let mut g = grant(Entity::User(1009), &["read"]);
    g.name = "ghost".into();
    r.authz_add(&g, &mut owner(), T0, None).unwrap();
    let e = r.sessions("ghost", &mut eve, T0).unwrap_err();
    assert!(e.contains("permission denied"), "{e}");
    assert_eq!(r.reserve_name("ghost", &mut eve), Err(NameTaken::Known));
    auth_none_named(&mut r, "ghost", &mut eve).unwrap();
    // Root may always know (it sees every attach in `status`).
    assert!(r
        .sessions("ghost", &mut who(0, 1), T0)
        .unwrap_err()
        .contains("permission"));
}

fn auth_none_named(r: &mut Registry, name: &str, w: &mut Who) -> OpResult<u64> {
    match r.auth_start(name, None, w, T0)? {
        AuthStart::Authenticated(s) => Ok(s),
        AuthStart::Challenge { .. } => panic!("unexpected challenge"),
    }
}

#[test]
fn quotas() {
    let mut r = setup();
    r.limits = Limits {
        authzs_per_attach: 4,
        authzs_per_uid: 5,
        sessions_per_attach: 3,
        callback_len: 16,
        attaches_per_uid: 2,
        ..Limits::default()
    };
    let mut g = grant(Entity::User(1001), &["read"]);
    g.callback = Some("x".repeat(17));
    assert!(r
        .authz_add(&g, &mut owner(), T0, None)
        .unwrap_err()
        .contains("longer than 16 bytes"));
    g.callback = Some("x".repeat(16));
    // Three more fit beside the owner's.
    for uid in [1001, 1002, 1003] {
        g.entity = Entity::User(uid);
        r.authz_add(&g, &mut owner(), T0, None).unwrap();
    }
    let e = r.authz_add(&g, &mut owner(), T0, None).unwrap_err();
    assert!(e.contains("holds 4 authorizations"), "{e}");
    // Sessions: the owner's and two more.
    auth_none(&mut r, &mut who(1001, 201), T0).unwrap();
    auth_none(&mut r, &mut who(1002, 202), T0).unwrap();
    let e = auth_none(&mut r, &mut who(1003, 203), T0).unwrap_err();
    assert!(e.contains("holds 3 sessions"), "{e}");
    // Re-authenticating an existing session needs no room.
    auth_none(&mut r, &mut who(1001, 201), T0).unwrap();
    // Per granting uid, over every attach.
    r.reserve_name("two", &mut owner()).unwrap();
    r.insert_attach(
        ATT + 1,
        NewAttach {
            name: "two".into(),
            path: "/crypt/two".into(),
            cipherdir: "/x".into(),
            owner_uid: 1000,
            owner_gid: 1000,
            owner_sid: 100,
            hidden: false,
            read_only: false,
            key_ttl: None,
            callback: None,
        },
        T0,
    );
    // Five granted by uid 1000 now: each attach's owner authorization, and 1001..1003.
    let mut g2 = grant(Entity::User(1004), &["read"]);
    g2.name = "two".into();
    let e = r.authz_add(&g2, &mut owner(), T0, None).unwrap_err();
    assert!(e.contains("granted 5 authorizations"), "{e}");
    // Attaches per uid (what is being attached counts).
    assert!(r.check_attach_quota(1000).is_err());
    assert_eq!(
        r.reserve_name("three", &mut owner()),
        Err(NameTaken::Quota(2))
    );
    assert!(r.check_attach_quota(1001).is_ok());
    r.reserve_name("b1", &mut who(1001, 1)).unwrap();
    r.reserve_name("b2", &mut who(1001, 1)).unwrap();
    assert!(r
        .check_attach_quota(1001)
        .unwrap_err()
        .contains("2 attaches"));
    r.unreserve_name("b2");
    assert!(r.check_attach_quota(1001).is_ok());
}

#[test]
fn deleting_forgets_what_cannot_come_back() {
    let mut r = setup();
    let mut g = grant(Entity::Pid(4000), &["read"]);
    g.session_ttl = Some(5);
    let a = r.authz_add(&g, &mut owner(), T0, Some(1001)).unwrap();
    let b = r
        .authz_add(
            &grant(Entity::Session(500), &["read"]),
            &mut owner(),
            T0,
            Some(1002),
        )
        .unwrap();
    let mut p = who(1001, 700);
    p.pid = 4000;
    p.tgid = 4000;
    let sa = auth_none(&mut r, &mut p, T0).unwrap();
    let sb = auth_none(&mut r, &mut who(1002, 500), T0).unwrap();
    assert_eq!(r.watched_pids(), BTreeSet::from([100, 500, 4000]));
    // a times out, b is revoked: both are remembered while their authorizations exist.
    r.tick(T0 + 5);
    r.revoke("proj", sb, &mut owner(), T0).unwrap();
    assert_eq!(r.sessions("proj", &mut owner(), T0 + 5).unwrap().len(), 3);
    r.authz_del("proj", a, &mut owner(), T0 + 5).unwrap();
    r.authz_del("proj", b, &mut owner(), T0 + 5).unwrap();
    let left = r.sessions("proj", &mut owner(), T0 + 5).unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left.iter().all(|s| s.id != sa && s.id != sb));
    assert_eq!(r.watched_pids(), BTreeSet::from([100]));
    // An active session of a deleted authorization stays until it ends, then goes.
    let mut g = grant(Entity::User(1003), &["read"]);
    g.session_ttl = Some(5);
    let c = r.authz_add(&g, &mut owner(), T0, None).unwrap();
    auth_none(&mut r, &mut who(1003, 800), T0).unwrap();
    r.authz_del("proj", c, &mut owner(), T0).unwrap();
    assert_eq!(r.sessions("proj", &mut owner(), T0).unwrap().len(), 2);
    r.tick(T0 + 5);
    assert_eq!(r.sessions("proj", &mut owner(), T0 + 5).unwrap().len(), 1);
}

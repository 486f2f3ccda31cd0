//! Model-based test: random sequences of operations against the real mutex (real redb
//! file, restarts included) and against a plain HashMap model must give identical answers.
//! Commits and releases settle a grant picked from those not yet settled, stale ones
//! included (their key released by the operator, or expired, and perhaps reserved again),
//! so the model also checks that a grant acts only on the entry it made. A signed request
//! turned away as a duplicate takes its guard all the same, settled with the trade that
//! turned it away.

mod mutex_support;

use std::collections::HashMap;

use hoox_edge::mutex::{
    Clock, Decision, Duplicate, Grant, Guard, Key, Released, Snapshot, State, key::BUCKET_MS,
};
use mutex_support::*;
use proptest::prelude::*;

const T0: u64 = 1_800_000_000_000;

#[derive(Debug, Clone)]
enum Op {
    /// key index, ttl in seconds, payload hash, guard (index, ttl in seconds)
    Reserve(usize, u64, u8, Option<(usize, u64)>),
    /// key index, with a response, which of the key's unsettled grants
    Commit(usize, bool, usize),
    /// key index, which of the key's unsettled grants
    Release(usize, usize),
    /// the operator's release
    ForceRelease(usize),
    Advance(u64),
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (
            0..KEYS,
            prop_oneof![1..5u64, Just(90), Just(300)],
            0..2u8,
            proptest::option::weighted(0.4, (0..GUARDS, prop_oneof![1..5u64, Just(600)])),
        )
            .prop_map(|(k, t, h, g)| Op::Reserve(k, t, h, g)),
        2 => (0..KEYS, any::<bool>(), 0..3usize).prop_map(|(k, r, g)| Op::Commit(k, r, g)),
        2 => (0..KEYS, 0..3usize).prop_map(|(k, g)| Op::Release(k, g)),
        1 => (0..KEYS + GUARDS).prop_map(Op::ForceRelease),
        3 => prop_oneof![3 => 0..1_500u64, 1 => Just(1), 1 => Just(BUCKET_MS - 1), 1 => Just(BUCKET_MS)].prop_map(Op::Advance),
        1 => Just(Op::Restart),
    ]
}

const KEYS: usize = 3;
/// Signature guards, after the trade keys in `keys()`.
const GUARDS: usize = 2;

fn keys() -> Vec<Key> {
    (0..KEYS)
        .map(|i| Key::from_stored(&format!("trade:x:S:LONG:1:live:{i}")).unwrap())
        .chain((0..GUARDS).map(|g| Key::signature(&[g as u8; 32])))
        .collect()
}

#[derive(Debug, Clone)]
struct ModelEntry {
    state: State,
    stored_at: u64,
    expires_at: u64,
    hash: u8,
    response: Option<Snapshot>,
    /// Which grant made it.
    grant: u64,
    /// For the guard of a signed request turned away by a pending trade: that trade's
    /// grant, whose commit or release settles it too, and its key (the order the guard
    /// waits on is that trade's, which a duplicate the guard catches names).
    follows: Option<(u64, usize)>,
}

/// What the model says a reserve gets: a grant (numbered by the model), or this answer.
// One per reserve, compared and dropped: its size costs nothing worth a Box.
#[allow(clippy::large_enum_variant)]
enum Expect {
    Grant(u64),
    Answer(Decision),
}

/// The specification, as plainly as it can be written.
#[derive(Default)]
struct Model {
    now: u64,
    map: HashMap<usize, ModelEntry>,
    grants: u64,
}

impl Model {
    fn live(&self, k: usize) -> Option<&ModelEntry> {
        self.map.get(&k).filter(|e| self.now < e.expires_at)
    }

    fn dup(&self, keys: &[Key], k: usize, e: &ModelEntry) -> Decision {
        Decision::Duplicate(Duplicate {
            key: keys[k].clone(),
            state: e.state,
            age_ms: self.now - e.stored_at,
            expires_in_ms: e.expires_at - self.now,
            response: if e.state == State::Committed {
                e.response.clone()
            } else {
                None
            },
            // The owner's number for the entry: not modelled (it numbers guard entries no
            // answer returns); set from the answer before the two are compared.
            seq: 0,
            follows: e.follows.map(|(_, t)| (keys[t].clone(), 0)),
            guarded: false,
        })
    }

    fn reserve(
        &mut self,
        keys: &[Key],
        k: usize,
        ttl_ms: u64,
        hash: u8,
        guard: Option<(usize, u64)>,
    ) -> Expect {
        if let Some(e) = self.live(k) {
            if e.hash != hash {
                return Expect::Answer(Decision::Mismatch);
            }
            let by = (e.state, e.grant, k);
            return self.turned_away(self.dup(keys, k, e), by, guard);
        }
        // The trade keys are one trade's minutes: another reserved less than a minute ago,
        // or still pending however old, holds them all.
        if let Some((s, e)) = (0..KEYS)
            .filter_map(|s| self.live(s).map(|e| (s, e)))
            .find(|(_, e)| e.state == State::Pending || self.now - e.stored_at < BUCKET_MS)
        {
            let by = (e.state, e.grant, s);
            return self.turned_away(self.dup(keys, s, e), by, guard);
        }
        if let Some((g, _)) = guard
            && let Some(e) = self.live(KEYS + g)
        {
            return Expect::Answer(self.dup(keys, KEYS + g, e));
        }
        self.grants += 1;
        let entries = std::iter::once((k, ttl_ms, hash))
            .chain(guard.map(|(g, ttl_s)| (KEYS + g, ttl_s * 1_000, 0)));
        for (k, ttl_ms, hash) in entries {
            let e = ModelEntry {
                state: State::Pending,
                stored_at: self.now,
                expires_at: self.now + ttl_ms,
                hash,
                response: None,
                grant: self.grants,
                follows: None,
            };
            self.map.insert(k, e);
        }
        Expect::Grant(self.grants)
    }

    /// A signed request turned away as a duplicate (`d`) of a trade's entry (`by`: its
    /// state, grant and key) still takes its guard, unless the guard is live: following a
    /// pending trade's grant, or committed at once; the answer says it was written.
    fn turned_away(
        &mut self,
        mut d: Decision,
        by: (State, u64, usize),
        guard: Option<(usize, u64)>,
    ) -> Expect {
        if let Some((g, ttl_s)) = guard
            && self.live(KEYS + g).is_none()
        {
            let follows = match by {
                (State::Pending, grant, trade) => Some((grant, trade)),
                (State::Committed, ..) => None,
            };
            self.grants += 1;
            let e = ModelEntry {
                state: if follows.is_some() {
                    State::Pending
                } else {
                    State::Committed
                },
                stored_at: self.now,
                expires_at: self.now + ttl_s * 1_000,
                hash: 0,
                response: None,
                grant: self.grants,
                follows,
            };
            self.map.insert(KEYS + g, e);
            // Said, so that the gateway charges its guard pace for it.
            if let Decision::Duplicate(dup) = &mut d {
                dup.guarded = true;
            }
        }
        Expect::Answer(d)
    }

    /// The entry `grant` made, if `k` still holds it.
    fn held_by(&mut self, k: usize, grant: u64) -> Option<&mut ModelEntry> {
        self.map.get_mut(&k).filter(|e| e.grant == grant)
    }
}

fn snapshot(k: usize) -> Snapshot {
    Snapshot {
        status: 200,
        body: format!("{{\"k\":{k}}}").into_bytes(),
    }
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let (clock, time) = Clock::manual(T0);
    let keys = keys();
    let mut model = Model {
        now: T0,
        ..Model::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (mut m, mut owner) = start(&path, clock.clone());
    // Per key, the grants not yet settled, with the model's number for each and the
    // index of its guard.
    let mut held: HashMap<usize, Vec<Held>> = HashMap::new();
    for op in ops {
        match op {
            Op::Reserve(k, ttl, h, guard) => {
                let mut r = reserve(&keys[k], ttl * 1_000, h);
                r.guard = guard.map(|(g, ttl_s)| Guard {
                    key: keys[KEYS + g].clone(),
                    ttl: std::time::Duration::from_secs(ttl_s),
                    when_turned_away: true,
                });
                let got = rt.block_on(m.reserve(r));
                match (got, model.reserve(&keys, k, ttl * 1_000, h, guard)) {
                    (Decision::Proceed(g), Expect::Grant(id)) => {
                        prop_assert_eq!(g.key(), &keys[k]);
                        let guard = guard.map(|(g, _)| KEYS + g);
                        held.entry(k).or_default().push((id, g, guard));
                    }
                    (mut got, Expect::Answer(want)) => {
                        if let Decision::Duplicate(d) = &mut got {
                            d.seq = 0;
                            if let Some(f) = &mut d.follows {
                                f.1 = 0;
                            }
                        }
                        prop_assert_eq!(got, want, "reserve {} at {}", k, model.now - T0)
                    }
                    (got, Expect::Grant(_)) => {
                        prop_assert!(false, "reserve {}: expected a grant, got {:?}", k, got)
                    }
                }
            }
            Op::Commit(k, with_response, pick) => {
                let Some((id, g, guard)) = take(&mut held, k, pick) else {
                    continue;
                };
                let snap = with_response.then(|| snapshot(k));
                m.commit(g, snap.clone()).unwrap();
                let now = model.now;
                let entries = std::iter::once((k, snap)).chain(guard.map(|g| (g, None)));
                for (k, snap) in entries {
                    if let Some(e) = model.held_by(k, id).filter(|e| now < e.expires_at) {
                        e.state = State::Committed;
                        e.response = snap;
                    }
                }
                for e in model
                    .map
                    .values_mut()
                    .filter(|e| e.follows.is_some_and(|f| f.0 == id))
                {
                    e.follows = None;
                    if now < e.expires_at {
                        e.state = State::Committed;
                    }
                }
            }
            Op::Release(k, pick) => {
                let Some((id, g, guard)) = take(&mut held, k, pick) else {
                    continue;
                };
                m.release(g).unwrap();
                for k in std::iter::once(k).chain(guard) {
                    if model.held_by(k, id).is_some() {
                        model.map.remove(&k);
                    }
                }
                model.map.retain(|_, e| e.follows.is_none_or(|f| f.0 != id));
            }
            Op::ForceRelease(k) => {
                let released = rt.block_on(m.force_release(keys[k].clone(), None)).unwrap();
                let was_live = released == Released::Yes;
                prop_assert_eq!(was_live, model.live(k).is_some(), "force release {}", k);
                model.map.remove(&k);
            }
            Op::Advance(ms) => {
                time.advance_ms(ms);
                model.now += ms;
            }
            Op::Restart => {
                owner.stop();
                (m, owner) = start(&path, clock.clone());
                // A grant belongs to the owner that made it, which is gone, and nothing
                // settles its followers now but their TTL.
                held.clear();
                for e in model.map.values_mut() {
                    e.follows = None;
                }
            }
        }
        // The published count and the owner's own count agree with the model's live keys.
        let live = model
            .map
            .values()
            .filter(|e| model.now < e.expires_at)
            .count();
        let listed = rt.block_on(m.list(usize::MAX)).unwrap();
        prop_assert_eq!(listed.len(), live);
        for info in listed {
            let k = keys.iter().position(|x| *x == info.key).unwrap();
            let e = model.live(k).unwrap();
            prop_assert_eq!(info.state, e.state);
            prop_assert_eq!(info.expires_at, e.expires_at);
        }
    }
    owner.stop();
    Ok(())
}

/// An unsettled grant: the model's number for it, the grant, and its guard's index.
type Held = (u64, Grant, Option<usize>);

/// Takes one of `k`'s unsettled grants, if it has any.
fn take(held: &mut HashMap<usize, Vec<Held>>, k: usize, pick: usize) -> Option<Held> {
    let grants = held.get_mut(&k).filter(|g| !g.is_empty())?;
    let i = pick % grants.len();
    Some(grants.swap_remove(i))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn the_mutex_behaves_like_the_model(ops in proptest::collection::vec(op(), 1..60)) {
        run(ops)?;
    }
}

//! The cheap gates around the mutex: a per-identity rate limit, the IP allowlist, a cap
//! on the connections one address may hold, and the stalled handshakes that give their
//! places up at the connection cap.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use tokio_util::sync::CancellationToken;

/// Most identities tracked at once. Identities are authenticated (a shared secret or a
/// certificate's name), so this is far beyond any real fleet; it only bounds memory.
pub const MAX_BUCKETS: usize = 4096;
/// Longest wait ever advised; keeps `Retry-After` sane whatever the configured rate.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);
/// The slowest rate a config may set: a bucket refills a token within `MAX_RETRY_AFTER`,
/// so a sender that waits as advised is served.
pub const MIN_RATE_PER_S: f64 = 1.0 / MAX_RETRY_AFTER.as_secs() as f64;

/// A token bucket per identity: `burst` requests at once, refilled at `rate_per_s`.
#[derive(Debug)]
pub struct RateLimiter {
    rate: f64,
    burst: f64,
    max_buckets: usize,
    buckets: Mutex<HashMap<String, Bucket>>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl RateLimiter {
    /// `rate_per_s` must be positive and finite (the config checks it); anything else
    /// is taken as the slowest possible rate, never as "unlimited". A burst of 0 is 1.
    pub fn new(rate_per_s: f64, burst: u32) -> Self {
        Self::with_capacity(rate_per_s, burst, MAX_BUCKETS)
    }

    pub fn with_capacity(rate_per_s: f64, burst: u32, max_buckets: usize) -> Self {
        let rate = if rate_per_s.is_finite() && rate_per_s > 0.0 {
            rate_per_s
        } else {
            f64::MIN_POSITIVE
        };
        RateLimiter {
            rate,
            burst: f64::from(burst.max(1)),
            max_buckets: max_buckets.max(1),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one token for `identity`, or says how long until one is there.
    pub fn check(&self, identity: &str, now: Instant) -> Result<(), Duration> {
        // A poisoned lock only means another thread panicked mid-update of plain
        // numbers; the map is still usable.
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if !buckets.contains_key(identity) && buckets.len() >= self.max_buckets {
            // A bucket that has refilled is the same as no bucket: forget those.
            buckets.retain(|_, b| self.refilled(b, now) < self.burst);
            if buckets.len() >= self.max_buckets {
                // Every tracked identity is active: refusing is safer than forgetting
                // someone's spent quota.
                return Err(Duration::from_secs(1));
            }
        }
        let b = buckets.entry(identity.to_owned()).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        b.tokens = self.refilled(b, now);
        b.at = now.max(b.at);
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            let wait = (1.0 - b.tokens) / self.rate;
            Err(Duration::try_from_secs_f64(wait)
                .unwrap_or(MAX_RETRY_AFTER)
                .min(MAX_RETRY_AFTER))
        }
    }

    /// Whether `identity` has a token now, taking none: [`Self::check`] takes it once what
    /// it pays for is known to be done.
    pub fn has_token(&self, identity: &str, now: Instant) -> bool {
        let buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        buckets
            .get(identity)
            .is_none_or(|b| self.refilled(b, now) >= 1.0)
    }

    fn refilled(&self, b: &Bucket, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        (b.tokens + elapsed * self.rate).min(self.burst)
    }

    /// Identities currently tracked.
    #[cfg(test)]
    pub fn tracked(&self) -> usize {
        self.buckets.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Source addresses allowed to post trades. Empty allows everyone.
#[derive(Debug, Clone, Default)]
pub struct Allowlist(Vec<IpNet>);

impl Allowlist {
    /// Each entry is a CIDR (`10.0.0.0/8`, `fd00::/8`) or a single address. The error names
    /// the entry: in a list of twenty, "invalid IP address syntax" alone finds nothing.
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        entries
            .iter()
            .map(|e| {
                let e = e.trim();
                let n = e
                    .parse::<IpNet>()
                    .or_else(|err| e.parse::<IpAddr>().map(IpNet::from).map_err(|_| err))
                    .map_err(|err| {
                        format!("{e:?}: {err} (an address, or a CIDR such as 10.0.0.0/8)")
                    })?;
                // `10.1.2.3/8`: the one host, or the whole /8? Asked, not guessed: taken
                // as the network, it let in every address of it.
                if n != n.trunc() {
                    return Err(format!(
                        "{e:?} has bits set past its prefix: write {} for the network, or \
                         {} for the one address",
                        n.trunc(),
                        n.addr()
                    ));
                }
                Ok(canonical_net(n))
            })
            .collect::<Result<_, _>>()
            .map(Allowlist)
    }

    pub fn allows(&self, ip: IpAddr) -> bool {
        // A dual-stack socket reports IPv4 peers as ::ffff:a.b.c.d.
        let ip = ip.to_canonical();
        self.0.is_empty() || self.0.iter().any(|n| n.contains(&ip))
    }
}

/// How many connections each address holds, so that one host on the LAN cannot take every
/// slot of `server.max_connections` from the signal engine. An address is tracked only while
/// it holds a connection, so the map never outgrows the connections held (the cap, the
/// few places of the addresses outside the allowlist, and the one waiting for a place).
#[derive(Debug)]
pub struct PerIp {
    max: usize,
    held: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection's place in its address's count; dropping it gives the place back.
#[derive(Debug)]
pub struct IpSlot {
    per_ip: Arc<PerIp>,
    ip: IpAddr,
}

impl PerIp {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(PerIp {
            max,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// A place for one more connection from `ip`, or `None` when it holds `max` already,
    /// or, for an address the allowlist leaves out (`allowed` false), one already: it is
    /// answered 403 whatever it sends, and a quarter of the connections each would let a
    /// handful of them take every place from the addresses the list names.
    pub fn acquire(self: &Arc<Self>, ip: IpAddr, allowed: bool) -> Option<IpSlot> {
        // Nothing below can panic while the lock is held, and a count is changed in one
        // step: a poisoned lock (from elsewhere) still guards a whole map.
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let n = held.entry(ip).or_insert(0);
        if *n >= if allowed { self.max } else { 1 } {
            return None;
        }
        *n += 1;
        Some(IpSlot {
            per_ip: self.clone(),
            ip,
        })
    }

    /// Addresses holding at least one connection.
    #[cfg(test)]
    pub fn tracked(&self) -> usize {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut held = self
            .per_ip
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = held.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

/// How long a TLS handshake may take before, at the connection cap, it gives its place to
/// a connection waiting in the backlog: one on the LAN takes milliseconds, so one that
/// has said nothing for a second is a scan, a client that went away, or a flood.
pub const STALLED_HANDSHAKE: Duration = Duration::from_secs(1);

/// The connections still in their TLS handshake, oldest first. At the connection cap the
/// accept loop stops accepting; a connection that takes a place and says nothing held it
/// for the whole `handshake_timeout`, so addresses that each keep within their share,
/// reconnecting as each is closed, held every place and left the signal engine's
/// connection in the backlog for as long as they went on. At the cap, the oldest stalled
/// one is closed instead, one at a time, as the loop needs a place.
#[derive(Debug, Default)]
pub struct Handshakes {
    open: Mutex<BTreeMap<u64, (Instant, CancellationToken)>>,
}

/// One connection's entry among the handshakes, taken out when dropped (its handshake
/// ended, whichever way).
#[derive(Debug)]
pub struct InHandshake {
    handshakes: Arc<Handshakes>,
    id: u64,
}

/// What [`Handshakes::close_stalled`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Stalled {
    /// Closed the oldest: its place comes back as its task ends.
    Closed,
    /// The oldest stalls in this long.
    In(Duration),
    /// No connection is in its handshake.
    None,
}

impl Handshakes {
    /// Enters connection `id` (the accept loop's count), begun now; cancelling the token
    /// ends its handshake.
    pub fn enter(self: &Arc<Self>, id: u64, stop: CancellationToken) -> InHandshake {
        self.lock().insert(id, (Instant::now(), stop));
        InHandshake {
            handshakes: self.clone(),
            id,
        }
    }

    /// Closes the oldest handshake if it has taken [`STALLED_HANDSHAKE`] or longer.
    pub fn close_stalled(&self) -> Stalled {
        let mut open = self.lock();
        let Some(entry) = open.first_entry() else {
            return Stalled::None;
        };
        let (began, stop) = entry.get();
        let left = STALLED_HANDSHAKE.saturating_sub(began.elapsed());
        if !left.is_zero() {
            return Stalled::In(left);
        }
        stop.cancel();
        entry.remove();
        Stalled::Closed
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, (Instant, CancellationToken)>> {
        // Each change is one insert or remove: a poisoned lock still guards a whole map.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for InHandshake {
    fn drop(&mut self) {
        self.handshakes.lock().remove(&self.id);
    }
}

/// `::ffff:10.0.0.0/104` is written by some operators for an IPv4 range; it means
/// `10.0.0.0/8`, and only that form can match a canonical address.
fn canonical_net(n: IpNet) -> IpNet {
    match n {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.addr().to_ipv4_mapped() {
            Some(v4) => ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96)
                .map(IpNet::V4)
                .unwrap_or(n),
            None => n,
        },
        _ => n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn each_address_holds_at_most_its_share() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let per_ip = PerIp::new(2);
        let first = per_ip.acquire(a, true).unwrap();
        let _second = per_ip.acquire(a, true).unwrap();
        assert!(per_ip.acquire(a, true).is_none());
        // Another address is not held back by the first one's count.
        let other = per_ip.acquire(b, true).unwrap();
        assert_eq!(per_ip.tracked(), 2);
        // A closed connection gives its place back.
        drop(first);
        let _third = per_ip.acquire(a, true).unwrap();
        assert!(per_ip.acquire(a, true).is_none());
        // An address with nothing open is forgotten.
        drop(other);
        assert_eq!(per_ip.tracked(), 1);
    }

    #[test]
    fn burst_then_refill() {
        let rl = RateLimiter::new(2.0, 3);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(rl.check("a", t0), Ok(()));
        }
        let wait = rl.check("a", t0).unwrap_err();
        assert_eq!(wait, ms(500));
        // Half a token after 250 ms: still refused, with the rest of the wait.
        assert_eq!(rl.check("a", t0 + ms(250)).unwrap_err(), ms(250));
        assert_eq!(rl.check("a", t0 + ms(500)), Ok(()));
        assert!(rl.check("a", t0 + ms(500)).is_err());
        // Refill never exceeds the burst.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(rl.check("a", later), Ok(()));
        }
        assert!(rl.check("a", later).is_err());
    }

    #[test]
    fn identities_do_not_share_a_bucket() {
        let rl = RateLimiter::new(1.0, 1);
        let t0 = Instant::now();
        assert!(rl.check("a", t0).is_ok());
        assert!(rl.check("a", t0).is_err());
        assert!(rl.check("b", t0).is_ok());
    }

    #[test]
    fn time_going_backwards_grants_nothing() {
        let rl = RateLimiter::new(1.0, 1);
        let t0 = Instant::now() + Duration::from_secs(10);
        assert!(rl.check("a", t0).is_ok());
        assert!(rl.check("a", t0 - Duration::from_secs(5)).is_err());
        assert!(rl.check("a", t0).is_err());
        assert!(rl.check("a", t0 + Duration::from_secs(1)).is_ok());
    }

    #[test]
    fn memory_is_bounded_and_idle_buckets_are_evicted() {
        let rl = RateLimiter::with_capacity(1.0, 2, 3);
        let t0 = Instant::now();
        for id in ["a", "b", "c"] {
            assert!(rl.check(id, t0).is_ok());
        }
        // Full of active buckets: a newcomer is refused, not let through.
        assert!(rl.check("d", t0).is_err());
        assert_eq!(rl.tracked(), 3);
        // An identity already tracked still spends its own quota: a full map refuses only
        // newcomers.
        assert!(rl.check("a", t0).is_ok());
        assert!(rl.check("a", t0).is_err());
        // Once refilled, old buckets are forgotten to make room.
        let later = t0 + Duration::from_secs(5);
        assert!(rl.check("d", later).is_ok());
        assert_eq!(rl.tracked(), 1);
        // Forgetting a refilled bucket lost nothing: it starts full again.
        assert!(rl.check("a", later).is_ok());
        assert!(rl.check("a", later).is_ok());
        assert!(rl.check("a", later).is_err());
    }

    #[test]
    fn a_bad_rate_is_never_unlimited() {
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let rl = RateLimiter::new(rate, 1);
            let t0 = Instant::now();
            assert!(rl.check("a", t0).is_ok());
            let wait = rl.check("a", t0 + Duration::from_secs(3600)).unwrap_err();
            assert_eq!(wait, MAX_RETRY_AFTER, "{rate}");
        }
    }

    fn list(v: &[&str]) -> Allowlist {
        Allowlist::parse(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn empty_allows_all() {
        let a = list(&[]);

        assert!(a.allows(ip("203.0.113.9")));
        assert!(a.allows(ip("::1")));
    }

    #[test]
    fn cidrs_and_single_addresses() {
        let a = list(&["10.0.0.0/8", " 192.168.1.7 ", "fd00::/8", "2001:db8::1"]);
        assert!(a.allows(ip("10.255.0.1")));
        assert!(!a.allows(ip("11.0.0.1")));
        assert!(a.allows(ip("192.168.1.7")));
        assert!(!a.allows(ip("192.168.1.8")));
        assert!(a.allows(ip("fd12::5")));
        assert!(a.allows(ip("2001:db8::1")));
        assert!(!a.allows(ip("2001:db8::2")));
        // Bits past the prefix: the one host, or the whole network? Refused, not guessed
        // (taken as the network, `127.0.0.5/8` let in the whole /8 without a word).
        for (bad, net, one) in [
            ("10.1.2.3/8", "10.0.0.0/8", "10.1.2.3"),
            ("fd00::1/64", "fd00::/64", "fd00::1"),
        ] {
            let e = Allowlist::parse(&[bad.to_string()]).unwrap_err();
            assert!(
                e.contains(&format!(
                    "write {net} for the network, or {one} for the one"
                )),
                "{e}"
            );
        }
        // An IPv6 range holds no IPv4 client, not even `::/0`: a dual-stack listener's
        // IPv4 peers are matched by their IPv4 address.
        assert!(!list(&["::/0"]).allows(ip("::ffff:10.1.2.3")));
        assert!(list(&["::/0"]).allows(ip("fd00::5")));
    }

    #[test]
    fn ipv4_mapped_ipv6_is_ipv4() {
        let a = list(&["10.0.0.0/8"]);
        assert!(a.allows(ip("::ffff:10.1.2.3")));
        assert!(!a.allows(ip("::ffff:11.1.2.3")));
        let m = list(&["::ffff:10.0.0.0/104"]);
        assert!(m.allows(ip("10.1.2.3")));
        assert!(m.allows(ip("::ffff:10.1.2.3")));
        assert!(!m.allows(ip("11.1.2.3")));
    }

    /// The error names the entry, in a list of good ones too.
    #[test]
    fn garbage_is_an_error() {
        for bad in ["10.0.0.0/33", "nope", "", "10.0.0", "fd00::/129"] {
            let entries = ["10.0.0.0/8".to_string(), bad.to_string()];
            let e = Allowlist::parse(&entries).unwrap_err();
            assert!(e.starts_with(&format!("{bad:?}: ")), "{e}");
        }
    }

    proptest::proptest! {
        /// Over any schedule, no identity gets more than its burst plus what the rate
        /// refilled in the time elapsed.
        #[test]
        fn never_more_than_burst_plus_refill(
            rate in 0.1f64..50.0,
            burst in 1u32..20,
            steps in proptest::collection::vec(0u64..500, 1..200),
        ) {
            let rl = RateLimiter::new(rate, burst);
            let t0 = Instant::now();
            let mut t = t0;
            let mut granted = 0u64;
            for step in steps {
                t += Duration::from_millis(step);
                if rl.check("a", t).is_ok() {
                    granted += 1;
                }
                let bound = f64::from(burst) + rate * (t - t0).as_secs_f64();
                proptest::prop_assert!(granted as f64 <= bound + 1e-9);
            }
        }
    }
}
